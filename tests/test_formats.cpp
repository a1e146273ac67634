// The packed decoders of src/formats_packed.h (the GPU kernels' tile staging)
// against the scalar decoders of src/formats.h, exhaustively on the host:
//   fp8x4      every OCP E4M3 / FNUZ code at every byte position of a word,
//              among random neighbours
//   e2m1x8     every byte (two E2M1 codes) at every position, times every
//              E8M0 scale 0..255 (subnormal results, overflow to inf, NaN),
//              and with a second, random scale on one half of the nibbles
//   f16        float <-> f16 (every code, every rounding tie) and E4M3 -> f16
//   byte_perm  the host emulation of the GPU's byte permute
// Results must equal float_to_bf16(scalar value) bitwise; NaN codes must give
// a NaN. The device-only instruction paths (cvt / bf16x2 fma) are checked on
// the GPU by tests/test_gpu.cpp (decoding_exact).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <cstdio>
#include <random>

#include "formats_packed.h"

namespace {

bool is_nan_bf16(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0; }

uint16_t half(uint32_t w, int i) { return uint16_t(i ? w >> 16 : w & 0xffffu); }

// Expected bf16 of a float that is exactly a bf16 value (or inf / NaN).
void expect_bf16(uint16_t got, float want, const char *what, unsigned code, int pos, unsigned scale) {
    const uint16_t w = mla::float_to_bf16(want);
    const bool ok = is_nan_bf16(w) ? is_nan_bf16(got) : got == w;
    if (!ok) {
        std::printf("%s: code 0x%02x at position %d, scale %u: got 0x%04x, want 0x%04x (%g)\n", what, code, pos, scale,
                    got, w, double(want));
        fail();
    }
}

template <int KV>
void check_fp8(float (*scalar)(uint8_t), const char *what) {
    std::mt19937 rng(0x6670u + unsigned(KV));
    for (int pos = 0; pos < 4; ++pos)
        for (unsigned code = 0; code < 256; ++code)
            for (int trial = 0; trial < 8; ++trial) {
                uint32_t w = uint32_t(rng());
                w = (w & ~(0xffu << (8 * pos))) | (code << (8 * pos));
                const mla::Bf16x4 r = mla::fp8x4_to_bf16x4<KV>(w);
                for (int i = 0; i < 4; ++i) {
                    const unsigned c = (w >> (8 * i)) & 0xffu;
                    expect_bf16(half(r.w[i / 2], i % 2), scalar(uint8_t(c)), what, c, i, 0);
                }
            }
}

void test_fp8_e4m3(void **) { check_fp8<MLA_DTYPE_FP8_E4M3>(mla::fp8_e4m3_to_float, "e4m3"); }
void test_fp8_e4m3_fnuz(void **) { check_fp8<MLA_DTYPE_FP8_E4M3_FNUZ>(mla::fp8_e4m3_fnuz_to_float, "e4m3 fnuz"); }

// Both E2M1 paths (the tiny form of NVIDIA and the host, the table of AMD),
// every code at every nibble position under every E8M0 scale.
void check_e2m1x8(mla::Bf16x8 (*decode)(uint32_t, uint8_t), const char *what) {
    std::mt19937 rng(0x6532u);
    for (unsigned scale = 0; scale < 256; ++scale)
        for (int pos = 0; pos < 4; ++pos)
            for (unsigned byte = 0; byte < 256; ++byte) {
                uint32_t w = uint32_t(rng());
                w = (w & ~(0xffu << (8 * pos))) | (byte << (8 * pos));
                const mla::Bf16x8 r = decode(w, uint8_t(scale));
                for (int i = 0; i < 8; ++i) {
                    const unsigned nibble = (w >> (4 * i)) & 0xfu;
                    const float want = mla::e2m1_to_float(nibble) * mla::e8m0_to_float(uint8_t(scale));
                    expect_bf16(half(r.w[i / 2], i % 2), want, what, nibble, i, scale);
                }
            }
}

void test_e2m1x8(void **) {
    check_e2m1x8(mla::e2m1x8_to_bf16x8_by_tiny, "e2m1 tiny");
    check_e2m1x8(mla::e2m1x8_to_bf16x8_by_table, "e2m1 table");
}

// f16: every code round-trips through float; floats between neighbouring
// f16 values round to nearest even; every E4M3 code decodes exactly.
void test_f16(void **) {
    for (uint32_t h = 0; h < 0x10000u; ++h) {
        const float f = mla::f16_to_float(uint16_t(h));
        const bool nan = (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
        const uint16_t back = mla::float_to_f16_rn(f);
        if (nan ? ((back & 0x7c00u) != 0x7c00u || (back & 0x3ffu) == 0) : back != h) {
            std::printf("f16 0x%04x -> %g -> 0x%04x\n", h, double(f), back);
            fail();
        }
        // Halfway to the next code up (same sign): ties go to the even code.
        if (nan || (h & 0x7fffu) >= 0x7bffu) continue;
        const float next = mla::f16_to_float(uint16_t(h + 1)), mid = 0.5f * (f + next);
        const uint16_t want = (h & 1u) ? uint16_t(h + 1) : uint16_t(h);
        if (mla::float_to_f16_rn(mid) != want) {
            std::printf("f16 tie between 0x%04x and 0x%04x: got 0x%04x\n", h, h + 1, mla::float_to_f16_rn(mid));
            fail();
        }
    }
    assert_int_equal(mla::float_to_f16_rn(65504.0f), 0x7bffu);
    assert_int_equal(mla::float_to_f16_rn(65519.0f), 0x7bffu);
    assert_int_equal(mla::float_to_f16_rn(65520.0f), 0x7c00u);
    assert_int_equal(mla::float_to_f16_rn(-1e30f), 0xfc00u);
    for (unsigned code = 0; code < 256; ++code) {
        const float want = mla::fp8_e4m3_to_float(uint8_t(code));
        const mla::F16x4 r = mla::e4m3x4_to_f16x4(code | (code << 24));
        for (int i : {0, 3}) {
            const float got = mla::f16_to_float(half(r.w[i / 2], i % 2));
            if (want != want ? got == got : got != want) {
                std::printf("e4m3 0x%02x -> f16 %g, want %g\n", code, double(got), double(want));
                fail();
            }
        }
    }
}

void test_byte_perm(void **) {
    const uint32_t lo = 0x33221100u, hi = 0x77665544u;
    assert_int_equal(mla::byte_perm(lo, hi, 0x3210u), lo);
    assert_int_equal(mla::byte_perm(lo, hi, 0x7654u), hi);
    assert_int_equal(mla::byte_perm(lo, hi, 0x0123u), 0x00112233u);
    assert_int_equal(mla::byte_perm(lo, hi, 0x5140u), 0x55114400u);
    assert_int_equal(mla::byte_perm(lo, hi, 0x76543210u), lo);  // selectors above bit 15 are ignored
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_e4m3),
        cmocka_unit_test(test_fp8_e4m3_fnuz),
        cmocka_unit_test(test_e2m1x8),
        cmocka_unit_test(test_f16),
        cmocka_unit_test(test_byte_perm),
    };
    return cmocka_run_group_tests_name("formats", tests, nullptr, nullptr);
}
