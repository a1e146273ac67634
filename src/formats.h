// Element formats of DESIGN §2: bf16, FP8 E4M3 (OCP and FNUZ), MXFP4
// (E2M1 + E8M0). Decoders are bit manipulation only, so the same code runs on
// the host (CPU backend, tests) and inside GPU kernels.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "hd.h"
#include "mla.h"

namespace mla {

MLA_HD float bits_to_float(uint32_t bits) {
#if defined(MLA_GPU_COMPILER) && (defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__))
    return __uint_as_float(bits);
#else
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
#endif
}

MLA_HD uint32_t float_to_bits(float f) {
#if defined(MLA_GPU_COMPILER) && (defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__))
    return __float_as_uint(f);
#else
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return bits;
#endif
}

MLA_HD float bf16_to_float(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }

// Round to nearest even; NaN stays a (quiet) NaN.
MLA_HD uint16_t float_to_bf16(float f) {
    uint32_t bits = float_to_bits(f);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return uint16_t(bits >> 16);
}

// IEEE binary16 (f16), for the warpgroup-MMA kernels' operands: float ->
// f16 rounded to nearest even (subnormals kept, overflow to inf), and back.
MLA_HD uint16_t float_to_f16_rn(float f) {
    const uint32_t x = float_to_bits(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return uint16_t(sign | 0x7e00u);   // NaN
    if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds past 65504: inf
    if (ax < 0x38800000u) {                                   // below 2^-14: a multiple of 2^-24
        const float v = bits_to_float(ax) * 16777216.0f;      // exact
        uint32_t q = uint32_t(v);
        const float frac = v - float(q);
        if (frac > 0.5f || (frac == 0.5f && (q & 1u))) ++q;
        return uint16_t(sign | q);
    }
    uint32_t h = (ax - 0x38000000u) >> 13;  // exponent rebased 127 -> 15, 10 mantissa bits
    const uint32_t rest = ax & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return uint16_t(sign | h);
}

MLA_HD float f16_to_float(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0) return (sign ? -1.0f : 1.0f) * float(man) * 5.9604644775390625e-08f;  // 2^-24
    if (exp == 31) return bits_to_float(sign | 0x7f800000u | (man << 13));
    return bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
}

// OCP E4M3 ("e4m3fn"): bias 7, no infinities, S.1111.111 is NaN, max 448.
MLA_HD float fp8_e4m3_to_float(uint8_t v) {
    const uint32_t sign = uint32_t(v & 0x80u) << 24;
    const uint32_t exp = (v >> 3) & 0xfu;
    const uint32_t man = v & 0x7u;
    if (exp == 0xfu && man == 0x7u) return bits_to_float(0x7fc00000u | sign);
    if (exp == 0) return (sign ? -1.0f : 1.0f) * float(man) * (1.0f / 512.0f);
    return bits_to_float(sign | ((exp + 120u) << 23) | (man << 20));
}

// E4M3 FNUZ (AMD gfx942): bias 8, no infinities, no negative zero: 0x80 is NaN.
MLA_HD float fp8_e4m3_fnuz_to_float(uint8_t v) {
    if (v == 0x80u) return bits_to_float(0x7fc00000u);
    const uint32_t sign = uint32_t(v & 0x80u) << 24;
    const uint32_t exp = (v >> 3) & 0xfu;
    const uint32_t man = v & 0x7u;
    if (exp == 0) return (sign ? -1.0f : 1.0f) * float(man) * (1.0f / 1024.0f);
    return bits_to_float(sign | ((exp + 119u) << 23) | (man << 20));
}

// E2M1 nibble: magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}, bit 3 is the sign.
MLA_HD float e2m1_to_float(uint32_t nibble) {
    const uint32_t mag = nibble & 0x7u;
    // Magnitude times two is {0,1,2,3,4,6,8,12}: build it without a table.
    const float twice = mag < 4 ? float(mag) : float(4u << ((mag - 4u) >> 1)) * ((mag & 1u) ? 1.5f : 1.0f);
    const float value = 0.5f * twice;
    return (nibble & 0x8u) ? -value : value;
}

// E8M0 scale: 2^(e - 127); 255 is NaN.
MLA_HD float e8m0_to_float(uint8_t e) {
    if (e == 0xffu) return bits_to_float(0x7fc00000u);
    if (e == 0) return bits_to_float(0x00400000u);  // 2^-127, a float subnormal
    return bits_to_float(uint32_t(e) << 23);
}

// The NaN rule (docs/reliability.md): a non-finite element of a visible key
// or of q makes that row NaN. A dot product over such an element is NaN or
// +-inf; an inf score must not pass as a large or vanishing weight (a -inf
// one would give the key weight 0 and leave most of the row finite), so
// scores go through this before the logit cap and the mask: 0 * inf is NaN,
// 0 * finite is 0. One multiply-add, no branch.
MLA_HD float score_nonfinite_to_nan(float s) { return s + 0.0f * s; }

// The logit cap (DESIGN §1): cap * tanh(s / cap), applied where cap > 0.
MLA_HD float capped_score(float s, float cap) { return cap * tanhf(s / cap); }

// The larger of two split LSEs, NaN winning (the same rule when splits are
// merged: a split that met a non-finite key makes the merged row NaN).
MLA_HD float max_nan_wins(float a, float b) { return a > b || a != a ? a : b; }

// Bytes of one stored KV row (the separate MXFP4 scales not counted).
MLA_HD int kv_row_bytes(mla_dtype kv) {
    switch (kv) {
        case MLA_DTYPE_BF16: return MLA_HEAD_DIM_QK * 2;
        case MLA_DTYPE_FP8_E4M3:
        case MLA_DTYPE_FP8_E4M3_FNUZ: return MLA_HEAD_DIM_QK;
        case MLA_DTYPE_MXFP4: return MLA_HEAD_DIM_QK / 2;
        default: return 0;
    }
}

// Bytes of one Q element row of 576 values.
MLA_HD int q_row_bytes(mla_dtype q) {
    return q == MLA_DTYPE_BF16 ? MLA_HEAD_DIM_QK * 2 : MLA_HEAD_DIM_QK;
}

// Decode elements [first, first + count) of one KV row into float, applying
// the per-tensor scale (fp8) or the per-block E8M0 scales (mxfp4).
inline void decode_kv_row(mla_dtype kv, const uint8_t *row, const uint8_t *block_scales, float kv_scale,
                          int first, int count, float *dst) {
    switch (kv) {
        case MLA_DTYPE_BF16: {
            const uint16_t *p = reinterpret_cast<const uint16_t *>(row);
            for (int i = 0; i < count; ++i) dst[i] = bf16_to_float(p[first + i]);
            break;
        }
        case MLA_DTYPE_FP8_E4M3:
            for (int i = 0; i < count; ++i) dst[i] = fp8_e4m3_to_float(row[first + i]) * kv_scale;
            break;
        case MLA_DTYPE_FP8_E4M3_FNUZ:
            for (int i = 0; i < count; ++i) dst[i] = fp8_e4m3_fnuz_to_float(row[first + i]) * kv_scale;
            break;
        case MLA_DTYPE_MXFP4:
            for (int i = 0; i < count; ++i) {
                const int e = first + i;
                const uint32_t byte = row[e >> 1];
                const uint32_t nibble = (e & 1) ? (byte >> 4) : (byte & 0xfu);
                dst[i] = e2m1_to_float(nibble) * e8m0_to_float(block_scales[e / MLA_MXFP4_BLOCK]);
            }
            break;
        default:
            for (int i = 0; i < count; ++i) dst[i] = 0.0f;
    }
}

// Decode one Q row of 576 elements into float, times q_scale for fp8.
inline void decode_q_row(mla_dtype q, const uint8_t *row, float q_scale, float *dst) {
    if (q == MLA_DTYPE_BF16) {
        const uint16_t *p = reinterpret_cast<const uint16_t *>(row);
        for (int i = 0; i < MLA_HEAD_DIM_QK; ++i) dst[i] = bf16_to_float(p[i]);
    } else if (q == MLA_DTYPE_FP8_E4M3) {
        for (int i = 0; i < MLA_HEAD_DIM_QK; ++i) dst[i] = fp8_e4m3_to_float(row[i]) * q_scale;
    } else {
        for (int i = 0; i < MLA_HEAD_DIM_QK; ++i) dst[i] = fp8_e4m3_fnuz_to_float(row[i]) * q_scale;
    }
}

}  // namespace mla
