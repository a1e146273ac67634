/* Checks of the test infrastructure itself: the reference's decoders against
 * values worked out by hand from the format definitions, the random
 * generators, and the reference attention on tiny problems whose answer is
 * known in closed form. If these fail, nothing else in the suite means much. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "reference.h"
#include "testutil.h"

static void test_bf16_decoder(void **state) {
    (void)state;
    assert_true(ref_bf16(0x3f80) == 1.0);
    assert_true(ref_bf16(0xc000) == -2.0);
    assert_true(ref_bf16(0x3fc0) == 1.5);
    assert_true(ref_bf16(0x0000) == 0.0);
    assert_true(ref_bf16(0x0001) == ldexp(1.0, -133)); /* smallest subnormal */
    assert_true(ref_bf16(0x0080) == ldexp(1.0, -126)); /* smallest normal */
    assert_true(isinf(ref_bf16(0x7f80)) && ref_bf16(0x7f80) > 0);
    assert_true(isnan(ref_bf16(0xffff)));
    assert_true(isnan(ref_bf16(0x7fc0)));
    /* agrees with the helper's conversion for every finite code */
    for (unsigned h = 0; h < 0x10000u; ++h) {
        const double r = ref_bf16((uint16_t)h);
        if (isnan(r)) continue;
        assert_true(r == (double)tu_bf16_to_float((uint16_t)h));
    }
}

static void test_bf16_rounding(void **state) {
    (void)state;
    assert_int_equal(tu_float_to_bf16(1.0f), 0x3f80);
    assert_int_equal(tu_float_to_bf16(1.0f + 0x1p-8f), 0x3f80);        /* tie -> even */
    assert_int_equal(tu_float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);    /* tie -> even (up) */
    assert_int_equal(tu_float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81); /* above tie */
    assert_int_equal(tu_float_to_bf16(-2.0f), 0xc000);
    assert_true((tu_float_to_bf16(NAN) & 0x7fff) > 0x7f80);
}

static void test_fp8_e4m3_decoder(void **state) {
    (void)state;
    assert_true(ref_fp8_e4m3(0x00) == 0.0);
    assert_true(ref_fp8_e4m3(0x80) == 0.0 && signbit(ref_fp8_e4m3(0x80)));
    assert_true(ref_fp8_e4m3(0x01) == ldexp(1.0, -9)); /* smallest subnormal */
    assert_true(ref_fp8_e4m3(0x07) == 7 * ldexp(1.0, -9));
    assert_true(ref_fp8_e4m3(0x08) == ldexp(1.0, -6)); /* smallest normal */
    assert_true(ref_fp8_e4m3(0x38) == 1.0);
    assert_true(ref_fp8_e4m3(0x3c) == 1.5);
    assert_true(ref_fp8_e4m3(0xc0) == -2.0);
    assert_true(ref_fp8_e4m3(0x7e) == 448.0); /* max */
    assert_true(ref_fp8_e4m3(0xfe) == -448.0);
    assert_true(ref_fp8_e4m3(0x78) == 256.0); /* S.1111.000 is a number: no infinities */
    assert_true(isnan(ref_fp8_e4m3(0x7f)));
    assert_true(isnan(ref_fp8_e4m3(0xff)));
    for (unsigned c = 0; c < 256; ++c) assert_int_equal(isnan(ref_fp8_e4m3((uint8_t)c)) != 0, c == 0x7f || c == 0xff);
}

static void test_fp8_fnuz_decoder(void **state) {
    (void)state;
    assert_true(ref_fp8_e4m3_fnuz(0x00) == 0.0);
    assert_true(isnan(ref_fp8_e4m3_fnuz(0x80))); /* no negative zero: 0x80 is the NaN */
    assert_true(ref_fp8_e4m3_fnuz(0x01) == ldexp(1.0, -10));
    assert_true(ref_fp8_e4m3_fnuz(0x08) == ldexp(1.0, -7));
    assert_true(ref_fp8_e4m3_fnuz(0x40) == 1.0); /* bias 8 */
    assert_true(ref_fp8_e4m3_fnuz(0x38) == 0.5);
    assert_true(ref_fp8_e4m3_fnuz(0x7f) == 240.0); /* max */
    assert_true(ref_fp8_e4m3_fnuz(0xff) == -240.0);
    assert_true(ref_fp8_e4m3_fnuz(0x81) == -ldexp(1.0, -10));
    for (unsigned c = 0; c < 256; ++c) assert_int_equal(isnan(ref_fp8_e4m3_fnuz((uint8_t)c)) != 0, c == 0x80);
    /* same code, one binade apart */
    for (unsigned c = 0; c < 256; ++c)
        if (c != 0x80 && (c & 0x7f) != 0x7f) assert_true(ref_fp8_e4m3_fnuz((uint8_t)c) * 2 == ref_fp8_e4m3((uint8_t)c));
}

static void test_mxfp4_decoders(void **state) {
    static const double want[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
    (void)state;
    for (unsigned n = 0; n < 16; ++n) assert_true(ref_e2m1(n) == want[n]);
    assert_true(ref_e8m0(127) == 1.0);
    assert_true(ref_e8m0(128) == 2.0);
    assert_true(ref_e8m0(0) == ldexp(1.0, -127));
    assert_true(ref_e8m0(254) == ldexp(1.0, 127));
    assert_true(isnan(ref_e8m0(255)));
    {
        /* element order inside a row: low nibble first, one scale per 32 */
        uint8_t row[288], scales[18];
        double v[576];
        memset(row, 0, sizeof row);
        memset(scales, 127, sizeof scales);
        row[0] = 0x72;    /* element 0 = 1.0 (code 2), element 1 = 6.0 (code 7) */
        row[16] = 0x0b;   /* element 32 = -1.5, in the second block */
        row[287] = 0x90;  /* element 575 = -0.5 */
        scales[1] = 129;  /* second block x4 */
        scales[17] = 126; /* last block x0.5 */
        ref_decode_kv_row(MLA_DTYPE_MXFP4, row, scales, 0.0f, v);
        assert_true(v[0] == 1.0 && v[1] == 6.0 && v[2] == 0.0);
        assert_true(v[32] == -6.0 && v[33] == 0.0);
        assert_true(v[575] == -0.25 && v[574] == 0.0);
    }
}

static void test_fp8_dequant_rounds_like_float(void **state) {
    /* fp8 x scale is formed in float32, as the library does */
    uint8_t row[576];
    double v[576];
    const float scale = 0.3f;
    (void)state;
    for (int i = 0; i < 576; ++i) row[i] = (uint8_t)(i % 256 == 0x7f || i % 256 == 0xff ? 0 : i % 256);
    ref_decode_kv_row(MLA_DTYPE_FP8_E4M3, row, NULL, scale, v);
    for (int i = 0; i < 576; ++i) assert_true(v[i] == (double)((float)ref_fp8_e4m3(row[i]) * scale));
    ref_decode_q_row(MLA_DTYPE_FP8_E4M3_FNUZ, row, 0.0f, v); /* 0 means 1 */
    for (int i = 0; i < 576; ++i)
        assert_true(row[i] == 0x80 ? isnan(v[i]) : v[i] == ref_fp8_e4m3_fnuz(row[i]));
}

static void test_random_generators(void **state) {
    tu_rng rng;
    int seen[2][256];
    (void)state;
    tu_rng_init(&rng, tu_seed());
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < 200000; ++i) {
        const uint8_t a = tu_rand_fp8(&rng, MLA_DTYPE_FP8_E4M3), b = tu_rand_fp8(&rng, MLA_DTYPE_FP8_E4M3_FNUZ);
        assert_false(isnan(ref_fp8_e4m3(a)));
        assert_false(isnan(ref_fp8_e4m3_fnuz(b)));
        seen[0][a] = seen[1][b] = 1;
    }
    /* every non-NaN code is reachable */
    for (int c = 0; c < 256; ++c) {
        assert_int_equal(seen[0][c], !tu_fp8_is_nan(MLA_DTYPE_FP8_E4M3, (uint8_t)c));
        assert_int_equal(seen[1][c], !tu_fp8_is_nan(MLA_DTYPE_FP8_E4M3_FNUZ, (uint8_t)c));
    }
    for (int i = 0; i < 1000; ++i) {
        const int r = tu_range(&rng, -3, 5);
        assert_true(r >= -3 && r <= 5);
    }
}

static void test_batch_builder(void **state) {
    const int q_lens[5] = {1, 2, 0, 1, 3};
    const int kv_lens[5] = {0, 17, 40, 1, 32};
    tu_batch b;
    tu_rng rng;
    int used[64];
    (void)state;
    tu_rng_init(&rng, tu_seed());
    assert_int_equal(tu_batch_make(&b, 5, q_lens, kv_lens, 16, 1, 3, &rng), 0);
    assert_int_equal(b.total_q, 7);
    assert_int_equal(b.total_pages, 0 + 2 + 3 + 1 + 2);
    assert_int_equal(b.num_pages, 11);
    assert_int_equal(b.kv_last_page_len[1], 1);
    assert_int_equal(b.kv_last_page_len[3], 1);
    assert_int_equal(b.kv_last_page_len[4], 16);
    assert_int_equal(b.kv_last_page_len[0], 0);
    memset(used, 0, sizeof used);
    for (int s = 0; s < b.total_pages; ++s) {
        const int p = tu_batch_page(&b, s);
        assert_true(p >= 0 && p < b.num_pages);
        assert_int_equal(used[p]++, 0);
    }
    tu_batch_free(&b);
}

/* Build a tiny bf16 problem by hand and check the reference's closed-form answers. */
static void test_reference_closed_form(void **state) {
    /* one sequence, 3 keys, page size 2 (2 pages, last holds 1), explicit
     * table {1, 0}: key j lives at page tbl[j/2], slot j%2. */
    uint16_t kv[2 * 2 * 576], q[2 * 1 * 576];
    const int32_t qo[2] = {0, 2}, kvp[2] = {0, 2}, last[1] = {1}, tbl[2] = {1, 0};
    double out[2 * 512], lse[2], vmax[2], smag[2];
    const double s_k[3] = {0.5, -1.0, 2.0}; /* scores of key 0,1,2 (before the cap) */
    ref_problem p;
    (void)state;
    memset(kv, 0, sizeof kv);
    memset(q, 0, sizeof q);
    /* q[i] = e_575 (beyond V); K_j[575] = s_k[j] * 8 so s_j = s_k[j] with sm_scale 1/8;
     * V_j[0] = j + 1 */
    for (int j = 0; j < 3; ++j) {
        const int row = tbl[j / 2] * 2 + j % 2;
        kv[row * 576 + 575] = tu_float_to_bf16((float)(s_k[j] * 8));
        kv[row * 576 + 0] = tu_float_to_bf16((float)(j + 1));
    }
    q[575] = q[576 + 575] = tu_float_to_bf16(1.0f);
    memset(&p, 0, sizeof p);
    p.num_heads = 1;
    p.q_dtype = p.kv_dtype = MLA_DTYPE_BF16;
    p.page_size = 2;
    p.sm_scale = 0.125f;
    p.batch_size = 1;
    p.qo_indptr = qo;
    p.kv_indptr = kvp;
    p.kv_last_page_len = last;
    p.kv_indices = tbl;
    p.q = q;
    p.kv = kv;
    assert_int_equal(ref_attention(&p, out, lse, vmax, smag), 0);
    /* token 0 of 2 sees keys 0, 1; token 1 sees 0, 1, 2 */
    {
        const double e0 = exp(0.5), e1 = exp(-1.0), e2 = exp(2.0);
        assert_true(fabs(lse[0] - log(e0 + e1)) < 1e-12);
        assert_true(fabs(out[0] - (1 * e0 + 2 * e1) / (e0 + e1)) < 1e-12);
        assert_true(fabs(lse[1] - log(e0 + e1 + e2)) < 1e-12);
        assert_true(fabs(out[512] - (e0 + 2 * e1 + 3 * e2) / (e0 + e1 + e2)) < 1e-12);
        assert_true(out[1] == 0.0 && out[512 + 511] == 0.0);
        assert_true(vmax[0] == 2.0 && vmax[1] == 3.0);
        /* |q| = 1, max |K| over keys 0,1 = |(2, .., -8)|, over 0..2 = |(3, .., 16)| */
        assert_true(fabs(smag[0] - 0.125 * sqrt(4.0 + 64.0)) < 1e-12);
        assert_true(fabs(smag[1] - 0.125 * sqrt(9.0 + 256.0)) < 1e-12);
    }
    /* logit cap 1: s -> tanh(s) */
    p.logit_cap = 1.0f;
    assert_int_equal(ref_attention(&p, out, lse, vmax, smag), 0);
    {
        const double e0 = exp(tanh(0.5)), e1 = exp(tanh(-1.0)), e2 = exp(tanh(2.0));
        assert_true(fabs(lse[1] - log(e0 + e1 + e2)) < 1e-12);
        assert_true(fabs(out[512] - (e0 + 2 * e1 + 3 * e2) / (e0 + e1 + e2)) < 1e-12);
    }
    /* L = 1 < n = 2: token 0 sees nothing, token 1 sees key 0 */
    {
        const int32_t kvp1[2] = {0, 1};
        p.kv_indptr = kvp1;
        p.logit_cap = 0.0f;
        assert_int_equal(ref_attention(&p, out, lse, vmax, smag), 0);
        assert_true(isinf(lse[0]) && lse[0] < 0 && out[0] == 0.0 && vmax[0] == 0.0);
        assert_true(fabs(lse[1] - 0.5) < 1e-12 && out[512] == 1.0);
    }
    /* a NaN in a visible key is reported */
    p.kv_indptr = kvp;
    kv[(tbl[0] * 2 + 0) * 576 + 7] = 0xffff;
    assert_int_equal(ref_attention(&p, out, lse, vmax, smag), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_decoder),
        cmocka_unit_test(test_bf16_rounding),
        cmocka_unit_test(test_fp8_e4m3_decoder),
        cmocka_unit_test(test_fp8_fnuz_decoder),
        cmocka_unit_test(test_mxfp4_decoders),
        cmocka_unit_test(test_fp8_dequant_rounds_like_float),
        cmocka_unit_test(test_random_generators),
        cmocka_unit_test(test_batch_builder),
        cmocka_unit_test(test_reference_closed_form),
    };
    tu_seed();
    return cmocka_run_group_tests_name("reference", tests, NULL, NULL);
}
