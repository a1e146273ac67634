/*
 * Test helpers shared by the CPU and GPU suites: seeded random numbers,
 * random data of every dtype, random ragged batches with shuffled page
 * tables, guarded buffers, and the comparison against the float64 reference.
 * Plain C, no CMocka dependency (the C++ GPU suite uses it too).
 */
#ifndef MLA_TEST_TESTUTIL_H
#define MLA_TEST_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include <mla.h>

#include "seed.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- random numbers (seeded by tu_seed, seed.h) -------------------------- */

typedef struct tu_rng {
    uint64_t s[4];
} tu_rng; /* xoshiro256** */

void tu_rng_init(tu_rng *rng, uint64_t seed);
uint64_t tu_next(tu_rng *rng);
double tu_uniform(tu_rng *rng);               /* [0, 1) */
int tu_range(tu_rng *rng, int lo, int hi);    /* uniform integer in [lo, hi] */
double tu_normal(tu_rng *rng);                /* N(0, 1) */
int tu_chance(tu_rng *rng, double p);         /* 1 with probability p */
void tu_shuffle(tu_rng *rng, int32_t *v, int n);

/* ---- element formats ----------------------------------------------------- */

uint16_t tu_float_to_bf16(float f); /* round to nearest even */
float tu_bf16_to_float(uint16_t h);

#define TU_BF16_POISON 0xffffu /* a NaN; memset(0xff) writes it */

/* A random non-NaN fp8 code of the given flavour. Mostly codes of moderate
 * magnitude (|v| in about 2^-6 .. 8); one in eight is any non-NaN code at
 * all (zero, subnormals, the maximum). */
uint8_t tu_rand_fp8(tu_rng *rng, mla_dtype flavour);
/* The flavour's NaN encoding (used to poison memory that must not be read). */
uint8_t tu_fp8_nan(mla_dtype flavour);
int tu_fp8_is_nan(mla_dtype flavour, uint8_t code);

/* n elements of dtype (bf16, fp8 e4m3 / fnuz) at dst. bf16: N(0, stddev^2)
 * rounded to bf16; fp8: tu_rand_fp8 (stddev ignored: use the scale). */
void tu_fill_random(tu_rng *rng, mla_dtype dtype, void *dst, size_t n, double stddev);

/* ---- guarded buffers ----------------------------------------------------- */

#define TU_GUARD 256

/* `size` usable bytes at `data` (64-byte aligned), TU_GUARD bytes of a known
 * pattern on each side. */
typedef struct tu_buf {
    unsigned char *raw;
    unsigned char *data;
    size_t size;
} tu_buf;

int tu_buf_alloc(tu_buf *b, size_t size); /* 0 on success; data zeroed */
void tu_buf_free(tu_buf *b);
void tu_buf_poison(tu_buf *b);            /* data = 0xff bytes (bf16 / f32 NaN) */
int tu_buf_guards_ok(const tu_buf *b);    /* 1 when both guards are intact */

size_t tu_count_bf16_nan(const uint16_t *v, size_t n);
size_t tu_count_f32_nan(const float *v, size_t n);

/* ---- batches -------------------------------------------------------------- */

typedef struct tu_batch {
    int batch_size;
    int page_size;
    int32_t *q_lens;           /* [batch_size] */
    int32_t *kv_lens;          /* [batch_size] */
    int32_t *qo_indptr;        /* [batch_size + 1] */
    int32_t *kv_indptr;        /* [batch_size + 1], pages */
    int32_t *kv_last_page_len; /* [batch_size]; 0 for sequences without pages */
    int32_t *kv_indices;       /* [total_pages], or NULL for the identity table */
    int total_q;
    int total_pages;  /* pages referenced by the batch */
    int num_pages;    /* pages in the cache: total_pages + spare (never read) */
    int all_full;     /* every kv_len is a multiple of page_size (NULL last_page_len is valid) */
} tu_batch;

/* Build a batch. explicit_indices: a random permutation of the cache's pages
 * (spare pages end up scattered among the used ones); else NULL indices and
 * the identity layout with the spare pages at the end. Returns 0 on success. */
int tu_batch_make(tu_batch *b, int batch_size, const int *q_lens, const int *kv_lens, int page_size,
                  int explicit_indices, int spare_pages, tu_rng *rng);
void tu_batch_free(tu_batch *b);
/* Physical page of page-table slot `slot`. */
int tu_batch_page(const tu_batch *b, int slot);
/* Fill an mla_batch (host memory) from it. null_last_page_len requires all_full. */
void tu_batch_to_mla(const tu_batch *b, int null_last_page_len, mla_batch *out);

/* Random ragged KV lengths: a mixture of 0, 1, short (2..64), medium
 * (65..max_medium) and, with probability p_long each, long (up to max_long). */
void tu_random_kv_lens(tu_rng *rng, int n, int max_medium, double p_long, int max_long, int *kv_lens);

/* Work of a batch in (query row x visible key) units, summed over heads. */
double tu_batch_work(int batch_size, const int *q_lens, const int *kv_lens, int num_heads);
/* Halve the longest lengths until tu_batch_work <= budget (0 and 1 survive). */
void tu_fit_budget(int batch_size, const int *q_lens, int *kv_lens, int num_heads, double budget);

/* ---- KV cache and Q -------------------------------------------------------- */

typedef struct tu_kv {
    mla_dtype dtype;
    int page_size;
    int num_pages;
    size_t row_bytes;
    int scale_stride; /* mxfp4: E8M0 bytes per token (>= 18) */
    float kv_scale;   /* fp8 scale (0 for the others) */
    tu_buf data;      /* [num_pages, page_size, row_bytes] */
    tu_buf scales;    /* mxfp4: [num_pages, page_size, scale_stride] */
} tu_kv;

/* Random KV cache for the batch. Rows that the computation reads (tokens
 * 0..kv_len-1 of sequences with q_len > 0) get random data; every other byte
 * (the tail of last pages, spare pages, sequences without queries, mxfp4
 * scale padding) holds NaN encodings, so reading them poisons the output.
 * scale_stride 0 = 18. Returns 0 on success. */
int tu_kv_make(tu_kv *kv, mla_dtype dtype, const tu_batch *b, int scale_stride, tu_rng *rng);
void tu_kv_free(tu_kv *kv);
/* Copy token row `token` of sequence `seq` of batch `src_b` in `src` to the
 * same token of sequence `dst_seq` in `dst` (data and scales). */
void tu_kv_copy_row(tu_kv *dst, const tu_batch *dst_b, int dst_seq, const tu_kv *src, const tu_batch *src_b,
                    int src_seq, int token);

/* q[total_q, num_heads, 576] of dtype, random. Returns 0 on success. */
int tu_q_make(tu_buf *q, mla_dtype dtype, int total_q, int num_heads, double stddev, tu_rng *rng);

/* A random scale for fp8 data, about 0.25 .. 0.75 (never 0). */
float tu_rand_fp8_scale(tu_rng *rng);

/* ---- comparison ----------------------------------------------------------- */

/* Per row, with vmax = max |V| over the row's visible keys and smag the
 * scale of its scores' rounding error (see ref_attention):
 *   |out - ref| <= (out_atol + score_eps * smag) * vmax + out_rtol * |ref|
 *   |lse - ref| <= lse_atol + score_eps * smag + lse_rtol * |ref|
 * Rows without visible keys must be exactly out = 0, lse = -inf. */
typedef struct tu_tol {
    double out_rtol;
    double out_atol;  /* relative to max |V| of the row's visible keys */
    double lse_rtol;
    double lse_atol;
    double score_eps; /* float32 score error per unit of smag */
} tu_tol;

typedef struct tu_cmp {
    size_t rows;        /* rows compared */
    size_t bad_out;     /* elements out of tolerance */
    size_t bad_lse;     /* lse values out of tolerance */
    size_t unwritten;   /* poison (NaN) still present */
    double worst_ratio; /* max |err| / tolerance over out elements */
    double worst_abs;   /* max |err| over out elements */
    double worst_lse;   /* max |err| over finite lse */
    double worst_lse_ratio; /* max |err| / tolerance over finite lse */
    size_t worst_row;
} tu_cmp;

void tu_cmp_init(tu_cmp *c);
/* Compare `rows` rows (row = token * num_heads + head) of out (bf16, [rows][512])
 * and lse (float, may be NULL) against the reference. Prints at most max_print
 * mismatches (prefixed by `what`). Returns the number of problems found. */
size_t tu_compare(const char *what, const uint16_t *out, const float *lse, const double *ref_out,
                  const double *ref_lse, const double *vmax, const double *smag, size_t rows, const tu_tol *tol,
                  tu_cmp *c, int max_print);

/* Compare two library outputs (for GPU vs CPU): the reference side is bf16 and
 * float too. vmax, smag as above (smag may be NULL: 0). */
size_t tu_compare_lib(const char *what, const uint16_t *out, const float *lse, const uint16_t *ref_out,
                      const float *ref_lse, const double *vmax, const double *smag, size_t rows, const tu_tol *tol,
                      tu_cmp *c, int max_print);

/* Per-row vmax and smag (see ref_attention) of a batch, computed with the
 * reference decoders; rows without keys get 0. q: the batch's Q of q_dtype,
 * sm_scale 0 = default. vmax, smag: [total_q * num_heads]. 0 on success. */
int tu_row_bounds(const tu_batch *b, const tu_kv *kv, const void *q, mla_dtype q_dtype, float q_scale, int num_heads,
                  float sm_scale, double *vmax, double *smag);

const char *tu_dtype_name(mla_dtype d);

#ifdef __cplusplus
}
#endif

#endif
