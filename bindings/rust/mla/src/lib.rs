//! Safe Rust API for **libmla**: MLA (Multi-head Latent Attention) decode
//! attention, the absorbed DeepSeek-V2/V3/R1 form with one latent KV head of
//! 576 dims (the first 512 are V) shared by all query heads.
//!
//! The shape is FFTW's: a [`Plan`] is made once for a static shape
//! ([`PlanBuilder`]), [`Plan::build_metadata`] is called once per decode step
//! with the sequence lengths ([`Batch`]), and [`Plan::execute`] once per layer
//! with the data ([`Tensors`]).
//!
//! For CPU plans everything is host slices, and every slice length is checked
//! against the shapes before any pointer reaches C: a slice that is too short
//! is an [`Error`], never undefined behaviour. The number of KV pages is taken
//! from the KV slice, so the library range-checks every page index. GPU plans
//! take caller-owned device memory through the `unsafe`
//! [`Plan::execute_raw`] and [`Plan::build_metadata_device`].
//!
//! Every failure is an [`Error`] carrying a [`Status`] (mirroring the C
//! `mla_status`) and the library's sentence naming the refused argument.
//!
//! # Example
//!
//! One decode step of 2 sequences (kv lengths 20 and 5 with page size 16),
//! 16 heads, bf16 Q and KV, on the CPU:
//!
//! ```
//! use mla::{f32_to_bf16, Backend, Batch, KvData, PlanBuilder, QData, Tensors, HEAD_DIM_QK, HEAD_DIM_V};
//!
//! let heads = 16;
//! let mut plan = PlanBuilder::new(heads as i32)
//!     .page_size(16)
//!     .max_batch_size(8)
//!     .backend(Backend::Cpu)
//!     .build()?;
//!
//! // Sequence 0 owns pages 0 and 1 (16 + 4 tokens), sequence 1 page 2 (5 tokens).
//! let qo_indptr = [0, 1, 2];
//! let kv_indptr = [0, 2, 3];
//! let last_page_len = [4, 5];
//! plan.build_metadata(&Batch {
//!     qo_indptr: &qo_indptr,
//!     kv_indptr: &kv_indptr,
//!     kv_last_page_len: Some(&last_page_len),
//! })?;
//!
//! let total_q = 2;
//! let q = vec![f32_to_bf16(0.1); total_q * heads * HEAD_DIM_QK];
//! let kv = vec![f32_to_bf16(0.5); 3 * 16 * HEAD_DIM_QK];
//! let mut out = vec![0u16; total_q * heads * HEAD_DIM_V];
//! let mut lse = vec![0f32; total_q * heads];
//! plan.execute(&mut Tensors {
//!     q: QData::Bf16(&q),
//!     kv: KvData::Bf16(&kv),
//!     kv_indices: None,
//!     q_scale: 1.0,
//!     kv_scale: 1.0,
//!     out: &mut out,
//!     lse: Some(&mut lse),
//! })?;
//! // Every key row equals 0.5, so every output element is 0.5.
//! assert!(out.iter().all(|&o| mla::bf16_to_f32(o) == 0.5));
//! # Ok::<(), mla::Error>(())
//! ```
//!
//! # Linking
//!
//! `mla-sys` finds libmla with `pkg-config` (or `MLA_LIB_DIR`); from a meson
//! build tree use `PKG_CONFIG_PATH=<builddir>/meson-uninstalled`. Test and
//! example binaries of these crates get an rpath to the library directory. A
//! binary crate of your own can do the same in its build script from the
//! `DEP_MLA_LIB_DIR` variable (only visible to direct dependents of
//! `mla-sys`), or rely on an installed libmla / `LD_LIBRARY_PATH`.
//!
//! # Threads
//!
//! A [`Plan`] is `Send` but not `Sync`: one thread at a time, which `&mut
//! self` on every call enforces. Different plans run concurrently.
#![warn(missing_docs)]

mod bf16;
mod error;
mod plan;
mod types;

pub use mla_sys as sys;

pub use crate::bf16::{bf16_slice_to_f32, bf16_to_f32, f32_slice_to_bf16, f32_to_bf16};
pub use crate::error::{last_error_message, Error, Origin, Result, Status};
pub use crate::plan::{Batch, KvData, Plan, PlanBuilder, QData, RawBatch, RawTensors, ScheduleInfo, Tensors};
pub use crate::types::{
    gpu_device_count, version, Backend, KvDtype, QDtype, Version, HEADER_VERSION, HEAD_DIM_QK, HEAD_DIM_V, MAX_HEADS,
    MAX_PAGE_SIZE, MAX_Q_LEN, MAX_SPLITS, MXFP4_BLOCK, MXFP4_SCALES_PER_ROW,
};
