/*
 * libmla — MLA (Multi-head Latent Attention) decode attention.
 *
 * The one public header. C11 / C++17 compatible, no dependencies beyond the
 * C standard headers.
 *
 * Usage (FFTW / cuFFT shape):
 *
 *     mla_plan_desc desc;  mla_plan_desc_init(&desc);
 *     desc.num_heads = 16; desc.kv_dtype = MLA_DTYPE_FP8_E4M3; desc.page_size = 64;
 *     mla_plan *plan;      mla_plan_create(&desc, &plan);
 *     for each decode step:
 *         mla_batch b;     mla_batch_init(&b);  ... lengths ...
 *         mla_plan_build_metadata(plan, &b, stream);
 *         for each layer:
 *             mla_tensors t;  mla_tensors_init(&t);  ... pointers ...
 *             mla_plan_execute(plan, &t, stream);
 *     mla_plan_destroy(plan);
 *
 * Computation (absorbed MLA, one latent KV head shared by all query heads):
 * for sequence b with L cached tokens and n query tokens, query token i, head h:
 *     s_j = sm_scale * dot(q[i,h,0:576], K[j,0:576]),  j = 0..L-1
 *     s_j = cap * tanh(s_j / cap)                  when logit_cap > 0
 *     j is visible iff j <= L - n + i              (causal)
 *     out[i,h,0:512] = softmax(s)·K[:,0:512]        (V = first 512 dims of K)
 *     lse[i,h]       = ln(sum_j exp(s_j))           over visible j
 * A row with no visible key (L = 0, or L < n) gets out = 0 and lse = -inf.
 *
 * Thread safety: a plan may be used by one thread at a time (calls on one plan
 * must not overlap). Different plans may be used concurrently from different
 * threads. mla_last_error_message() is per thread. All other functions are
 * thread-safe.
 */
#ifndef MLA_H
#define MLA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Export macro ------------------------------------------------------ */

#if defined(_WIN32)
#  if defined(MLA_BUILDING_LIBRARY)
#    define MLA_API __declspec(dllexport)
#  else
#    define MLA_API __declspec(dllimport)
#  endif
#elif defined(__GNUC__) || defined(__clang__)
#  define MLA_API __attribute__((visibility("default")))
#else
#  define MLA_API
#endif

/* ---- Version ----------------------------------------------------------- */

/** Version of the header. Compare with mla_version() to detect a mismatch. */
#define MLA_VERSION_MAJOR 0
#define MLA_VERSION_MINOR 1
#define MLA_VERSION_PATCH 0
/** The version as one integer: major * 10000 + minor * 100 + patch. */
#define MLA_VERSION (MLA_VERSION_MAJOR * 10000 + MLA_VERSION_MINOR * 100 + MLA_VERSION_PATCH)

/** Version of the loaded library, encoded as MLA_VERSION. */
MLA_API int mla_version(void);

/* ---- Constants of the computation -------------------------------------- */

/** Dimensions of the absorbed DeepSeek MLA head: q and KV rows are 576 wide,
 *  the first 512 of which are V. These are the only supported values. */
#define MLA_HEAD_DIM_QK 576
#define MLA_HEAD_DIM_V 512
/** Largest supported number of query heads per plan. */
#define MLA_MAX_HEADS 128
/** Largest supported number of query tokens per sequence (q_len). */
#define MLA_MAX_Q_LEN 8
/** Largest supported page size (page sizes are powers of two 1..256). */
#define MLA_MAX_PAGE_SIZE 256
/** Largest split count that mla_plan_desc.num_splits may force. */
#define MLA_MAX_SPLITS 64
/** MXFP4: values per E8M0 scale, and scale bytes per KV row (576 / 32). */
#define MLA_MXFP4_BLOCK 32
#define MLA_MXFP4_SCALES_PER_ROW 18

/* ---- Status ------------------------------------------------------------ */

/** Result of every call. Values are only ever appended, never renumbered. */
typedef enum mla_status {
    MLA_SUCCESS = 0,
    /** A required pointer argument or field was NULL. */
    MLA_ERROR_NULL_POINTER = 1,
    /** A descriptor's struct_size is 0 or larger than this library knows
     *  and the unknown tail is not zero. */
    MLA_ERROR_STRUCT_SIZE = 2,
    /** A dimension, count or scalar is outside its allowed range. */
    MLA_ERROR_INVALID_VALUE = 3,
    /** A dtype or dtype combination that this library does not support. */
    MLA_ERROR_UNSUPPORTED_DTYPE = 4,
    /** qo_indptr / kv_indptr is not monotonic, does not start at 0, or a
     *  sequence's length is outside its allowed range. */
    MLA_ERROR_INVALID_INDPTR = 5,
    /** kv_last_page_len[b] is outside 1..page_size. */
    MLA_ERROR_INVALID_LAST_PAGE_LEN = 6,
    /** A kv_indices entry is negative or >= num_pages. */
    MLA_ERROR_PAGE_OUT_OF_RANGE = 7,
    /** batch_size above the plan's max_batch_size, or q_len above max_q_len. */
    MLA_ERROR_LIMIT_EXCEEDED = 8,
    /** mla_plan_execute called before any successful mla_plan_build_metadata. */
    MLA_ERROR_NO_METADATA = 9,
    /** The requested backend is not built in, or no usable device is present. */
    MLA_ERROR_BACKEND_UNAVAILABLE = 10,
    /** The device ordinal does not exist, or the plan is used on another device. */
    MLA_ERROR_INVALID_DEVICE = 11,
    /** A GPU runtime call failed; the message names the call and its error. */
    MLA_ERROR_DEVICE_RUNTIME = 12,
    /** Host or device memory could not be allocated. */
    MLA_ERROR_OUT_OF_MEMORY = 13,
    /** A pointer does not meet its alignment requirement (see mla_tensors). */
    MLA_ERROR_MISALIGNED = 14,
    /** The caller's workspace is smaller than mla_plan_workspace_size(), or no
     *  workspace was given to a plan created with MLA_FLAG_CALLER_WORKSPACE. */
    MLA_ERROR_WORKSPACE_TOO_SMALL = 15,
    /** MLA_FLAG_VALIDATE_DEVICE_INPUTS found bad device-resident metadata or
     *  page indices; the message says which check failed. */
    MLA_ERROR_DEVICE_VALIDATION_FAILED = 16,
    /** A bug in libmla; please report the message. */
    MLA_ERROR_INTERNAL = 17
} mla_status;

/** Static name of a status, e.g. "MLA_ERROR_NULL_POINTER". Never NULL. */
MLA_API const char *mla_status_string(mla_status status);

/** The last error of the calling thread as a sentence naming the argument and
 *  the refused value; "" when the thread's last call succeeded. Valid until
 *  the thread's next libmla call. */
MLA_API const char *mla_last_error_message(void);

/* ---- Enumerations ------------------------------------------------------ */

/** Element formats. MLA_DTYPE_DEFAULT (0) means "the field's default". */
typedef enum mla_dtype {
    MLA_DTYPE_DEFAULT = 0,
    /** bfloat16 (Q, KV, out). */
    MLA_DTYPE_BF16 = 1,
    /** OCP FP8 E4M3 (NVIDIA, gfx950), with one float32 scale (Q, KV). */
    MLA_DTYPE_FP8_E4M3 = 2,
    /** FP8 E4M3 FNUZ (AMD gfx942), with one float32 scale (Q, KV). */
    MLA_DTYPE_FP8_E4M3_FNUZ = 3,
    /** OCP MXFP4: E2M1 pairs (low nibble = even element) + one E8M0 scale per
     *  32 elements in a separate array (KV only). */
    MLA_DTYPE_MXFP4 = 4,
    /** float32 (reserved for outputs; lse is always float32). */
    MLA_DTYPE_FLOAT32 = 5
} mla_dtype;

/** Where a plan runs. */
typedef enum mla_backend {
    /** The GPU backend when it is built in and a device is present, else CPU. */
    MLA_BACKEND_AUTO = 0,
    /** Multi-threaded CPU backend; always built; the reference. */
    MLA_BACKEND_CPU = 1,
    /** HIP kernels (AMD via ROCm, NVIDIA via the CUDA toolchain). */
    MLA_BACKEND_GPU = 2
} mla_backend;

/** Where the arrays of an mla_batch live. */
typedef enum mla_memory {
    /** Host memory: metadata is computed on the host (and uploaded for GPU plans). */
    MLA_MEMORY_HOST = 0,
    /** Device memory (GPU plans only): metadata is computed by a kernel on the
     *  stream with no host synchronisation, so it can be captured in a graph. */
    MLA_MEMORY_DEVICE = 1
} mla_memory;

/** Plan flags (bitwise OR into mla_plan_desc.flags). */
typedef enum mla_flags {
    /** Split boundaries depend only on each sequence's own length: a
     *  sequence's output is bitwise identical whatever else is in the batch. */
    MLA_FLAG_DETERMINISTIC = 1u << 0,
    /** GPU: check device-resident indptr / last_page_len / kv_indices on the
     *  device. build_metadata and execute then synchronise the stream to
     *  report MLA_ERROR_DEVICE_VALIDATION_FAILED. For debugging. */
    MLA_FLAG_VALIDATE_DEVICE_INPUTS = 1u << 1,
    /** The plan allocates no workspace; every execute must pass one. */
    MLA_FLAG_CALLER_WORKSPACE = 1u << 2
} mla_flags;

/* ---- Plan descriptor ---------------------------------------------------- */

/** Static shape of a plan. Zero fields mean the default given per field.
 *  Fields are only ever appended; always call mla_plan_desc_init first. */
typedef struct mla_plan_desc {
    size_t struct_size;      /**< sizeof(mla_plan_desc); set by _init. */
    int32_t num_heads;       /**< Query heads, 1..128. Required. */
    int32_t head_dim_qk;     /**< 0 = 576; only 576 is supported. */
    int32_t head_dim_v;      /**< 0 = 512; only 512 is supported. */
    mla_dtype q_dtype;       /**< 0 = BF16; or FP8_E4M3 / FP8_E4M3_FNUZ. */
    mla_dtype kv_dtype;      /**< 0 = BF16; or FP8_E4M3, FP8_E4M3_FNUZ, MXFP4. */
    mla_dtype out_dtype;     /**< 0 = BF16; only BF16 is supported. */
    int32_t page_size;       /**< Tokens per KV page, power of two 1..256; 0 = 1. */
    int32_t max_batch_size;  /**< Largest batch of any step; 0 = 256. */
    int32_t max_q_len;       /**< Largest q_len of any sequence, 1..8; 0 = 1. */
    float sm_scale;          /**< Softmax scale; 0 = 1/sqrt(576). */
    float logit_cap;         /**< > 0 enables s = cap*tanh(s/cap); 0 = off. */
    int32_t num_splits;      /**< 0 = automatic; 1..MLA_MAX_SPLITS forces
                                  that many KV splits per sequence. */
    uint32_t flags;          /**< OR of mla_flags. */
    mla_backend backend;     /**< 0 = AUTO. */
    int32_t device;          /**< GPU ordinal for GPU plans (0 = first). */
    int32_t num_threads;     /**< CPU backend threads; 0 = all hardware threads. */
} mla_plan_desc;

/** Fill *desc with defaults (all zero) and struct_size. */
MLA_API mla_status mla_plan_desc_init(mla_plan_desc *desc);

/* ---- Per-step batch ----------------------------------------------------- */

/** Sequence lengths of one decode step. For sequence b:
 *    q tokens   = qo_indptr[b+1] - qo_indptr[b]        (0..max_q_len)
 *    pages      = kv_indptr[b+1] - kv_indptr[b]
 *    kv_len     = (pages - 1) * page_size + kv_last_page_len[b], or 0 if pages == 0
 *  Both indptr arrays start at 0 and are non-decreasing. */
typedef struct mla_batch {
    size_t struct_size;              /**< sizeof(mla_batch); set by _init. */
    int32_t batch_size;              /**< Sequences, 0..max_batch_size. */
    const int32_t *qo_indptr;        /**< [batch_size + 1] query token offsets. */
    const int32_t *kv_indptr;        /**< [batch_size + 1] page offsets into kv_indices. */
    const int32_t *kv_last_page_len; /**< [batch_size] fill of the last page,
                                          1..page_size; NULL = full pages. */
    mla_memory memory;               /**< Where the three arrays live; 0 = HOST. */
} mla_batch;

/** Fill *batch with defaults (all zero) and struct_size. */
MLA_API mla_status mla_batch_init(mla_batch *batch);

/* ---- Per-layer tensors -------------------------------------------------- */

/** Data of one layer. For GPU plans every pointer is device memory, for CPU
 *  plans host memory. q, kv and out must be 16-byte aligned, lse 4-byte. */
typedef struct mla_tensors {
    size_t struct_size;             /**< sizeof(mla_tensors); set by _init. */
    const void *q;                  /**< [total_q, num_heads, 576] of q_dtype. */
    const void *kv;                 /**< [num_pages, page_size, row] rows of 1152 (bf16),
                                         576 (fp8) or 288 (mxfp4) bytes. */
    const uint8_t *kv_block_scales; /**< MXFP4 only: E8M0 bytes
                                         [num_pages, page_size, kv_scale_stride]. */
    const int32_t *kv_indices;      /**< Page table, CSR over kv_indptr; NULL = identity
                                         (sequence b's pages are kv_indptr[b]..). */
    void *out;                      /**< [total_q, num_heads, 512] bf16, written. */
    float *lse;                     /**< [total_q, num_heads] natural-log LSE, or NULL. */
    void *workspace;                /**< NULL = the plan's own; else >= workspace size bytes,
                                         16-byte aligned, device memory for GPU plans. */
    size_t workspace_size;          /**< Bytes at workspace. */
    float q_scale;                  /**< FP8 q dequant scale; 0 = 1. */
    float kv_scale;                 /**< FP8 KV dequant scale; 0 = 1. */
    int32_t kv_scale_stride;        /**< MXFP4 scale bytes per token, >= 18; 0 = 18. */
    int64_t num_pages;              /**< Pages in kv, for range checks; 0 = unknown
                                         (unchecked on the host). */
} mla_tensors;

/** Fill *tensors with defaults (all zero) and struct_size. */
MLA_API mla_status mla_tensors_init(mla_tensors *tensors);

/* ---- Plan ---------------------------------------------------------------- */

/** Opaque plan. */
typedef struct mla_plan mla_plan;

/** Create a plan for a static shape. On success *plan is a new plan; on
 *  failure *plan is set to NULL (when plan is not NULL). GPU plans allocate
 *  their device buffers here. */
MLA_API mla_status mla_plan_create(const mla_plan_desc *desc, mla_plan **plan);

/** Build the split-KV work list of one decode step. Depends only on lengths,
 *  not data; call once per step, before the layers' execute calls.
 *  stream: a hipStream_t / cudaStream_t for GPU plans (NULL = default stream);
 *  ignored by CPU plans. With MLA_MEMORY_DEVICE it enqueues a kernel and never
 *  synchronises the host (unless MLA_FLAG_VALIDATE_DEVICE_INPUTS). */
MLA_API mla_status mla_plan_build_metadata(mla_plan *plan, const mla_batch *batch, void *stream);

/** Run attention for one layer with the last metadata built. Never allocates,
 *  never synchronises the host, never copies to the host (GPU). */
MLA_API mla_status mla_plan_execute(mla_plan *plan, const mla_tensors *tensors, void *stream);

/** Bytes of workspace that execute needs (fixed per plan, from its limits). */
MLA_API mla_status mla_plan_workspace_size(const mla_plan *plan, size_t *bytes);

/** Which backend a plan runs on (resolves MLA_BACKEND_AUTO). */
MLA_API mla_status mla_plan_backend(const mla_plan *plan, mla_backend *backend);

/** What the scheduler chose for the last host-built metadata. */
typedef struct mla_schedule_info {
    size_t struct_size;        /**< sizeof(mla_schedule_info); set by _init. */
    int32_t num_work_items;    /**< (sequence, head block, KV range) items. */
    int32_t num_split_rows;    /**< Items that write partials to be combined. */
    int32_t max_splits;        /**< Largest split count of any sequence. */
    int32_t rows_per_item;     /**< Query rows (tokens x heads) per item. */
    int32_t head_blocks;       /**< Head blocks per sequence. */
    int32_t target_blocks;     /**< Balanced target KV blocks per item (0 = n/a). */
    int32_t block_tokens;      /**< KV tokens per scheduling block. */
    int32_t workers;           /**< Parallel workers the scheduler balanced for. */
} mla_schedule_info;

/** Fill *info with defaults (all zero) and struct_size. */
MLA_API mla_status mla_schedule_info_init(mla_schedule_info *info);

/** The scheduler's choices for the last metadata built from host arrays.
 *  MLA_ERROR_NO_METADATA when none was built or it was built on the device. */
MLA_API mla_status mla_plan_schedule_info(const mla_plan *plan, mla_schedule_info *info);

/** Destroy a plan and free everything it owns. NULL is a no-op. A GPU plan
 *  must not be destroyed while work using it is still running on a stream
 *  (synchronise first). */
MLA_API void mla_plan_destroy(mla_plan *plan);

/** Number of usable GPUs for MLA_BACKEND_GPU (0 when none or not built). */
MLA_API int mla_gpu_device_count(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MLA_H */
