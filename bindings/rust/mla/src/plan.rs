//! Plans, their builder, and the per-step / per-layer inputs.

use std::ffi::c_void;
use std::fmt;
use std::ptr::{self, NonNull};

use mla_sys as sys;

use crate::error::{check, Error, Result, Status};
use crate::types::{Backend, KvDtype, QDtype, HEAD_DIM_QK, HEAD_DIM_V, MXFP4_SCALES_PER_ROW};

/// Builder of a plan's static shape (the C `mla_plan_desc`).
///
/// Every setter mirrors one descriptor field; a field left alone keeps the
/// library's default (given per setter). Values are passed to the library
/// unchanged, which validates them in [`build`](PlanBuilder::build).
///
/// ```no_run
/// use mla::{Backend, KvDtype, PlanBuilder};
/// let plan = PlanBuilder::new(16)
///     .kv_dtype(KvDtype::Fp8E4m3)
///     .page_size(64)
///     .max_batch_size(64)
///     .max_q_len(2)
///     .backend(Backend::Cpu)
///     .deterministic(true)
///     .build()?;
/// # Ok::<(), mla::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct PlanBuilder {
    num_heads: i32,
    q_dtype: QDtype,
    kv_dtype: KvDtype,
    page_size: i32,
    max_batch_size: i32,
    max_q_len: i32,
    sm_scale: f32,
    logit_cap: f32,
    num_splits: i32,
    flags: u32,
    backend: Backend,
    device: i32,
    num_threads: i32,
}

impl PlanBuilder {
    /// A builder for `num_heads` query heads (1..=128) with all other fields
    /// at their defaults: bf16 Q and KV, page size 1, max batch 256,
    /// max q_len 1, `sm_scale` 1/sqrt(576), no logit cap, automatic splits,
    /// automatic backend, device 0, all hardware threads.
    pub fn new(num_heads: i32) -> PlanBuilder {
        PlanBuilder {
            num_heads,
            q_dtype: QDtype::Bf16,
            kv_dtype: KvDtype::Bf16,
            page_size: 0,
            max_batch_size: 0,
            max_q_len: 0,
            sm_scale: 0.0,
            logit_cap: 0.0,
            num_splits: 0,
            flags: 0,
            backend: Backend::Auto,
            device: 0,
            num_threads: 0,
        }
    }

    /// Query heads, 1..=128.
    pub fn num_heads(mut self, n: i32) -> Self {
        self.num_heads = n;
        self
    }

    /// Q element format (default bf16). FP8 Q needs the same FP8 flavour in KV
    /// when KV is FP8.
    pub fn q_dtype(mut self, d: QDtype) -> Self {
        self.q_dtype = d;
        self
    }

    /// KV cache element format (default bf16).
    pub fn kv_dtype(mut self, d: KvDtype) -> Self {
        self.kv_dtype = d;
        self
    }

    /// Tokens per KV page: a power of two 1..=256 (0 = default 1).
    pub fn page_size(mut self, p: i32) -> Self {
        self.page_size = p;
        self
    }

    /// Largest batch of any step (0 = default 256).
    pub fn max_batch_size(mut self, n: i32) -> Self {
        self.max_batch_size = n;
        self
    }

    /// Largest q_len of any sequence, 1..=8 (0 = default 1).
    pub fn max_q_len(mut self, n: i32) -> Self {
        self.max_q_len = n;
        self
    }

    /// Softmax scale, finite and positive (0 = default 1/sqrt(576)).
    pub fn sm_scale(mut self, s: f32) -> Self {
        self.sm_scale = s;
        self
    }

    /// Logit soft cap: `s = cap * tanh(s / cap)` when `cap > 0` (0 = off).
    pub fn logit_cap(mut self, cap: f32) -> Self {
        self.logit_cap = cap;
        self
    }

    /// Force this many KV splits per sequence, 1..=64 (0 = automatic).
    pub fn num_splits(mut self, n: i32) -> Self {
        self.num_splits = n;
        self
    }

    fn flag(mut self, bit: sys::mla_flags, on: bool) -> Self {
        if on {
            self.flags |= bit.0;
        } else {
            self.flags &= !bit.0;
        }
        self
    }

    /// `MLA_FLAG_DETERMINISTIC`: split boundaries depend only on each
    /// sequence's own length, so its output is bitwise identical whatever else
    /// is in the batch (batch-invariant decode).
    pub fn deterministic(self, on: bool) -> Self {
        self.flag(sys::mla_flags::MLA_FLAG_DETERMINISTIC, on)
    }

    /// `MLA_FLAG_VALIDATE_DEVICE_INPUTS` (GPU, for debugging): check
    /// device-resident indptr / last_page_len / kv_indices on the device,
    /// synchronising the stream.
    pub fn validate_device_inputs(self, on: bool) -> Self {
        self.flag(sys::mla_flags::MLA_FLAG_VALIDATE_DEVICE_INPUTS, on)
    }

    /// `MLA_FLAG_CALLER_WORKSPACE`: the plan allocates no workspace; every
    /// execute must pass one ([`Plan::execute_with_workspace`]).
    pub fn caller_workspace(self, on: bool) -> Self {
        self.flag(sys::mla_flags::MLA_FLAG_CALLER_WORKSPACE, on)
    }

    /// Raw `mla_flags` bits (replaces all flags set so far).
    pub fn flags(mut self, bits: u32) -> Self {
        self.flags = bits;
        self
    }

    /// Backend (default [`Backend::Auto`]).
    pub fn backend(mut self, b: Backend) -> Self {
        self.backend = b;
        self
    }

    /// GPU ordinal for GPU plans (default 0).
    pub fn device(mut self, d: i32) -> Self {
        self.device = d;
        self
    }

    /// CPU backend threads (0 = all hardware threads).
    pub fn num_threads(mut self, n: i32) -> Self {
        self.num_threads = n;
        self
    }

    /// The C descriptor these settings describe (`mla_plan_desc_init`, then
    /// the fields).
    pub fn to_desc(&self) -> sys::mla_plan_desc {
        // SAFETY: plain-old-data struct; _init fills every byte.
        let mut d: sys::mla_plan_desc = unsafe { std::mem::zeroed() };
        unsafe { sys::mla_plan_desc_init(&mut d) };
        d.num_heads = self.num_heads;
        d.q_dtype = self.q_dtype.to_raw();
        d.kv_dtype = self.kv_dtype.to_raw();
        d.page_size = self.page_size;
        d.max_batch_size = self.max_batch_size;
        d.max_q_len = self.max_q_len;
        d.sm_scale = self.sm_scale;
        d.logit_cap = self.logit_cap;
        d.num_splits = self.num_splits;
        d.flags = self.flags;
        d.backend = self.backend.to_raw();
        d.device = self.device;
        d.num_threads = self.num_threads;
        d
    }

    /// Creates the plan (`mla_plan_create`). GPU plans allocate their device
    /// buffers here. Fails with the library's status and message for any
    /// refused value, e.g. [`Status::BackendUnavailable`] for
    /// [`Backend::Gpu`] on a machine without a GPU.
    pub fn build(&self) -> Result<Plan> {
        let desc = self.to_desc();
        let mut raw: *mut sys::mla_plan = ptr::null_mut();
        // SAFETY: desc is initialised, raw is a valid out pointer.
        check(unsafe { sys::mla_plan_create(&desc, &mut raw) })?;
        let raw = NonNull::new(raw)
            .ok_or_else(|| Error::binding(Status::Internal, "mla_plan_create succeeded but returned NULL"))?;
        let mut be = sys::mla_backend::MLA_BACKEND_CPU;
        // SAFETY: raw is a live plan.
        let st = unsafe { sys::mla_plan_backend(raw.as_ptr(), &mut be) };
        if st != sys::mla_status::MLA_SUCCESS {
            let e = Error::from_library(st);
            unsafe { sys::mla_plan_destroy(raw.as_ptr()) };
            return Err(e);
        }
        let pos = |v: i32, default: i32| if v == 0 { default as usize } else { v as usize };
        Ok(Plan {
            raw,
            num_heads: self.num_heads as usize,
            q_dtype: self.q_dtype,
            kv_dtype: self.kv_dtype,
            page_size: pos(self.page_size, 1),
            max_batch_size: pos(self.max_batch_size, 256),
            max_q_len: pos(self.max_q_len, 1),
            backend: Backend::from_raw(be).unwrap_or(self.backend),
            meta: Meta::None,
        })
    }
}

/// Sequence lengths of one decode step, in host memory (the C `mla_batch`).
///
/// For sequence `b` (batch size = `qo_indptr.len() - 1`):
/// q tokens = `qo_indptr[b+1] - qo_indptr[b]`, pages = `kv_indptr[b+1] -
/// kv_indptr[b]`, kv_len = `(pages - 1) * page_size + kv_last_page_len[b]`
/// (0 without pages). Both indptr arrays start at 0 and never decrease.
#[derive(Clone, Copy, Debug)]
pub struct Batch<'a> {
    /// `[batch_size + 1]` query token offsets.
    pub qo_indptr: &'a [i32],
    /// `[batch_size + 1]` page offsets into `kv_indices`.
    pub kv_indptr: &'a [i32],
    /// `[batch_size]` fill of each last page, `1..=page_size`; `None` = full pages.
    pub kv_last_page_len: Option<&'a [i32]>,
}

/// Device-resident sequence lengths (the C `mla_batch` with
/// `MLA_MEMORY_DEVICE`), for [`Plan::build_metadata_device`].
#[derive(Clone, Copy, Debug)]
pub struct RawBatch {
    /// Number of sequences.
    pub batch_size: i32,
    /// Device pointer to `[batch_size + 1]` query token offsets.
    pub qo_indptr: *const i32,
    /// Device pointer to `[batch_size + 1]` page offsets.
    pub kv_indptr: *const i32,
    /// Device pointer to `[batch_size]` last-page fills, or null for full pages.
    pub kv_last_page_len: *const i32,
}

/// Q of one layer, `[total_q, num_heads, 576]` row-major, host memory.
/// The variant must match the plan's [`QDtype`].
#[derive(Clone, Copy, Debug)]
pub enum QData<'a> {
    /// bf16 bit patterns ([`QDtype::Bf16`]).
    Bf16(&'a [u16]),
    /// FP8 bytes ([`QDtype::Fp8E4m3`] or [`QDtype::Fp8E4m3Fnuz`]), dequantised
    /// with [`Tensors::q_scale`].
    Fp8(&'a [u8]),
}

/// The paged KV cache of one layer, `[num_pages, page_size, row]`, host
/// memory. The variant must match the plan's [`KvDtype`]; the number of pages
/// is the slice length divided by `page_size * row`, which must divide it.
#[derive(Clone, Copy, Debug)]
pub enum KvData<'a> {
    /// bf16 rows of 576 elements ([`KvDtype::Bf16`]).
    Bf16(&'a [u16]),
    /// FP8 rows of 576 bytes ([`KvDtype::Fp8E4m3`] / [`KvDtype::Fp8E4m3Fnuz`]),
    /// dequantised with [`Tensors::kv_scale`].
    Fp8(&'a [u8]),
    /// MXFP4 ([`KvDtype::Mxfp4`]).
    Mxfp4 {
        /// Rows of 288 bytes: two E2M1 values per byte, low nibble = even element.
        data: &'a [u8],
        /// E8M0 scales `[num_pages, page_size, scale_stride]`, 18 used per row
        /// (one per 32 elements).
        scales: &'a [u8],
        /// Scale bytes per token, 18..=4096 (0 = 18).
        scale_stride: usize,
    },
}

/// Inputs and outputs of one layer for [`Plan::execute`] (CPU plans).
///
/// Lengths are checked against the shapes of the last
/// [`Plan::build_metadata`] before anything reaches C; `q`, `kv` and `out`
/// must also be 16-byte aligned (the library checks and returns
/// [`Status::Misaligned`]; `Vec` buffers from the system allocator are).
#[derive(Debug)]
pub struct Tensors<'a> {
    /// Q, `[total_q, num_heads, 576]`.
    pub q: QData<'a>,
    /// The KV cache.
    pub kv: KvData<'a>,
    /// Page table, CSR over `kv_indptr` (at least `kv_indptr[batch_size]`
    /// entries); `None` = identity (sequence b's pages are `kv_indptr[b]..`).
    pub kv_indices: Option<&'a [i32]>,
    /// FP8 Q dequant scale (0 = 1).
    pub q_scale: f32,
    /// FP8 KV dequant scale (0 = 1).
    pub kv_scale: f32,
    /// Output, `[total_q, num_heads, 512]` bf16, written.
    pub out: &'a mut [u16],
    /// Natural-log LSE `[total_q, num_heads]`, written when given.
    pub lse: Option<&'a mut [f32]>,
}

impl<'a> Tensors<'a> {
    /// Tensors with the identity page table, unit scales and no LSE.
    pub fn new(q: QData<'a>, kv: KvData<'a>, out: &'a mut [u16]) -> Tensors<'a> {
        Tensors {
            q,
            kv,
            kv_indices: None,
            q_scale: 1.0,
            kv_scale: 1.0,
            out,
            lse: None,
        }
    }
}

/// Raw pointers for [`Plan::execute_raw`]: the C `mla_tensors` without its
/// `struct_size`. Device memory for GPU plans, host memory for CPU plans.
/// `Default` gives null pointers, zero sizes and default scales.
#[derive(Clone, Copy, Debug)]
pub struct RawTensors {
    /// `[total_q, num_heads, 576]` of the plan's Q dtype, 16-byte aligned.
    pub q: *const c_void,
    /// `[num_pages, page_size, row]`, 16-byte aligned.
    pub kv: *const c_void,
    /// MXFP4 only: E8M0 scales `[num_pages, page_size, kv_scale_stride]`.
    pub kv_block_scales: *const u8,
    /// Page table, or null for the identity.
    pub kv_indices: *const i32,
    /// `[total_q, num_heads, 512]` bf16, written; 16-byte aligned.
    pub out: *mut c_void,
    /// `[total_q, num_heads]` f32, or null.
    pub lse: *mut f32,
    /// Caller workspace, or null for the plan's own.
    pub workspace: *mut c_void,
    /// Bytes at `workspace`.
    pub workspace_size: usize,
    /// FP8 Q scale (0 = 1).
    pub q_scale: f32,
    /// FP8 KV scale (0 = 1).
    pub kv_scale: f32,
    /// MXFP4 scale bytes per token (0 = 18).
    pub kv_scale_stride: i32,
    /// Pages at `kv` for host-side range checks (0 = unchecked).
    pub num_pages: i64,
}

impl Default for RawTensors {
    fn default() -> Self {
        RawTensors {
            q: ptr::null(),
            kv: ptr::null(),
            kv_block_scales: ptr::null(),
            kv_indices: ptr::null(),
            out: ptr::null_mut(),
            lse: ptr::null_mut(),
            workspace: ptr::null_mut(),
            workspace_size: 0,
            q_scale: 0.0,
            kv_scale: 0.0,
            kv_scale_stride: 0,
            num_pages: 0,
        }
    }
}

impl RawTensors {
    fn to_c(self) -> sys::mla_tensors {
        // SAFETY: plain-old-data; _init fills struct_size and zeros the rest.
        let mut t: sys::mla_tensors = unsafe { std::mem::zeroed() };
        unsafe { sys::mla_tensors_init(&mut t) };
        t.q = self.q;
        t.kv = self.kv;
        t.kv_block_scales = self.kv_block_scales;
        t.kv_indices = self.kv_indices;
        t.out = self.out;
        t.lse = self.lse;
        t.workspace = self.workspace;
        t.workspace_size = self.workspace_size;
        t.q_scale = self.q_scale;
        t.kv_scale = self.kv_scale;
        t.kv_scale_stride = self.kv_scale_stride;
        t.num_pages = self.num_pages;
        t
    }
}

/// What the scheduler chose for the last host-built metadata
/// (`mla_schedule_info`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScheduleInfo {
    /// (sequence, head block, KV range) work items.
    pub num_work_items: i32,
    /// Items that write partials to be combined.
    pub num_split_rows: i32,
    /// Largest split count of any sequence.
    pub max_splits: i32,
    /// Query rows (tokens x heads) per item.
    pub rows_per_item: i32,
    /// Head blocks per sequence.
    pub head_blocks: i32,
    /// Balanced target KV blocks per item (0 = n/a).
    pub target_blocks: i32,
    /// KV tokens per scheduling block.
    pub block_tokens: i32,
    /// Parallel workers the scheduler balanced for.
    pub workers: i32,
}

/// Shapes of the last successful metadata, used to check execute's slices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Meta {
    None,
    Host {
        batch_size: usize,
        total_q: usize,
        total_pages: usize,
    },
    Device,
}

/// A 16-byte aligned, never written, never read stand-in for empty slices
/// (an empty slice's dangling pointer is not 16-byte aligned).
#[repr(C, align(16))]
struct Aligned([u8; 16]);
static EMPTY: Aligned = Aligned([0; 16]);

/// An MLA decode plan: the static shape, owning the C `mla_plan` (destroyed on
/// drop).
///
/// A plan is used by one thread at a time: it is `Send` (it may move to
/// another thread) but not `Sync`, and every call takes `&mut self`.
/// Different plans run concurrently on different threads.
pub struct Plan {
    raw: NonNull<sys::mla_plan>,
    num_heads: usize,
    q_dtype: QDtype,
    kv_dtype: KvDtype,
    page_size: usize,
    max_batch_size: usize,
    max_q_len: usize,
    backend: Backend,
    meta: Meta,
}

// SAFETY: libmla allows a plan to be used from any thread as long as calls on
// one plan do not overlap; `&mut self` on every call guarantees that, and the
// plan is not Sync.
unsafe impl Send for Plan {}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: raw came from mla_plan_create and is destroyed once. A GPU
        // plan's caller must have synchronised its streams (see the C docs).
        unsafe { sys::mla_plan_destroy(self.raw.as_ptr()) }
    }
}

impl fmt::Debug for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plan")
            .field("num_heads", &self.num_heads)
            .field("q_dtype", &self.q_dtype)
            .field("kv_dtype", &self.kv_dtype)
            .field("page_size", &self.page_size)
            .field("max_batch_size", &self.max_batch_size)
            .field("max_q_len", &self.max_q_len)
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

fn invalid(msg: String) -> Error {
    Error::binding(Status::InvalidValue, msg)
}

fn mul(a: usize, b: usize, what: &str) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| invalid(format!("{} overflows usize", what)))
}

impl Plan {
    /// A builder; same as [`PlanBuilder::new`].
    pub fn builder(num_heads: i32) -> PlanBuilder {
        PlanBuilder::new(num_heads)
    }

    /// The C plan handle, for calling `mla_sys` directly. It stays owned by
    /// this `Plan`: do not destroy it. Building metadata through it bypasses
    /// the shapes this `Plan` records for checking [`execute`](Plan::execute)'s
    /// slices; after doing so, use only [`execute_raw`](Plan::execute_raw)
    /// until the next [`build_metadata`](Plan::build_metadata).
    pub fn as_raw(&self) -> *mut sys::mla_plan {
        self.raw.as_ptr()
    }

    /// Query heads.
    pub fn num_heads(&self) -> usize {
        self.num_heads
    }
    /// Q element format.
    pub fn q_dtype(&self) -> QDtype {
        self.q_dtype
    }
    /// KV element format.
    pub fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype
    }
    /// Tokens per KV page (default resolved).
    pub fn page_size(&self) -> usize {
        self.page_size
    }
    /// Largest batch size (default resolved).
    pub fn max_batch_size(&self) -> usize {
        self.max_batch_size
    }
    /// Largest q_len (default resolved).
    pub fn max_q_len(&self) -> usize {
        self.max_q_len
    }
    /// The backend the plan runs on ([`Backend::Auto`] resolved).
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Total query tokens of the last metadata built from host arrays.
    pub fn total_q(&self) -> Option<usize> {
        match self.meta {
            Meta::Host { total_q, .. } => Some(total_q),
            _ => None,
        }
    }

    /// Bytes of workspace that execute needs (`mla_plan_workspace_size`).
    pub fn workspace_size(&self) -> usize {
        let mut n = 0usize;
        // SAFETY: live plan, valid out pointer; cannot fail for a live plan.
        unsafe { sys::mla_plan_workspace_size(self.raw.as_ptr(), &mut n) };
        n
    }

    /// The scheduler's choices for the last host-built metadata;
    /// [`Status::NoMetadata`] when there is none.
    pub fn schedule_info(&self) -> Result<ScheduleInfo> {
        // SAFETY: POD, filled by _init, then by the library.
        let mut i: sys::mla_schedule_info = unsafe { std::mem::zeroed() };
        unsafe { sys::mla_schedule_info_init(&mut i) };
        check(unsafe { sys::mla_plan_schedule_info(self.raw.as_ptr(), &mut i) })?;
        Ok(ScheduleInfo {
            num_work_items: i.num_work_items,
            num_split_rows: i.num_split_rows,
            max_splits: i.max_splits,
            rows_per_item: i.rows_per_item,
            head_blocks: i.head_blocks,
            target_blocks: i.target_blocks,
            block_tokens: i.block_tokens,
            workers: i.workers,
        })
    }

    fn check_batch(batch: &Batch<'_>) -> Result<i32> {
        let n = batch.qo_indptr.len();
        if n == 0 {
            return Err(invalid(
                "batch.qo_indptr is empty; it needs batch_size + 1 entries".into(),
            ));
        }
        if batch.kv_indptr.len() != n {
            return Err(invalid(format!(
                "batch.kv_indptr has {} entries but qo_indptr has {}; both need batch_size + 1",
                batch.kv_indptr.len(),
                n
            )));
        }
        let bs = n - 1;
        if let Some(l) = batch.kv_last_page_len {
            if l.len() != bs {
                return Err(invalid(format!(
                    "batch.kv_last_page_len has {} entries, expected batch_size = {}",
                    l.len(),
                    bs
                )));
            }
        }
        i32::try_from(bs).map_err(|_| invalid(format!("batch size {} does not fit in i32", bs)))
    }

    /// Builds the split-KV work list of one decode step from host arrays
    /// (`mla_plan_build_metadata`). Call once per step before the layers'
    /// [`execute`](Plan::execute) calls. On a GPU plan the arrays are uploaded
    /// on the default stream.
    ///
    /// The slices' lengths must agree (`qo_indptr` and `kv_indptr` of
    /// `batch_size + 1`, `kv_last_page_len` of `batch_size`); the library
    /// checks the values. On failure the plan has no metadata.
    pub fn build_metadata(&mut self, batch: &Batch<'_>) -> Result<()> {
        // SAFETY: null stream = default stream (ignored by CPU plans).
        unsafe { self.build_metadata_on_stream(batch, ptr::null_mut()) }
    }

    /// [`build_metadata`](Plan::build_metadata) on a given stream (GPU plans:
    /// the upload of the host arrays is enqueued there).
    ///
    /// # Safety
    /// `stream` must be null or a valid `hipStream_t` / `cudaStream_t` of the
    /// plan's device.
    pub unsafe fn build_metadata_on_stream(&mut self, batch: &Batch<'_>, stream: *mut c_void) -> Result<()> {
        self.meta = Meta::None;
        let bs = Self::check_batch(batch)?;
        let mut b: sys::mla_batch = std::mem::zeroed();
        sys::mla_batch_init(&mut b);
        b.batch_size = bs;
        b.qo_indptr = batch.qo_indptr.as_ptr();
        b.kv_indptr = batch.kv_indptr.as_ptr();
        b.kv_last_page_len = batch.kv_last_page_len.map_or(ptr::null(), |l| l.as_ptr());
        b.memory = sys::mla_memory::MLA_MEMORY_HOST;
        check(sys::mla_plan_build_metadata(self.raw.as_ptr(), &b, stream))?;
        let last = bs as usize;
        // The library accepted the arrays: both start at 0 and never decrease.
        let total_q = batch.qo_indptr[last].max(0) as usize;
        let total_pages = batch.kv_indptr[last].max(0) as usize;
        self.meta = Meta::Host {
            batch_size: last,
            total_q,
            total_pages,
        };
        Ok(())
    }

    /// Builds metadata from device-resident arrays (GPU plans): a kernel on
    /// `stream`, no host synchronisation, capturable in a CUDA/HIP graph.
    /// Afterwards only [`execute_raw`](Plan::execute_raw) can run (the host
    /// does not know the lengths).
    ///
    /// # Safety
    /// The pointers must be device memory of the plan's device holding the
    /// arrays described by [`RawBatch`], valid until the work on `stream`
    /// completes; `stream` must be null or a valid stream of that device.
    pub unsafe fn build_metadata_device(&mut self, batch: &RawBatch, stream: *mut c_void) -> Result<()> {
        self.meta = Meta::None;
        let mut b: sys::mla_batch = std::mem::zeroed();
        sys::mla_batch_init(&mut b);
        b.batch_size = batch.batch_size;
        b.qo_indptr = batch.qo_indptr;
        b.kv_indptr = batch.kv_indptr;
        b.kv_last_page_len = batch.kv_last_page_len;
        b.memory = sys::mla_memory::MLA_MEMORY_DEVICE;
        check(sys::mla_plan_build_metadata(self.raw.as_ptr(), &b, stream))?;
        self.meta = Meta::Device;
        Ok(())
    }

    /// Runs attention for one layer with the last metadata (CPU plans, host
    /// slices), using the plan's own workspace.
    ///
    /// Before calling C this checks, against the last
    /// [`build_metadata`](Plan::build_metadata): the data variants match the
    /// plan's dtypes, `q` holds `total_q * num_heads * 576` elements, `out`
    /// `total_q * num_heads * 512`, `lse` `total_q * num_heads`, `kv` a whole
    /// number of pages (and, for MXFP4, `scales` `num_pages * page_size *
    /// scale_stride` bytes), `kv_indices` at least `kv_indptr[batch_size]`
    /// entries. The number of pages is passed to the library, which
    /// range-checks every page index ([`Status::PageOutOfRange`]).
    pub fn execute(&mut self, t: &mut Tensors<'_>) -> Result<()> {
        self.execute_impl(t, None)
    }

    /// [`execute`](Plan::execute) with a caller workspace of at least
    /// [`workspace_size`](Plan::workspace_size) bytes, 16-byte aligned (needed
    /// by plans built with [`caller_workspace`](PlanBuilder::caller_workspace)).
    pub fn execute_with_workspace(&mut self, t: &mut Tensors<'_>, workspace: &mut [u8]) -> Result<()> {
        self.execute_impl(t, Some(workspace))
    }

    fn execute_impl(&mut self, t: &mut Tensors<'_>, workspace: Option<&mut [u8]>) -> Result<()> {
        if self.backend != Backend::Cpu {
            return Err(invalid(format!(
                "execute takes host slices but this plan runs on {:?}; use execute_raw with device pointers",
                self.backend
            )));
        }
        let (batch_size, total_q, total_pages) = match self.meta {
            Meta::Host {
                batch_size,
                total_q,
                total_pages,
            } => (batch_size, total_q, total_pages),
            Meta::None => {
                return Err(Error::binding(
                    Status::NoMetadata,
                    "execute called before a successful build_metadata",
                ))
            }
            Meta::Device => {
                return Err(Error::binding(
                    Status::NoMetadata,
                    "the metadata was built from device arrays; use execute_raw",
                ))
            }
        };
        let rows = mul(total_q, self.num_heads, "total_q * num_heads")?;
        let ps = self.page_size;

        // Q.
        let q_need = mul(rows, HEAD_DIM_QK, "q elements")?;
        let (q_ptr, q_len) = match (t.q, self.q_dtype) {
            (QData::Bf16(s), QDtype::Bf16) => (s.as_ptr() as *const c_void, s.len()),
            (QData::Fp8(s), QDtype::Fp8E4m3 | QDtype::Fp8E4m3Fnuz) => (s.as_ptr() as *const c_void, s.len()),
            (q, d) => {
                return Err(Error::binding(
                    Status::UnsupportedDtype,
                    format!(
                        "tensors.q is QData::{} but the plan's q_dtype is {:?}",
                        if matches!(q, QData::Bf16(_)) { "Bf16" } else { "Fp8" },
                        d
                    ),
                ))
            }
        };
        if q_len < q_need {
            return Err(invalid(format!(
                "tensors.q has {} elements, the batch needs total_q ({}) * num_heads ({}) * {} = {}",
                q_len, total_q, self.num_heads, HEAD_DIM_QK, q_need
            )));
        }

        // KV.
        let row_elems = match self.kv_dtype {
            KvDtype::Bf16 => HEAD_DIM_QK,
            other => other.row_bytes(),
        };
        let page_elems = mul(ps, row_elems, "page size")?;
        let (kv_ptr, kv_len, scales) = match (t.kv, self.kv_dtype) {
            (KvData::Bf16(s), KvDtype::Bf16) => (s.as_ptr() as *const c_void, s.len(), None),
            (KvData::Fp8(s), KvDtype::Fp8E4m3 | KvDtype::Fp8E4m3Fnuz) => (s.as_ptr() as *const c_void, s.len(), None),
            (
                KvData::Mxfp4 {
                    data,
                    scales,
                    scale_stride,
                },
                KvDtype::Mxfp4,
            ) => (data.as_ptr() as *const c_void, data.len(), Some((scales, scale_stride))),
            (kv, d) => {
                let name = match kv {
                    KvData::Bf16(_) => "Bf16",
                    KvData::Fp8(_) => "Fp8",
                    KvData::Mxfp4 { .. } => "Mxfp4",
                };
                return Err(Error::binding(
                    Status::UnsupportedDtype,
                    format!("tensors.kv is KvData::{} but the plan's kv_dtype is {:?}", name, d),
                ));
            }
        };
        if kv_len % page_elems != 0 {
            return Err(invalid(format!(
                "tensors.kv has {} elements, not a multiple of page_size ({}) * row ({}) = {}",
                kv_len, ps, row_elems, page_elems
            )));
        }
        let num_pages = kv_len / page_elems;
        if num_pages == 0 && total_pages > 0 {
            return Err(invalid(format!(
                "tensors.kv holds no pages but the batch references {} pages",
                total_pages
            )));
        }
        let num_pages_i64 =
            i64::try_from(num_pages).map_err(|_| invalid(format!("{} pages do not fit in i64", num_pages)))?;

        let mut stride_c = 0i32;
        let mut scales_ptr: *const u8 = ptr::null();
        if let Some((s, stride)) = scales {
            let eff = if stride == 0 { MXFP4_SCALES_PER_ROW } else { stride };
            stride_c = i32::try_from(stride)
                .map_err(|_| invalid(format!("tensors.kv scale_stride = {} does not fit in i32", stride)))?;
            // Enough bytes for every row of every page whatever the stride
            // (the library refuses strides below 18).
            let need = mul(
                mul(num_pages, ps, "scale rows")?,
                eff.max(MXFP4_SCALES_PER_ROW),
                "scale bytes",
            )?;
            if s.len() < need {
                return Err(invalid(format!(
                    "tensors.kv MXFP4 scales have {} bytes, {} pages * page_size ({}) * scale_stride ({}) = {} needed",
                    s.len(),
                    num_pages,
                    ps,
                    eff,
                    need
                )));
            }
            scales_ptr = if s.is_empty() { EMPTY.0.as_ptr() } else { s.as_ptr() };
        }

        // Page table.
        let idx_ptr = match t.kv_indices {
            Some(ix) => {
                if ix.len() < total_pages {
                    return Err(invalid(format!(
                        "tensors.kv_indices has {} entries, the batch's kv_indptr[{}] = {} needs that many",
                        ix.len(),
                        batch_size,
                        total_pages
                    )));
                }
                if ix.is_empty() {
                    EMPTY.0.as_ptr() as *const i32
                } else {
                    ix.as_ptr()
                }
            }
            None => ptr::null(),
        };

        // Outputs.
        let out_need = mul(rows, HEAD_DIM_V, "out elements")?;
        if t.out.len() < out_need {
            return Err(invalid(format!(
                "tensors.out has {} elements, the batch needs total_q ({}) * num_heads ({}) * {} = {}",
                t.out.len(),
                total_q,
                self.num_heads,
                HEAD_DIM_V,
                out_need
            )));
        }
        let lse_ptr = match t.lse.as_deref_mut() {
            Some(l) => {
                if l.len() < rows {
                    return Err(invalid(format!(
                        "tensors.lse has {} elements, the batch needs total_q ({}) * num_heads ({}) = {}",
                        l.len(),
                        total_q,
                        self.num_heads,
                        rows
                    )));
                }
                l.as_mut_ptr()
            }
            None => ptr::null_mut(),
        };
        if rows == 0 {
            // No query rows: nothing is read or written.
            return Ok(());
        }

        let (ws_ptr, ws_len) = match workspace {
            // An empty slice's dangling pointer is not 16-byte aligned; pass
            // an aligned one so the library reports the size, not alignment.
            Some([]) => (EMPTY.0.as_ptr() as *mut c_void, 0),
            Some(w) => (w.as_mut_ptr() as *mut c_void, w.len()),
            None => (ptr::null_mut(), 0),
        };
        let raw = RawTensors {
            q: q_ptr,
            kv: if kv_len == 0 {
                EMPTY.0.as_ptr() as *const c_void
            } else {
                kv_ptr
            },
            kv_block_scales: scales_ptr,
            kv_indices: idx_ptr,
            out: t.out.as_mut_ptr() as *mut c_void,
            lse: lse_ptr,
            workspace: ws_ptr,
            workspace_size: ws_len,
            q_scale: t.q_scale,
            kv_scale: t.kv_scale,
            kv_scale_stride: stride_c,
            num_pages: num_pages_i64,
        };
        let c = raw.to_c();
        // SAFETY: every pointer is valid for the lengths checked above, which
        // cover all rows the metadata refers to; page indices are range-checked
        // by the library against num_pages; out/lse are exclusively borrowed.
        check(unsafe { sys::mla_plan_execute(self.raw.as_ptr(), &c, ptr::null_mut()) })
    }

    /// Runs attention for one layer on caller-owned memory (device memory for
    /// GPU plans) on `stream`. Never allocates, never synchronises the host.
    ///
    /// # Safety
    /// Every non-null pointer in `t` must be valid for the shapes of the last
    /// metadata (see `mla_tensors` in `mla.h`), in the plan's memory space, and
    /// stay valid until the work on `stream` completes; `out` and `lse` must
    /// not alias the inputs; `stream` must be null or a valid stream of the
    /// plan's device (ignored by CPU plans).
    pub unsafe fn execute_raw(&mut self, t: &RawTensors, stream: *mut c_void) -> Result<()> {
        let c = t.to_c();
        check(sys::mla_plan_execute(self.raw.as_ptr(), &c, stream))
    }
}
