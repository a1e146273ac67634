//! Typed enumerations and constants of the C API.

use mla_sys as sys;

/// Width of a q row and of a KV row, in elements: `kv_lora_rank +
/// qk_rope_head_dim` = 512 + 64. The only supported value.
pub const HEAD_DIM_QK: usize = sys::MLA_HEAD_DIM_QK as usize;
/// Width of an output row: the first 512 elements of each KV row are V.
pub const HEAD_DIM_V: usize = sys::MLA_HEAD_DIM_V as usize;
/// Largest number of query heads per plan.
pub const MAX_HEADS: usize = sys::MLA_MAX_HEADS as usize;
/// Largest number of query tokens per sequence (q_len).
pub const MAX_Q_LEN: usize = sys::MLA_MAX_Q_LEN as usize;
/// Largest page size (page sizes are powers of two from 1 to this).
pub const MAX_PAGE_SIZE: usize = sys::MLA_MAX_PAGE_SIZE as usize;
/// Largest split count that [`PlanBuilder::num_splits`](crate::PlanBuilder::num_splits) may force.
pub const MAX_SPLITS: usize = sys::MLA_MAX_SPLITS as usize;
/// MXFP4: elements per E8M0 scale.
pub const MXFP4_BLOCK: usize = sys::MLA_MXFP4_BLOCK as usize;
/// MXFP4: E8M0 scale bytes per KV row (576 / 32), the smallest scale stride.
pub const MXFP4_SCALES_PER_ROW: usize = sys::MLA_MXFP4_SCALES_PER_ROW as usize;

/// Element format of Q.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum QDtype {
    /// bfloat16, passed as [`QData::Bf16`](crate::QData::Bf16).
    #[default]
    Bf16,
    /// OCP FP8 E4M3 (bias 7, NaN = S.1111.111) with one `q_scale`, passed as
    /// [`QData::Fp8`](crate::QData::Fp8).
    Fp8E4m3,
    /// FP8 E4M3 FNUZ (AMD gfx942: bias 8, 0x80 = NaN) with one `q_scale`,
    /// passed as [`QData::Fp8`](crate::QData::Fp8). Must match an FP8 KV flavour.
    Fp8E4m3Fnuz,
}

impl QDtype {
    /// The C `mla_dtype`.
    pub fn to_raw(self) -> sys::mla_dtype {
        match self {
            QDtype::Bf16 => sys::mla_dtype::MLA_DTYPE_BF16,
            QDtype::Fp8E4m3 => sys::mla_dtype::MLA_DTYPE_FP8_E4M3,
            QDtype::Fp8E4m3Fnuz => sys::mla_dtype::MLA_DTYPE_FP8_E4M3_FNUZ,
        }
    }

    /// Bytes of one q row of [`HEAD_DIM_QK`] elements.
    pub fn row_bytes(self) -> usize {
        match self {
            QDtype::Bf16 => 2 * HEAD_DIM_QK,
            QDtype::Fp8E4m3 | QDtype::Fp8E4m3Fnuz => HEAD_DIM_QK,
        }
    }
}

/// Element format of the paged KV cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvDtype {
    /// bfloat16 rows of 1152 bytes, passed as [`KvData::Bf16`](crate::KvData::Bf16).
    #[default]
    Bf16,
    /// OCP FP8 E4M3 rows of 576 bytes with one `kv_scale`, passed as
    /// [`KvData::Fp8`](crate::KvData::Fp8).
    Fp8E4m3,
    /// FP8 E4M3 FNUZ rows of 576 bytes with one `kv_scale`, passed as
    /// [`KvData::Fp8`](crate::KvData::Fp8).
    Fp8E4m3Fnuz,
    /// OCP MXFP4: rows of 288 bytes (two E2M1 values per byte, low nibble =
    /// even element) plus one E8M0 scale per 32 elements in a separate array,
    /// passed as [`KvData::Mxfp4`](crate::KvData::Mxfp4).
    Mxfp4,
}

impl KvDtype {
    /// The C `mla_dtype`.
    pub fn to_raw(self) -> sys::mla_dtype {
        match self {
            KvDtype::Bf16 => sys::mla_dtype::MLA_DTYPE_BF16,
            KvDtype::Fp8E4m3 => sys::mla_dtype::MLA_DTYPE_FP8_E4M3,
            KvDtype::Fp8E4m3Fnuz => sys::mla_dtype::MLA_DTYPE_FP8_E4M3_FNUZ,
            KvDtype::Mxfp4 => sys::mla_dtype::MLA_DTYPE_MXFP4,
        }
    }

    /// Bytes of one stored KV row (MXFP4's separate scales not counted).
    pub fn row_bytes(self) -> usize {
        match self {
            KvDtype::Bf16 => 2 * HEAD_DIM_QK,
            KvDtype::Fp8E4m3 | KvDtype::Fp8E4m3Fnuz => HEAD_DIM_QK,
            KvDtype::Mxfp4 => HEAD_DIM_QK / 2,
        }
    }
}

/// Where a plan runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Backend {
    /// The GPU backend when it is built in and a device is present, else the CPU.
    #[default]
    Auto,
    /// The multi-threaded CPU backend (always built; the reference).
    Cpu,
    /// HIP kernels (AMD via ROCm, NVIDIA via the CUDA toolchain).
    Gpu,
}

impl Backend {
    /// The C `mla_backend`.
    pub fn to_raw(self) -> sys::mla_backend {
        match self {
            Backend::Auto => sys::mla_backend::MLA_BACKEND_AUTO,
            Backend::Cpu => sys::mla_backend::MLA_BACKEND_CPU,
            Backend::Gpu => sys::mla_backend::MLA_BACKEND_GPU,
        }
    }

    /// The backend for a C `mla_backend`, `None` for unknown values.
    pub fn from_raw(raw: sys::mla_backend) -> Option<Backend> {
        match raw {
            sys::mla_backend::MLA_BACKEND_AUTO => Some(Backend::Auto),
            sys::mla_backend::MLA_BACKEND_CPU => Some(Backend::Cpu),
            sys::mla_backend::MLA_BACKEND_GPU => Some(Backend::Gpu),
            _ => None,
        }
    }
}

/// A library version, decoded from `major * 10000 + minor * 100 + patch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Incompatible API changes.
    pub major: u32,
    /// Compatible additions.
    pub minor: u32,
    /// Fixes.
    pub patch: u32,
}

impl Version {
    /// Decodes the `MLA_VERSION` encoding.
    pub const fn from_encoded(v: u32) -> Version {
        Version {
            major: v / 10000,
            minor: (v / 100) % 100,
            patch: v % 100,
        }
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The version of the header these bindings were generated from.
pub const HEADER_VERSION: Version = Version {
    major: sys::MLA_VERSION_MAJOR,
    minor: sys::MLA_VERSION_MINOR,
    patch: sys::MLA_VERSION_PATCH,
};

/// The version of the loaded libmla (`mla_version()`).
pub fn version() -> Version {
    // SAFETY: no arguments, no state.
    Version::from_encoded(unsafe { sys::mla_version() } as u32)
}

/// Number of GPUs usable by [`Backend::Gpu`] (0 when none, or when libmla
/// was built without a GPU backend).
pub fn gpu_device_count() -> usize {
    // SAFETY: no arguments.
    let n = unsafe { sys::mla_gpu_device_count() };
    if n > 0 {
        n as usize
    } else {
        0
    }
}
