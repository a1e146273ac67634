/* Float64 reference of DESIGN §1; see reference.h. Deliberately simple. */
#include "reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define DQK MLA_HEAD_DIM_QK
#define DV MLA_HEAD_DIM_V

/* ---- element decoders --------------------------------------------------- */
/* Written from the format definitions with ldexp, not by re-packing bits into
 * a float as the library does, so the two implementations stay independent. */

double ref_bf16(uint16_t bits) {
    const int sign = bits >> 15, exp = (bits >> 7) & 0xff, man = bits & 0x7f;
    double v;
    if (exp == 0xff) v = man ? NAN : INFINITY;
    else if (exp == 0) v = ldexp((double)man, -133); /* 2^(1-127) * man/128 */
    else v = ldexp(1.0 + man / 128.0, exp - 127);
    return sign ? -v : v;
}

double ref_fp8_e4m3(uint8_t bits) {
    const int sign = bits >> 7, exp = (bits >> 3) & 0xf, man = bits & 0x7;
    double v;
    if (exp == 0xf && man == 0x7) return NAN;
    if (exp == 0) v = ldexp(man / 8.0, 1 - 7);
    else v = ldexp(1.0 + man / 8.0, exp - 7);
    return sign ? -v : v;
}

double ref_fp8_e4m3_fnuz(uint8_t bits) {
    const int sign = bits >> 7, exp = (bits >> 3) & 0xf, man = bits & 0x7;
    double v;
    if (bits == 0x80) return NAN;
    if (exp == 0) v = ldexp(man / 8.0, 1 - 8);
    else v = ldexp(1.0 + man / 8.0, exp - 8);
    return sign ? -v : v;
}

double ref_e2m1(unsigned nibble) {
    static const double mag[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
    const double v = mag[nibble & 7u];
    return (nibble & 8u) ? -v : v;
}

double ref_e8m0(uint8_t bits) { return bits == 0xff ? NAN : ldexp(1.0, (int)bits - 127); }

size_t ref_kv_row_bytes(mla_dtype kv) {
    switch (kv) {
        case MLA_DTYPE_BF16: return 2 * DQK;
        case MLA_DTYPE_FP8_E4M3:
        case MLA_DTYPE_FP8_E4M3_FNUZ: return DQK;
        case MLA_DTYPE_MXFP4: return DQK / 2;
        default: return 0;
    }
}

size_t ref_q_row_bytes(mla_dtype q) { return q == MLA_DTYPE_BF16 ? 2 * DQK : DQK; }

static double fp8_value(mla_dtype d, uint8_t bits) {
    return d == MLA_DTYPE_FP8_E4M3 ? ref_fp8_e4m3(bits) : ref_fp8_e4m3_fnuz(bits);
}

static uint16_t load_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, sizeof v); /* little-endian host, as the library */
    return v;
}

void ref_decode_kv_row(mla_dtype kv, const uint8_t *row, const uint8_t *scales, float kv_scale, double *dst) {
    const double scale = kv_scale == 0.0f ? 1.0 : (double)kv_scale;
    int e;
    switch (kv) {
        case MLA_DTYPE_BF16:
            for (e = 0; e < DQK; ++e) dst[e] = ref_bf16(load_u16(row + 2 * e));
            break;
        case MLA_DTYPE_FP8_E4M3:
        case MLA_DTYPE_FP8_E4M3_FNUZ:
            /* The fp8 x float product is exact in double; rounding it to float
             * reproduces the library's float32 dequantization. */
            for (e = 0; e < DQK; ++e) dst[e] = (double)(float)(fp8_value(kv, row[e]) * scale);
            break;
        case MLA_DTYPE_MXFP4:
            for (e = 0; e < DQK; ++e) {
                const unsigned byte = row[e / 2];
                const unsigned nibble = (e % 2 == 0) ? (byte & 0xfu) : (byte >> 4);
                dst[e] = ref_e2m1(nibble) * ref_e8m0(scales[e / MLA_MXFP4_BLOCK]);
            }
            break;
        default:
            for (e = 0; e < DQK; ++e) dst[e] = NAN;
    }
}

void ref_decode_q_row(mla_dtype q, const uint8_t *row, float q_scale, double *dst) {
    const double scale = q_scale == 0.0f ? 1.0 : (double)q_scale;
    int e;
    if (q == MLA_DTYPE_BF16) {
        for (e = 0; e < DQK; ++e) dst[e] = ref_bf16(load_u16(row + 2 * e));
    } else if (q == MLA_DTYPE_FP8_E4M3 || q == MLA_DTYPE_FP8_E4M3_FNUZ) {
        for (e = 0; e < DQK; ++e) dst[e] = (double)(float)(fp8_value(q, row[e]) * scale);
    } else {
        for (e = 0; e < DQK; ++e) dst[e] = NAN;
    }
}

int ref_total_q(const ref_problem *p) { return p->qo_indptr[p->batch_size]; }

/* Four partial sums: the reference is on the test's critical path. */
static double dot(const double *a, const double *b, int n) {
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int i;
    for (i = 0; i + 4 <= n; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    for (; i < n; ++i) s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}

static int has_nan(const double *v, int n) {
    int i;
    for (i = 0; i < n; ++i)
        if (isnan(v[i])) return 1;
    return 0;
}

int ref_attention(const ref_problem *p, double *out, double *lse, double *vmax, double *smag) {
    const int H = p->num_heads, ps = p->page_size;
    const double sm = p->sm_scale == 0.0f ? (double)(1.0f / sqrtf((float)DQK)) : (double)p->sm_scale;
    const double cap = (double)p->logit_cap;
    const size_t kv_row = ref_kv_row_bytes(p->kv_dtype), q_row = ref_q_row_bytes(p->q_dtype);
    const int stride = p->kv_scale_stride == 0 ? MLA_MXFP4_SCALES_PER_ROW : p->kv_scale_stride;
    const uint8_t *kv = (const uint8_t *)p->kv, *q = (const uint8_t *)p->q;
    double *K = NULL, *prefix_vmax = NULL, *prefix_knorm = NULL, *s = NULL, qv[DQK];
    size_t cap_rows = 0;
    int status = 0, b;

    if (kv_row == 0 || ps < 1 || H < 1) return -1;
    for (b = 0; b < p->batch_size && status == 0; ++b) {
        const int q0 = p->qo_indptr[b], n = p->qo_indptr[b + 1] - q0;
        const int p0 = p->kv_indptr[b], pages = p->kv_indptr[b + 1] - p0;
        int L, j, i, h;
        if (n < 0 || pages < 0) { status = -1; break; }
        if (n == 0) continue;
        if (pages == 0) {
            L = 0;
        } else {
            const int last = p->kv_last_page_len ? p->kv_last_page_len[b] : ps;
            if (last < 1 || last > ps) { status = -1; break; }
            L = (pages - 1) * ps + last;
        }
        if ((size_t)L > cap_rows) {
            free(K);
            free(prefix_vmax);
            free(prefix_knorm);
            free(s);
            cap_rows = (size_t)L;
            K = (double *)malloc(cap_rows * DQK * sizeof *K);
            prefix_vmax = (double *)malloc(cap_rows * sizeof *prefix_vmax);
            prefix_knorm = (double *)malloc(cap_rows * sizeof *prefix_knorm);
            s = (double *)malloc(cap_rows * sizeof *s);
            if (!K || !prefix_vmax || !prefix_knorm || !s) { status = -1; break; }
        }
        /* Gather and decode the sequence's L rows through its page table. */
        for (j = 0; j < L; ++j) {
            const int slot = p0 + j / ps;
            const long long page = p->kv_indices ? p->kv_indices[slot] : slot;
            const long long row = page * ps + j % ps;
            const uint8_t *sc = p->kv_block_scales ? p->kv_block_scales + (size_t)row * (size_t)stride : NULL;
            double m = j > 0 ? prefix_vmax[j - 1] : 0.0;
            int d;
            if (p->kv_dtype == MLA_DTYPE_MXFP4 && !sc) { status = -1; break; }
            ref_decode_kv_row(p->kv_dtype, kv + (size_t)row * kv_row, sc, p->kv_scale, K + (size_t)j * DQK);
            if (has_nan(K + (size_t)j * DQK, DQK)) { status = -1; break; }
            for (d = 0; d < DV; ++d) m = fmax(m, fabs(K[(size_t)j * DQK + d]));
            prefix_vmax[j] = m;
            {
                const double kn = sqrt(dot(K + (size_t)j * DQK, K + (size_t)j * DQK, DQK));
                prefix_knorm[j] = j > 0 ? fmax(prefix_knorm[j - 1], kn) : kn;
            }
        }
        if (status) break;

        for (i = 0; i < n; ++i) {
            /* Query token i sees keys j <= L - n + i. */
            const int visible = L - n + i + 1;
            for (h = 0; h < H; ++h) {
                const size_t r = (size_t)(q0 + i) * (size_t)H + (size_t)h;
                double *o = out + r * DV;
                double mx = -INFINITY, sum = 0.0;
                int d;
                for (d = 0; d < DV; ++d) o[d] = 0.0;
                if (visible <= 0) {
                    lse[r] = -INFINITY;
                    if (vmax) vmax[r] = 0.0;
                    if (smag) smag[r] = 0.0;
                    continue;
                }
                ref_decode_q_row(p->q_dtype, q + r * q_row, p->q_scale, qv);
                if (has_nan(qv, DQK)) { status = -1; break; }
                for (j = 0; j < visible; ++j) {
                    double v = sm * dot(qv, K + (size_t)j * DQK, DQK);
                    if (cap > 0.0) v = cap * tanh(v / cap);
                    s[j] = v;
                    if (v > mx) mx = v;
                }
                for (j = 0; j < visible; ++j) {
                    const double w = exp(s[j] - mx);
                    const double *v = K + (size_t)j * DQK;
                    sum += w;
                    for (d = 0; d < DV; ++d) o[d] += w * v[d];
                }
                for (d = 0; d < DV; ++d) o[d] /= sum;
                lse[r] = mx + log(sum);
                if (vmax) vmax[r] = prefix_vmax[visible - 1];
                if (smag) smag[r] = sm * sqrt(dot(qv, qv, DQK)) * prefix_knorm[visible - 1];
            }
            if (status) break;
        }
    }
    free(K);
    free(prefix_vmax);
    free(prefix_knorm);
    free(s);
    return status;
}
