// Packed decoders: one 32-bit word of fp8 or E2M1 codes to bf16 pairs, as the
// GPU kernels stage KV and Q tiles in shared memory. Every result is bitwise
// float_to_bf16(scalar decoder of formats.h), NaN codes give a NaN: fp8 and
// E2M1 values are bf16 values, and an E8M0 scale is an exact power-of-two
// multiply (overflow gives inf, as in float).
//
// The portable paths here run on the host too, where tests/test_formats.cpp
// checks them exhaustively against the scalar decoders; on NVIDIA sm_89+ the
// OCP fp8 pairs go through cvt.rn.f16x2.e4m3x2 and sm_80+ applies E8M0 scales
// with one or two bf16x2 fmas (both exact; tests/test_gpu.cpp's
// decoding_exact checks every code and the scale edges on the device).
#pragma once

#include <stdint.h>

#include "formats.h"

namespace mla {

struct Bf16x4 {
    uint32_t w[2];  // elements 2i (low half) and 2i + 1 (high half) in w[i]
};
struct Bf16x8 {
    uint32_t w[4];
};
struct F16x4 {
    uint32_t w[2];  // f16 elements 2i, 2i + 1 in w[i]
};

#if MLA_DEVICE_PASS && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define MLA_HAVE_CVT_E4M3X2 1
#endif
#if MLA_DEVICE_PASS && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define MLA_HAVE_FMA_BF16X2 1
#endif

// Byte i of the result is byte (sel >> 4i) & 7 of the 8 bytes hi:lo (CUDA's
// __byte_perm with the selectors' sign bits clear).
MLA_HD uint32_t byte_perm(uint32_t lo, uint32_t hi, uint32_t sel) {
#if MLA_DEVICE_PASS
    return __byte_perm(lo, hi, sel);
#else
    const uint64_t bytes = (uint64_t(hi) << 32) | lo;
    uint32_t r = 0;
    for (int i = 0; i < 4; ++i) r |= uint32_t((bytes >> (8 * ((sel >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
    return r;
#endif
}

// Two floats -> a bf16 pair rounded to nearest even (lo in the low half).
MLA_HD uint32_t pack_bf16x2_rn(float lo, float hi) {
#if defined(MLA_HAVE_FMA_BF16X2)
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return uint32_t(float_to_bf16(lo)) | (uint32_t(float_to_bf16(hi)) << 16);
#endif
}

// Two floats -> an f16 pair rounded to nearest even (lo in the low half).
MLA_HD uint32_t pack_f16x2_rn(float lo, float hi) {
#if defined(MLA_HAVE_FMA_BF16X2)
    uint32_t r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return uint32_t(float_to_f16_rn(lo)) | (uint32_t(float_to_f16_rn(hi)) << 16);
#endif
}

// Two floats that are bf16 values (or NaN) -> a bf16 pair, by truncation.
MLA_HD uint32_t pack_exact_bf16x2(float lo, float hi) {
    return (float_to_bits(lo) >> 16) | (float_to_bits(hi) & 0xffff0000u);
}

// fp8 byte -> float without branches: the magnitude bits go into a float
// whose exponent an exact power-of-two multiply then rebases (subnormal fp8
// values become float subnormals first; no flush-to-zero in this code).
template <int KV>
MLA_HD float fp8_to_float_branchless(uint32_t v) {
    const float mag = bits_to_float((v & 0x7fu) << 20) *
                      (KV == MLA_DTYPE_FP8_E4M3 ? 1.329227995784916e36f /* 2^120 */ : 6.646139978924579e35f /* 2^119 */);
    const bool nan = KV == MLA_DTYPE_FP8_E4M3 ? (v & 0x7fu) == 0x7fu : v == 0x80u;
    const float r = (v & 0x80u) ? -mag : mag;
    return nan ? bits_to_float(0x7fc00000u) : r;
}

// Two OCP E4M3 codes (low byte = element 0) -> bf16 pair.
MLA_HD uint32_t e4m3x2_to_bf16x2(uint32_t codes) {
#if defined(MLA_HAVE_CVT_E4M3X2)
    uint32_t r;
    asm("{\n\t.reg .b32 h;\n\t.reg .b16 h0, h1;\n\t.reg .f32 f0, f1;\n\t"
        "cvt.rn.f16x2.e4m3x2 h, %1;\n\t"
        "mov.b32 {h0, h1}, h;\n\t"
        "cvt.f32.f16 f0, h0;\n\tcvt.f32.f16 f1, h1;\n\t"
        "cvt.rn.bf16x2.f32 %0, f1, f0;\n\t}"
        : "=r"(r)
        : "h"(uint16_t(codes)));
    return r;
#else
    return pack_exact_bf16x2(fp8_to_float_branchless<MLA_DTYPE_FP8_E4M3>(codes & 0xffu),
                             fp8_to_float_branchless<MLA_DTYPE_FP8_E4M3>((codes >> 8) & 0xffu));
#endif
}

// Two OCP E4M3 codes (low byte = element 0) -> f16 pair (exact: every E4M3
// value is an f16 value): one cvt on sm_89+.
MLA_HD uint32_t e4m3x2_to_f16x2(uint32_t codes) {
#if defined(MLA_HAVE_CVT_E4M3X2)
    uint32_t r;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(uint16_t(codes)));
    return r;
#else
    return pack_f16x2_rn(fp8_to_float_branchless<MLA_DTYPE_FP8_E4M3>(codes & 0xffu),
                         fp8_to_float_branchless<MLA_DTYPE_FP8_E4M3>((codes >> 8) & 0xffu));
#endif
}

// Four OCP E4M3 codes (byte i = element i) -> four f16.
MLA_HD F16x4 e4m3x4_to_f16x4(uint32_t codes) {
    F16x4 r;
    r.w[0] = e4m3x2_to_f16x2(codes & 0xffffu);
    r.w[1] = e4m3x2_to_f16x2(codes >> 16);
    return r;
}

// Four fp8 codes (byte i = element i) -> four bf16.
template <int KV>
MLA_HD Bf16x4 fp8x4_to_bf16x4(uint32_t codes) {
    Bf16x4 r;
    if (KV == MLA_DTYPE_FP8_E4M3) {
        r.w[0] = e4m3x2_to_bf16x2(codes & 0xffffu);
        r.w[1] = e4m3x2_to_bf16x2(codes >> 16);
    } else {
        r.w[0] = pack_exact_bf16x2(fp8_to_float_branchless<KV>(codes & 0xffu),
                                   fp8_to_float_branchless<KV>((codes >> 8) & 0xffu));
        r.w[1] = pack_exact_bf16x2(fp8_to_float_branchless<KV>((codes >> 16) & 0xffu),
                                   fp8_to_float_branchless<KV>(codes >> 24));
    }
    return r;
}

// Eight E2M1 nibbles (nibble i = element i) -> eight unscaled bf16. The
// magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6} are bf16 0x0000, 0x3f00, 0x3f80,
// 0x3fc0, 0x4000, 0x4040, 0x4080, 0x40c0: two 8-entry byte tables (high and
// low bytes) looked up four nibbles at a time, interleaved into pairs, and
// each nibble's bit 3 moved to its bf16 sign bit.
MLA_HD Bf16x8 e2m1x8_to_bf16x8_unscaled(uint32_t codes) {
    constexpr uint32_t kHighLo = 0x3f3f3f00u, kHighHi = 0x40404040u;  // high bytes of magnitudes 0-3, 4-7
    constexpr uint32_t kLowLo = 0xc0800000u, kLowHi = 0xc0804000u;    // low bytes
    const uint32_t mag = codes & 0x77777777u;
    const uint32_t hi03 = byte_perm(kHighLo, kHighHi, mag), lo03 = byte_perm(kLowLo, kLowHi, mag);
    const uint32_t hi47 = byte_perm(kHighLo, kHighHi, mag >> 16), lo47 = byte_perm(kLowLo, kLowHi, mag >> 16);
    // byte j of `even` / `odd`: bit 7 = sign of nibble 2j / 2j + 1
    const uint32_t even = (codes << 4) & 0x80808080u, odd = codes & 0x80808080u;
    Bf16x8 r;
    r.w[0] = byte_perm(lo03, hi03, 0x5140u) | (byte_perm(even, odd, 0x4000u) & 0x80008000u);
    r.w[1] = byte_perm(lo03, hi03, 0x7362u) | (byte_perm(even, odd, 0x5111u) & 0x80008000u);
    r.w[2] = byte_perm(lo47, hi47, 0x5140u) | (byte_perm(even, odd, 0x6222u) & 0x80008000u);
    r.w[3] = byte_perm(lo47, hi47, 0x7362u) | (byte_perm(even, odd, 0x7333u) & 0x80008000u);
    return r;
}

// Eight bf16 E2M1 values times any E8M0 scale, in float (the table path's
// scale: AMD, where a bf16 subnormal may not survive the multiply).
MLA_HD void scale_exact(Bf16x8 &r, uint8_t e) {
    const float scale = e8m0_to_float(e);
    for (int i = 0; i < 4; ++i)
        r.w[i] = pack_exact_bf16x2(bits_to_float(r.w[i] << 16) * scale, bits_to_float(r.w[i] & 0xffff0000u) * scale);
}

// Eight E2M1 nibbles -> eight bf16 of value x 2^-126 ("tiny"): the nibble's
// sign becomes the bf16 sign, its two exponent bits the low two bits of the
// bf16 exponent and its mantissa bit the top mantissa bit, which is the
// E2M1 value x 2^-126 for every code (exponent 0: the bf16 subnormal
// m/2 x 2^-126). Multiplies by 2^(e - 1) then apply E8M0 scale e
// (scale_tiny). Per pair (elements 2j, 2j + 1): one byte permute
// puts nibble 2j at bits 12-15 (byte j of codes << 4) and nibble 2j + 1 at
// bits 28-31 (byte j of codes), one shift by 6 moves the exponent and
// mantissa bits into place and two masks keep them and the signs: four
// instructions a pair instead of the table's six.
MLA_HD Bf16x8 e2m1x8_to_bf16x8_tiny(uint32_t codes) {
    const uint32_t shifted = codes << 4;
    Bf16x8 r;
    for (int j = 0; j < 4; ++j) {
        // bytes 0, 1 <- byte j of `shifted`, bytes 2, 3 <- byte j of `codes`
        const uint32_t x = byte_perm(codes, shifted, 0x0044u + 0x1111u * uint32_t(j));
        r.w[j] = ((x >> 6) & 0x01c001c0u) | (x & 0x80008000u);
    }
    return r;
}

// The bf16x2 power of two 2^(e - 127) of E8M0 scale e (255: NaN).
MLA_HD uint32_t e8m0_bf16x2(uint8_t e) {
    const uint32_t s = e == 0xffu ? 0x7fc0u : uint32_t(e) << 7;
    return s | (s << 16);
}

// The two multipliers that put E8M0 scale e on tiny E2M1 values: 2^(e - 1)
// and 1 where 2^(e - 1) is a bf16 normal (e <= 128), else 2^126 and
// 2^(e - 127) (NaN for e = 255). Always two multiplies: a branch on the
// scale's kind diverged in nearly every warp (scales on both sides of 2^1
// in one warp's units) and ran both paths (docs/performance.md, v12).
MLA_HD uint32_t e8m0_tiny_first(uint8_t e) {
    const uint32_t s = (e <= 128 ? uint32_t(e) + 126u : 253u) << 7;
    return s | (s << 16);
}
MLA_HD uint32_t e8m0_tiny_second(uint8_t e) { return e <= 128 ? 0x3f803f80u : e8m0_bf16x2(e); }

// Eight bf16 times a bf16x2 power of two m2 (equal halves) where every
// product is a bf16 or overflows: one bf16x2 fma with -0 a pair on sm_80+
// (exact for subnormal inputs and results; -0 keeps the sign of zeros), a
// float multiply on the host.
MLA_HD void mul_bf16x8_pow2(Bf16x8 &r, uint32_t m2) {
#if defined(MLA_HAVE_FMA_BF16X2)
    const uint32_t neg_zero2 = 0x80008000u;
#pragma unroll
    for (int i = 0; i < 4; ++i)
        asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r.w[i]) : "r"(r.w[i]), "r"(m2), "r"(neg_zero2));
#else
    const float m = bits_to_float(m2 << 16);
    for (int i = 0; i < 4; ++i)
        r.w[i] = pack_exact_bf16x2(bits_to_float(r.w[i] << 16) * m, bits_to_float(r.w[i] & 0xffff0000u) * m);
#endif
}

// Tiny E2M1 values times E8M0 scale e.
MLA_HD void scale_tiny(Bf16x8 &r, uint8_t e) {
    mul_bf16x8_pow2(r, e8m0_tiny_first(e));
    mul_bf16x8_pow2(r, e8m0_tiny_second(e));
}

// Where MXFP4 decodes through the tiny form: wherever the multiply keeps
// bf16 subnormals exact (sm_80+'s bf16x2 fma, the host's float); AMD's
// device code takes the table and a float scale.
#if defined(MLA_HAVE_FMA_BF16X2) || !MLA_DEVICE_PASS
#define MLA_E2M1_TINY 1
#endif

// Eight E2M1 nibbles times one E8M0 scale 2^(e - 127) -> eight bf16, by
// either path (both are checked exhaustively on the host).
MLA_HD Bf16x8 e2m1x8_to_bf16x8_by_table(uint32_t codes, uint8_t e) {
    Bf16x8 r = e2m1x8_to_bf16x8_unscaled(codes);
    scale_exact(r, e);
    return r;
}
MLA_HD Bf16x8 e2m1x8_to_bf16x8_by_tiny(uint32_t codes, uint8_t e) {
    Bf16x8 r = e2m1x8_to_bf16x8_tiny(codes);
    scale_tiny(r, e);
    return r;
}
MLA_HD Bf16x8 e2m1x8_to_bf16x8(uint32_t codes, uint8_t e) {
#if defined(MLA_E2M1_TINY)
    return e2m1x8_to_bf16x8_by_tiny(codes, e);
#else
    return e2m1x8_to_bf16x8_by_table(codes, e);
#endif
}

}  // namespace mla
