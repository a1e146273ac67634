/*
 * Float64 reference of DESIGN §1, written independently of the library: its
 * own element decoders, its own paging arithmetic, and a straightforward
 * two-pass softmax per query row. It uses only the public enums of mla.h.
 *
 * Dequantization follows the library's contract exactly, so that the only
 * differences left are the library's float32 arithmetic and its bf16 output:
 *   bf16            exact
 *   fp8 (both)      float32(fp8 * scale)   (the product rounded to float, as
 *                   the library forms it; a scale of 0 means 1)
 *   mxfp4           e2m1 * 2^(e8m0 - 127)  (exact)
 */
#ifndef MLA_TEST_REFERENCE_H
#define MLA_TEST_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

#include <mla.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- element decoders (NaN encodings decode to NaN) ---------------------- */
double ref_bf16(uint16_t bits);
double ref_fp8_e4m3(uint8_t bits);      /* OCP: bias 7, S.1111.111 NaN, max 448 */
double ref_fp8_e4m3_fnuz(uint8_t bits); /* bias 8, 0x80 NaN, max 240 */
double ref_e2m1(unsigned nibble);       /* {0,.5,1,1.5,2,3,4,6}, bit 3 = sign */
double ref_e8m0(uint8_t bits);          /* 2^(e-127), 255 NaN */

/* Bytes of one stored KV row (576 elements) / one Q row. */
size_t ref_kv_row_bytes(mla_dtype kv);
size_t ref_q_row_bytes(mla_dtype q);

/* Decode one 576-element KV row (`row` points at the row; for mxfp4 `scales`
 * points at that row's E8M0 bytes). kv_scale 0 means 1. */
void ref_decode_kv_row(mla_dtype kv, const uint8_t *row, const uint8_t *scales, float kv_scale, double *dst);
/* Decode one 576-element Q row; q_scale 0 means 1. */
void ref_decode_q_row(mla_dtype q, const uint8_t *row, float q_scale, double *dst);

/* One problem: the plan's shape plus one step's batch and one layer's data. */
typedef struct ref_problem {
    int num_heads;
    mla_dtype q_dtype;  /* BF16, FP8_E4M3 or FP8_E4M3_FNUZ */
    mla_dtype kv_dtype; /* BF16, FP8_E4M3, FP8_E4M3_FNUZ or MXFP4 */
    int page_size;
    float sm_scale;  /* 0 = float(1/sqrt(576)), as in the library */
    float logit_cap; /* 0 = off */

    int batch_size;
    const int32_t *qo_indptr;        /* [batch_size + 1] */
    const int32_t *kv_indptr;        /* [batch_size + 1], in pages */
    const int32_t *kv_last_page_len; /* [batch_size], NULL = full pages */
    const int32_t *kv_indices;       /* NULL = identity page table */

    const void *q;                  /* [total_q, num_heads, 576] */
    const void *kv;                 /* [num_pages, page_size, row] */
    const uint8_t *kv_block_scales; /* mxfp4: [num_pages, page_size, scale_stride] */
    int kv_scale_stride;            /* 0 = 18 */
    float q_scale, kv_scale;        /* 0 = 1 */
} ref_problem;

/* Compute out[total_q][num_heads][512] and lse[total_q][num_heads] (natural
 * log; -inf for rows with no visible key, whose out is 0). Per row, when not
 * NULL (0 for empty rows):
 *   vmax  max |V| over the row's visible keys: the scale of the output
 *         (a convex combination of those V rows);
 *   smag  sm_scale * |q| * max_j |K_j| over the visible keys (2-norms): an
 *         upper bound of sm_scale * sum_i |q_i K_ji|, the scale of the
 *         float32 rounding error of the scores.
 * Returns 0, or -1 when the problem is malformed or reads a NaN element. */
int ref_attention(const ref_problem *p, double *out, double *lse, double *vmax, double *smag);

/* Total query tokens of a batch: qo_indptr[batch_size]. */
int ref_total_q(const ref_problem *p);

#ifdef __cplusplus
}
#endif

#endif
