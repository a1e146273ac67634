/* Test helpers; see testutil.h. */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference.h"

#define DQK MLA_HEAD_DIM_QK
#define DV MLA_HEAD_DIM_V

/* ---- random numbers -------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void tu_rng_init(tu_rng *rng, uint64_t seed) {
    int i;
    for (i = 0; i < 4; ++i) rng->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t tu_next(tu_rng *rng) {
    uint64_t *s = rng->s;
    const uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double tu_uniform(tu_rng *rng) { return (double)(tu_next(rng) >> 11) * (1.0 / 9007199254740992.0); }

int tu_range(tu_rng *rng, int lo, int hi) {
    if (hi <= lo) return lo;
    return lo + (int)(tu_next(rng) % (uint64_t)(hi - lo + 1));
}

double tu_normal(tu_rng *rng) {
    double u1 = tu_uniform(rng), u2 = tu_uniform(rng);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

int tu_chance(tu_rng *rng, double p) { return tu_uniform(rng) < p; }

void tu_shuffle(tu_rng *rng, int32_t *v, int n) {
    int i;
    for (i = n - 1; i > 0; --i) {
        const int j = tu_range(rng, 0, i);
        const int32_t t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

/* ---- element formats ------------------------------------------------------- */

uint16_t tu_float_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float tu_bf16_to_float(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint8_t tu_fp8_nan(mla_dtype flavour) { return flavour == MLA_DTYPE_FP8_E4M3_FNUZ ? 0x80 : 0x7f; }

int tu_fp8_is_nan(mla_dtype flavour, uint8_t code) {
    if (flavour == MLA_DTYPE_FP8_E4M3_FNUZ) return code == 0x80;
    return (code & 0x7f) == 0x7f;
}

uint8_t tu_rand_fp8(tu_rng *rng, mla_dtype flavour) {
    uint8_t code;
    if (tu_chance(rng, 0.125)) {
        do code = (uint8_t)tu_next(rng); while (tu_fp8_is_nan(flavour, code));
        return code;
    }
    {
        /* Exponent field around the bias: |v| in about 2^-6 .. 2^2 * 1.875. */
        const int bias = flavour == MLA_DTYPE_FP8_E4M3_FNUZ ? 8 : 7;
        const int exp = tu_range(rng, bias - 6, bias + 2);
        const int man = tu_range(rng, 0, 7);
        const int sign = tu_range(rng, 0, 1);
        code = (uint8_t)((sign << 7) | (exp << 3) | man);
        if (tu_fp8_is_nan(flavour, code)) code = (uint8_t)(code & 0x7f); /* 0x80 fnuz: +0 */
        return code;
    }
}

void tu_fill_random(tu_rng *rng, mla_dtype dtype, void *dst, size_t n, double stddev) {
    size_t i;
    if (dtype == MLA_DTYPE_BF16) {
        uint16_t *p = (uint16_t *)dst;
        for (i = 0; i < n; ++i) p[i] = tu_float_to_bf16((float)(stddev * tu_normal(rng)));
    } else {
        uint8_t *p = (uint8_t *)dst;
        for (i = 0; i < n; ++i) p[i] = tu_rand_fp8(rng, dtype);
    }
}

float tu_rand_fp8_scale(tu_rng *rng) { return (float)(0.25 + 0.5 * tu_uniform(rng)); }

/* ---- guarded buffers ------------------------------------------------------- */

static unsigned char guard_byte(size_t i) { return (unsigned char)(0xa5u ^ (unsigned)(i * 37u)); }

int tu_buf_alloc(tu_buf *b, size_t size) {
    const size_t total = size + 2 * TU_GUARD;
    size_t i;
    b->raw = (unsigned char *)aligned_alloc(64, (total + 63) / 64 * 64);
    b->size = size;
    b->data = b->raw ? b->raw + TU_GUARD : NULL;
    if (!b->raw) return -1;
    for (i = 0; i < TU_GUARD; ++i) {
        b->raw[i] = guard_byte(i);
        b->raw[TU_GUARD + size + i] = guard_byte(i + 1000);
    }
    memset(b->data, 0, size);
    return 0;
}

void tu_buf_free(tu_buf *b) {
    free(b->raw);
    b->raw = b->data = NULL;
    b->size = 0;
}

void tu_buf_poison(tu_buf *b) { memset(b->data, 0xff, b->size); }

int tu_buf_guards_ok(const tu_buf *b) {
    size_t i;
    if (!b->raw) return 1;
    for (i = 0; i < TU_GUARD; ++i)
        if (b->raw[i] != guard_byte(i) || b->raw[TU_GUARD + b->size + i] != guard_byte(i + 1000)) return 0;
    return 1;
}

size_t tu_count_bf16_nan(const uint16_t *v, size_t n) {
    size_t i, c = 0;
    for (i = 0; i < n; ++i) c += (v[i] & 0x7fffu) > 0x7f80u;
    return c;
}

size_t tu_count_f32_nan(const float *v, size_t n) {
    size_t i, c = 0;
    for (i = 0; i < n; ++i) c += isnan(v[i]) != 0;
    return c;
}

/* ---- batches ----------------------------------------------------------------- */

int tu_batch_make(tu_batch *b, int batch_size, const int *q_lens, const int *kv_lens, int page_size,
                  int explicit_indices, int spare_pages, tu_rng *rng) {
    const size_t n = (size_t)batch_size;
    int i;
    memset(b, 0, sizeof *b);
    b->batch_size = batch_size;
    b->page_size = page_size;
    b->q_lens = (int32_t *)calloc(n + 1, sizeof(int32_t));
    b->kv_lens = (int32_t *)calloc(n + 1, sizeof(int32_t));
    b->qo_indptr = (int32_t *)calloc(n + 1, sizeof(int32_t));
    b->kv_indptr = (int32_t *)calloc(n + 1, sizeof(int32_t));
    b->kv_last_page_len = (int32_t *)calloc(n + 1, sizeof(int32_t));
    if (!b->q_lens || !b->kv_lens || !b->qo_indptr || !b->kv_indptr || !b->kv_last_page_len) return -1;
    b->all_full = 1;
    for (i = 0; i < batch_size; ++i) {
        const int pages = (kv_lens[i] + page_size - 1) / page_size;
        b->q_lens[i] = q_lens[i];
        b->kv_lens[i] = kv_lens[i];
        b->qo_indptr[i + 1] = b->qo_indptr[i] + q_lens[i];
        b->kv_indptr[i + 1] = b->kv_indptr[i] + pages;
        b->kv_last_page_len[i] = pages ? kv_lens[i] - (pages - 1) * page_size : 0;
        if (kv_lens[i] % page_size) b->all_full = 0;
    }
    b->total_q = b->qo_indptr[batch_size];
    b->total_pages = b->kv_indptr[batch_size];
    b->num_pages = b->total_pages + spare_pages;
    if (b->num_pages == 0) b->num_pages = 1; /* keep the cache non-empty */
    if (explicit_indices) {
        int32_t *perm = (int32_t *)malloc((size_t)b->num_pages * sizeof(int32_t));
        if (!perm) return -1;
        for (i = 0; i < b->num_pages; ++i) perm[i] = i;
        tu_shuffle(rng, perm, b->num_pages);
        b->kv_indices = perm; /* the first total_pages entries are the table */
    }
    return 0;
}

void tu_batch_free(tu_batch *b) {
    free(b->q_lens);
    free(b->kv_lens);
    free(b->qo_indptr);
    free(b->kv_indptr);
    free(b->kv_last_page_len);
    free(b->kv_indices);
    memset(b, 0, sizeof *b);
}

int tu_batch_page(const tu_batch *b, int slot) { return b->kv_indices ? b->kv_indices[slot] : slot; }

void tu_batch_to_mla(const tu_batch *b, int null_last_page_len, mla_batch *out) {
    mla_batch_init(out);
    out->batch_size = b->batch_size;
    out->qo_indptr = b->qo_indptr;
    out->kv_indptr = b->kv_indptr;
    out->kv_last_page_len = null_last_page_len ? NULL : b->kv_last_page_len;
    out->memory = MLA_MEMORY_HOST;
}

void tu_random_kv_lens(tu_rng *rng, int n, int max_medium, double p_long, int max_long, int *kv_lens) {
    int i;
    for (i = 0; i < n; ++i) {
        const double u = tu_uniform(rng);
        if (p_long > 0 && tu_chance(rng, p_long)) kv_lens[i] = tu_range(rng, max_medium + 1, max_long);
        else if (u < 0.12) kv_lens[i] = 0;
        else if (u < 0.22) kv_lens[i] = 1;
        else if (u < 0.50) kv_lens[i] = tu_range(rng, 2, 64);
        else kv_lens[i] = tu_range(rng, 65, max_medium);
    }
}

double tu_batch_work(int batch_size, const int *q_lens, const int *kv_lens, int num_heads) {
    double w = 0;
    int i;
    for (i = 0; i < batch_size; ++i) w += (double)q_lens[i] * kv_lens[i] * num_heads;
    return w;
}

void tu_fit_budget(int batch_size, const int *q_lens, int *kv_lens, int num_heads, double budget) {
    while (tu_batch_work(batch_size, q_lens, kv_lens, num_heads) > budget) {
        int i, longest = 0;
        for (i = 1; i < batch_size; ++i)
            if ((double)kv_lens[i] * q_lens[i] > (double)kv_lens[longest] * q_lens[longest]) longest = i;
        if (kv_lens[longest] <= 1) break;
        kv_lens[longest] /= 2;
    }
}

/* ---- KV cache and Q ------------------------------------------------------------ */

static void poison_row(tu_kv *kv, size_t row) {
    unsigned char *p = kv->data.data + row * kv->row_bytes;
    size_t i;
    switch (kv->dtype) {
        case MLA_DTYPE_BF16:
            memset(p, 0xff, kv->row_bytes);
            break;
        case MLA_DTYPE_FP8_E4M3:
        case MLA_DTYPE_FP8_E4M3_FNUZ:
            memset(p, tu_fp8_nan(kv->dtype), kv->row_bytes);
            break;
        case MLA_DTYPE_MXFP4:
            for (i = 0; i < kv->row_bytes; ++i) p[i] = (unsigned char)(0x77 ^ i); /* big values... */
            memset(kv->scales.data + row * (size_t)kv->scale_stride, 0xff, (size_t)kv->scale_stride); /* ...times NaN */
            break;
        default:
            break;
    }
}

static void random_row(tu_kv *kv, size_t row, tu_rng *rng) {
    unsigned char *p = kv->data.data + row * kv->row_bytes;
    size_t i;
    if (kv->dtype == MLA_DTYPE_MXFP4) {
        unsigned char *s = kv->scales.data + row * (size_t)kv->scale_stride;
        for (i = 0; i < kv->row_bytes; ++i) p[i] = (unsigned char)tu_next(rng);
        for (i = 0; i < MLA_MXFP4_SCALES_PER_ROW; ++i) s[i] = (unsigned char)tu_range(rng, 123, 127);
        /* padding beyond the 18 scales stays NaN */
    } else {
        tu_fill_random(rng, kv->dtype, p, DQK, 1.0);
    }
}

int tu_kv_make(tu_kv *kv, mla_dtype dtype, const tu_batch *b, int scale_stride, tu_rng *rng) {
    const size_t rows = (size_t)b->num_pages * (size_t)b->page_size;
    size_t r;
    int s, j;
    memset(kv, 0, sizeof *kv);
    kv->dtype = dtype;
    kv->page_size = b->page_size;
    kv->num_pages = b->num_pages;
    kv->row_bytes = ref_kv_row_bytes(dtype);
    kv->scale_stride = scale_stride ? scale_stride : MLA_MXFP4_SCALES_PER_ROW;
    kv->kv_scale = (dtype == MLA_DTYPE_FP8_E4M3 || dtype == MLA_DTYPE_FP8_E4M3_FNUZ) ? tu_rand_fp8_scale(rng) : 0.0f;
    if (tu_buf_alloc(&kv->data, rows * kv->row_bytes)) return -1;
    if (dtype == MLA_DTYPE_MXFP4) {
        if (tu_buf_alloc(&kv->scales, rows * (size_t)kv->scale_stride)) return -1;
        memset(kv->scales.data, 0xff, kv->scales.size);
    }
    for (r = 0; r < rows; ++r) poison_row(kv, r);
    for (s = 0; s < b->batch_size; ++s) {
        if (b->q_lens[s] == 0) continue; /* never read */
        for (j = 0; j < b->kv_lens[s]; ++j) {
            const int page = tu_batch_page(b, b->kv_indptr[s] + j / b->page_size);
            random_row(kv, (size_t)page * (size_t)b->page_size + (size_t)(j % b->page_size), rng);
        }
    }
    return 0;
}

void tu_kv_free(tu_kv *kv) {
    tu_buf_free(&kv->data);
    tu_buf_free(&kv->scales);
}

static size_t token_row(const tu_batch *b, int seq, int token) {
    const int page = tu_batch_page(b, b->kv_indptr[seq] + token / b->page_size);
    return (size_t)page * (size_t)b->page_size + (size_t)(token % b->page_size);
}

void tu_kv_copy_row(tu_kv *dst, const tu_batch *dst_b, int dst_seq, const tu_kv *src, const tu_batch *src_b,
                    int src_seq, int token) {
    const size_t dr = token_row(dst_b, dst_seq, token), sr = token_row(src_b, src_seq, token);
    memcpy(dst->data.data + dr * dst->row_bytes, src->data.data + sr * src->row_bytes, src->row_bytes);
    if (src->dtype == MLA_DTYPE_MXFP4)
        memcpy(dst->scales.data + dr * (size_t)dst->scale_stride, src->scales.data + sr * (size_t)src->scale_stride,
               MLA_MXFP4_SCALES_PER_ROW);
}

int tu_q_make(tu_buf *q, mla_dtype dtype, int total_q, int num_heads, double stddev, tu_rng *rng) {
    const size_t n = (size_t)total_q * (size_t)num_heads * DQK;
    if (tu_buf_alloc(q, n * ref_q_row_bytes(dtype) / DQK + 16)) return -1; /* +16: never a 0-byte buffer */
    tu_fill_random(rng, dtype, q->data, n, stddev);
    return 0;
}

/* ---- comparison ------------------------------------------------------------------- */

void tu_cmp_init(tu_cmp *c) { memset(c, 0, sizeof *c); }

static size_t compare_rows(const char *what, const uint16_t *out, const float *lse, const double *ref_out,
                           const uint16_t *ref_out16, const double *ref_lse, const float *ref_lse32,
                           const double *vmax, const double *smag, size_t rows, const tu_tol *tol, tu_cmp *c,
                           int max_print) {
    size_t r, problems = 0;
    int printed = 0;
    for (r = 0; r < rows; ++r) {
        const double rl = ref_lse ? ref_lse[r] : (double)ref_lse32[r];
        const int empty = isinf(rl) && rl < 0;
        const double score_err = tol->score_eps * (smag ? smag[r] : 0.0);
        int d;
        c->rows++;
        if (tu_count_bf16_nan(out + r * DV, DV)) {
            c->unwritten++;
            problems++;
            if (printed++ < max_print) printf("%s: row %zu: out still holds the NaN poison\n", what, r);
            continue;
        }
        for (d = 0; d < DV; ++d) {
            const double got = tu_bf16_to_float(out[r * DV + d]);
            const double want = ref_out ? ref_out[r * DV + d] : (double)tu_bf16_to_float(ref_out16[r * DV + d]);
            const double err = fabs(got - want);
            if (empty) {
                if (got != 0.0) {
                    c->bad_out++;
                    problems++;
                    if (printed++ < max_print)
                        printf("%s: row %zu (no visible key) out[%d] = %g, want 0\n", what, r, d, got);
                }
                continue;
            }
            {
                const double bound = (tol->out_atol + score_err) * vmax[r] + tol->out_rtol * fabs(want);
                const double ratio = bound > 0 ? err / bound : (err > 0 ? INFINITY : 0.0);
                if (ratio > c->worst_ratio) {
                    c->worst_ratio = ratio;
                    c->worst_row = r;
                }
                if (err > c->worst_abs) c->worst_abs = err;
                if (!(err <= bound)) {
                    c->bad_out++;
                    problems++;
                    if (printed++ < max_print)
                        printf("%s: row %zu out[%d] = %.8g, want %.8g (|err| %.3g > tol %.3g, max|V| %.4g)\n", what,
                               r, d, got, want, err, bound, vmax[r]);
                }
            }
        }
        if (lse) {
            const double got = lse[r];
            if (isnan(got)) {
                c->unwritten++;
                problems++;
                if (printed++ < max_print) printf("%s: row %zu: lse is NaN (unwritten?)\n", what, r);
            } else if (empty) {
                if (!(isinf(got) && got < 0)) {
                    c->bad_lse++;
                    problems++;
                    if (printed++ < max_print) printf("%s: row %zu (no visible key) lse = %g, want -inf\n", what, r, got);
                }
            } else {
                const double err = fabs(got - rl), bound = tol->lse_atol + score_err + tol->lse_rtol * fabs(rl);
                if (err > c->worst_lse) c->worst_lse = err;
                if (err / bound > c->worst_lse_ratio) c->worst_lse_ratio = err / bound;
                if (!(err <= bound)) {
                    c->bad_lse++;
                    problems++;
                    if (printed++ < max_print) printf("%s: row %zu lse = %.9g, want %.9g\n", what, r, got, rl);
                }
            }
        }
    }
    return problems;
}

size_t tu_compare(const char *what, const uint16_t *out, const float *lse, const double *ref_out,
                  const double *ref_lse, const double *vmax, const double *smag, size_t rows, const tu_tol *tol,
                  tu_cmp *c, int max_print) {
    return compare_rows(what, out, lse, ref_out, NULL, ref_lse, NULL, vmax, smag, rows, tol, c, max_print);
}

size_t tu_compare_lib(const char *what, const uint16_t *out, const float *lse, const uint16_t *ref_out,
                      const float *ref_lse, const double *vmax, const double *smag, size_t rows, const tu_tol *tol,
                      tu_cmp *c, int max_print) {
    return compare_rows(what, out, lse, NULL, ref_out, NULL, ref_lse, vmax, smag, rows, tol, c, max_print);
}

int tu_row_bounds(const tu_batch *b, const tu_kv *kv, const void *q, mla_dtype q_dtype, float q_scale, int num_heads,
                  float sm_scale, double *vmax, double *smag) {
    const double sm = sm_scale == 0.0f ? (double)(1.0f / sqrtf((float)DQK)) : (double)sm_scale;
    const size_t q_row = ref_q_row_bytes(q_dtype);
    double row[DQK];
    int s, i, h, j, d;
    for (s = 0; s < b->batch_size; ++s) {
        const int n = b->q_lens[s], L = b->kv_lens[s];
        double *pv, *pk;
        if (n == 0) continue;
        pv = (double *)malloc(((size_t)L + 1) * sizeof *pv);
        pk = (double *)malloc(((size_t)L + 1) * sizeof *pk);
        if (!pv || !pk) {
            free(pv);
            free(pk);
            return -1;
        }
        for (j = 0; j < L; ++j) {
            const size_t r = token_row(b, s, j);
            double m = j ? pv[j - 1] : 0.0, k2 = 0.0;
            ref_decode_kv_row(kv->dtype, kv->data.data + r * kv->row_bytes,
                              kv->dtype == MLA_DTYPE_MXFP4 ? kv->scales.data + r * (size_t)kv->scale_stride : NULL,
                              kv->kv_scale, row);
            for (d = 0; d < DV; ++d) m = fmax(m, fabs(row[d]));
            for (d = 0; d < DQK; ++d) k2 += row[d] * row[d];
            pv[j] = m;
            pk[j] = j ? fmax(pk[j - 1], sqrt(k2)) : sqrt(k2);
        }
        for (i = 0; i < n; ++i) {
            const int visible = L - n + i + 1;
            for (h = 0; h < num_heads; ++h) {
                const size_t r = (size_t)(b->qo_indptr[s] + i) * (size_t)num_heads + (size_t)h;
                double q2 = 0.0;
                if (visible <= 0) {
                    vmax[r] = 0.0;
                    if (smag) smag[r] = 0.0;
                    continue;
                }
                vmax[r] = pv[visible - 1];
                if (smag) {
                    ref_decode_q_row(q_dtype, (const uint8_t *)q + r * q_row, q_scale, row);
                    for (d = 0; d < DQK; ++d) q2 += row[d] * row[d];
                    smag[r] = sm * sqrt(q2) * pk[visible - 1];
                }
            }
        }
        free(pv);
        free(pk);
    }
    return 0;
}

const char *tu_dtype_name(mla_dtype d) {
    switch (d) {
        case MLA_DTYPE_BF16: return "bf16";
        case MLA_DTYPE_FP8_E4M3: return "fp8_e4m3";
        case MLA_DTYPE_FP8_E4M3_FNUZ: return "fp8_fnuz";
        case MLA_DTYPE_MXFP4: return "mxfp4";
        case MLA_DTYPE_FLOAT32: return "f32";
        default: return "default";
    }
}
