/*
 * Every refusal of the C API: the exact status, a non-empty
 * mla_last_error_message() that names the offending argument, and (for
 * execute) nothing written into out or lse. After each test the fixture's
 * plan must still work.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define DV MLA_HEAD_DIM_V

/* `name` appears in `msg` as a whole identifier (not inside a longer one).
 * "a|b" accepts either. */
static int is_ident(char c) {
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

static int names(const char *msg, const char *name) {
    const char *bar = strchr(name, '|');
    const size_t n = bar ? (size_t)(bar - name) : strlen(name);
    const char *p;
    for (p = msg; *p; ++p) {
        if (strncmp(p, name, n) != 0) continue;
        if ((p == msg || !is_ident(p[-1])) && !is_ident(p[n])) return 1;
    }
    return bar ? names(msg, bar + 1) : 0;
}

#define CHECK_MSG(name, what)                                                                     \
    do {                                                                                          \
        const char *m_ = mla_last_error_message();                                                \
        if (!m_ || !*m_) fail_msg("%s: mla_last_error_message() is empty", what);                 \
        if (!names(m_, name)) fail_msg("%s: message \"%s\" does not name '%s'", what, m_, name); \
    } while (0)

/* call must return `want`, with a message naming `name`. */
#define EXPECT(call, want, name)                                                                                \
    do {                                                                                                        \
        const mla_status st_ = (call);                                                                          \
        if (st_ != (want))                                                                                      \
            fail_msg("%s returned %s, expected %s (message: \"%s\")", #call, mla_status_string(st_),           \
                     mla_status_string(want), mla_last_error_message());                                        \
        CHECK_MSG(name, #call);                                                                                 \
    } while (0)

#define EXPECT_OK(call)                                                                                          \
    do {                                                                                                         \
        const mla_status st_ = (call);                                                                           \
        if (st_ != MLA_SUCCESS) fail_msg("%s returned %s: %s", #call, mla_status_string(st_), mla_last_error_message()); \
        if (*mla_last_error_message()) fail_msg("%s succeeded but left the message \"%s\"", #call, mla_last_error_message()); \
    } while (0)

/* ---- fixture: a valid bf16 (or mxfp4) plan, batch and tensors ------------------ */

#define HEADS 16
#define PAGE 16
#define NPAGES 8

typedef struct fixture {
    mla_plan_desc desc;
    mla_plan *plan;
    int32_t qo[4], kvp[4], last[3], indices[NPAGES];
    mla_batch batch;
    tu_buf q, kv, scales, out, lse;
    mla_tensors t;
    mla_dtype kv_dtype;
    int total_q;
} fixture;

static int make_fixture(void **state, mla_dtype kv_dtype) {
    /* q lens {1, 2, 1}; kv lens {20, 1, 33}: pages {2, 1, 3} of 8 */
    static const int32_t qo[4] = {0, 1, 3, 4}, kvp[4] = {0, 2, 3, 6}, last[3] = {4, 1, 1};
    static const int32_t indices[NPAGES] = {5, 0, 7, 2, 4, 1, 3, 6};
    fixture *f = (fixture *)calloc(1, sizeof *f);
    tu_rng rng;
    if (!f) return -1;
    tu_rng_init(&rng, tu_seed());
    f->kv_dtype = kv_dtype;
    memcpy(f->qo, qo, sizeof qo);
    memcpy(f->kvp, kvp, sizeof kvp);
    memcpy(f->last, last, sizeof last);
    memcpy(f->indices, indices, sizeof indices);
    f->total_q = 4;
    mla_plan_desc_init(&f->desc);
    f->desc.num_heads = HEADS;
    f->desc.kv_dtype = kv_dtype;
    f->desc.page_size = PAGE;
    f->desc.max_batch_size = 4;
    f->desc.max_q_len = 2;
    f->desc.backend = MLA_BACKEND_CPU;
    f->desc.num_threads = 1;
    if (mla_plan_create(&f->desc, &f->plan) != MLA_SUCCESS) return -1;
    mla_batch_init(&f->batch);
    f->batch.batch_size = 3;
    f->batch.qo_indptr = f->qo;
    f->batch.kv_indptr = f->kvp;
    f->batch.kv_last_page_len = f->last;
    if (tu_buf_alloc(&f->q, (size_t)f->total_q * HEADS * 576 * 2) || tu_buf_alloc(&f->kv, NPAGES * PAGE * 1152) ||
        tu_buf_alloc(&f->scales, NPAGES * PAGE * 18) || tu_buf_alloc(&f->out, (size_t)f->total_q * HEADS * DV * 2) ||
        tu_buf_alloc(&f->lse, (size_t)f->total_q * HEADS * 4))
        return -1;
    tu_fill_random(&rng, MLA_DTYPE_BF16, f->q.data, f->q.size / 2, 1.0);
    if (kv_dtype == MLA_DTYPE_MXFP4) {
        size_t i;
        for (i = 0; i < f->kv.size; ++i) f->kv.data[i] = (unsigned char)tu_next(&rng);
        memset(f->scales.data, 125, f->scales.size);
    } else {
        tu_fill_random(&rng, MLA_DTYPE_BF16, f->kv.data, f->kv.size / 2, 1.0);
    }
    mla_tensors_init(&f->t);
    f->t.q = f->q.data;
    f->t.kv = f->kv.data;
    f->t.kv_block_scales = kv_dtype == MLA_DTYPE_MXFP4 ? f->scales.data : NULL;
    f->t.kv_indices = f->indices;
    f->t.out = f->out.data;
    f->t.lse = (float *)f->lse.data;
    f->t.num_pages = NPAGES;
    if (mla_plan_build_metadata(f->plan, &f->batch, NULL) != MLA_SUCCESS) return -1;
    *state = f;
    return 0;
}

static int setup_bf16(void **state) { return make_fixture(state, MLA_DTYPE_BF16); }
static int setup_mxfp4(void **state) { return make_fixture(state, MLA_DTYPE_MXFP4); }

/* Rebuilds the fixture's own metadata and tensors and runs them: every
 * refusal must leave the plan usable. */
static int teardown(void **state) {
    fixture *f = (fixture *)*state;
    mla_batch batch;
    mla_tensors t;
    int bad = 0;
    mla_batch_init(&batch);
    batch.batch_size = 3;
    batch.qo_indptr = f->qo;
    batch.kv_indptr = f->kvp;
    batch.kv_last_page_len = f->last;
    mla_tensors_init(&t);
    t.q = f->q.data;
    t.kv = f->kv.data;
    t.kv_block_scales = f->kv_dtype == MLA_DTYPE_MXFP4 ? f->scales.data : NULL;
    t.kv_indices = f->indices;
    t.out = f->out.data;
    t.lse = (float *)f->lse.data;
    t.num_pages = NPAGES;
    tu_buf_poison(&f->out);
    /* restore the arrays a test may have edited */
    {
        static const int32_t qo[4] = {0, 1, 3, 4}, kvp[4] = {0, 2, 3, 6}, last[3] = {4, 1, 1};
        static const int32_t indices[NPAGES] = {5, 0, 7, 2, 4, 1, 3, 6};
        memcpy(f->qo, qo, sizeof qo);
        memcpy(f->kvp, kvp, sizeof kvp);
        memcpy(f->last, last, sizeof last);
        memcpy(f->indices, indices, sizeof indices);
    }
    if (mla_plan_build_metadata(f->plan, &batch, NULL) != MLA_SUCCESS ||
        mla_plan_execute(f->plan, &t, NULL) != MLA_SUCCESS) {
        printf("teardown: the plan no longer works: %s\n", mla_last_error_message());
        bad = 1;
    } else if (tu_count_bf16_nan((const uint16_t *)f->out.data, f->out.size / 2) || !tu_buf_guards_ok(&f->out)) {
        printf("teardown: the valid execute left rows unwritten or broke a guard\n");
        bad = 1;
    }
    mla_plan_destroy(f->plan);
    tu_buf_free(&f->q);
    tu_buf_free(&f->kv);
    tu_buf_free(&f->scales);
    tu_buf_free(&f->out);
    tu_buf_free(&f->lse);
    free(f);
    return bad ? -1 : 0;
}

static void assert_untouched(const fixture *f) {
    if (!tu_buf_guards_ok(&f->out) || !tu_buf_guards_ok(&f->lse)) fail_msg("a refused call wrote past out / lse");
    if (tu_count_bf16_nan((const uint16_t *)f->out.data, f->out.size / 2) != f->out.size / 2)
        fail_msg("a refused execute wrote into out");
    if (tu_count_f32_nan((const float *)f->lse.data, f->lse.size / 4) != f->lse.size / 4)
        fail_msg("a refused execute wrote into lse");
}

#define EXPECT_EXEC_REFUSED(f, tensors, want, name)                        \
    do {                                                                   \
        tu_buf_poison(&(f)->out);                                          \
        tu_buf_poison(&(f)->lse);                                          \
        EXPECT(mla_plan_execute((f)->plan, (tensors), NULL), want, name);  \
        assert_untouched(f);                                               \
    } while (0)

#define FIX fixture *f = (fixture *)*state

/* ---- the fixture itself works ------------------------------------------------------ */

static void test_fixture_is_valid(void **state) {
    FIX;
    tu_buf_poison(&f->out);
    EXPECT_OK(mla_plan_execute(f->plan, &f->t, NULL));
    assert_int_equal(tu_count_bf16_nan((const uint16_t *)f->out.data, f->out.size / 2), 0);
}

/* ---- NULL pointers ------------------------------------------------------------------- */

static void test_null_desc(void **state) {
    mla_plan *plan = (mla_plan *)state; /* any non-NULL value: must be reset */
    EXPECT(mla_plan_create(NULL, &plan), MLA_ERROR_NULL_POINTER, "desc");
    assert_null(plan);
    EXPECT(mla_plan_desc_init(NULL), MLA_ERROR_NULL_POINTER, "desc");
}

static void test_null_plan_out(void **state) {
    FIX;
    EXPECT(mla_plan_create(&f->desc, NULL), MLA_ERROR_NULL_POINTER, "plan");
}

static void test_null_plan_handle(void **state) {
    FIX;
    size_t bytes;
    mla_backend backend;
    mla_schedule_info info;
    mla_schedule_info_init(&info);
    EXPECT(mla_plan_build_metadata(NULL, &f->batch, NULL), MLA_ERROR_NULL_POINTER, "plan");
    EXPECT(mla_plan_execute(NULL, &f->t, NULL), MLA_ERROR_NULL_POINTER, "plan");
    EXPECT(mla_plan_workspace_size(NULL, &bytes), MLA_ERROR_NULL_POINTER, "plan");
    EXPECT(mla_plan_backend(NULL, &backend), MLA_ERROR_NULL_POINTER, "plan");
    EXPECT(mla_plan_schedule_info(NULL, &info), MLA_ERROR_NULL_POINTER, "plan");
}

static void test_null_out_parameters(void **state) {
    FIX;
    EXPECT(mla_plan_workspace_size(f->plan, NULL), MLA_ERROR_NULL_POINTER, "bytes");
    EXPECT(mla_plan_backend(f->plan, NULL), MLA_ERROR_NULL_POINTER, "backend");
    EXPECT(mla_plan_schedule_info(f->plan, NULL), MLA_ERROR_NULL_POINTER, "info");
    EXPECT(mla_batch_init(NULL), MLA_ERROR_NULL_POINTER, "batch");
    EXPECT(mla_tensors_init(NULL), MLA_ERROR_NULL_POINTER, "tensors");
    EXPECT(mla_schedule_info_init(NULL), MLA_ERROR_NULL_POINTER, "info");
}

static void test_null_batch(void **state) {
    FIX;
    EXPECT(mla_plan_build_metadata(f->plan, NULL, NULL), MLA_ERROR_NULL_POINTER, "batch");
}

static void test_null_tensors(void **state) {
    FIX;
    EXPECT_EXEC_REFUSED(f, NULL, MLA_ERROR_NULL_POINTER, "tensors");
}

static void test_null_q(void **state) {
    FIX;
    mla_tensors t = f->t;
    t.q = NULL;
    EXPECT_EXEC_REFUSED(f, &t, MLA_ERROR_NULL_POINTER, "q");
}

static void test_null_kv(void **state) {
    FIX;
    mla_tensors t = f->t;
    t.kv = NULL;
    EXPECT_EXEC_REFUSED(f, &t, MLA_ERROR_NULL_POINTER, "kv");
}

static void test_null_out(void **state) {
    FIX;
    mla_tensors t = f->t;
    t.out = NULL;
    EXPECT_EXEC_REFUSED(f, &t, MLA_ERROR_NULL_POINTER, "out");
}

static void test_null_qo_indptr(void **state) {
    FIX;
    mla_batch b = f->batch;
    b.qo_indptr = NULL;
    EXPECT(mla_plan_build_metadata(f->plan, &b, NULL), MLA_ERROR_NULL_POINTER, "qo_indptr");
}

static void test_null_kv_indptr(void **state) {
    FIX;
    mla_batch b = f->batch;
    b.kv_indptr = NULL;
    EXPECT(mla_plan_build_metadata(f->plan, &b, NULL), MLA_ERROR_NULL_POINTER, "kv_indptr");
}

static void test_null_kv_block_scales_mxfp4(void **state) {
    FIX;
    mla_tensors t = f->t;
    t.kv_block_scales = NULL;
    EXPECT_EXEC_REFUSED(f, &t, MLA_ERROR_NULL_POINTER, "kv_block_scales");
}

/* ---- struct_size ----------------------------------------------------------------------- */

/* Each struct followed by a tail a newer header could have appended. */
struct big_desc { mla_plan_desc d; unsigned char tail[24]; };
struct big_batch { mla_batch b; unsigned char tail[24]; };
struct big_tensors { mla_tensors t; unsigned char tail[24]; };
struct big_info { mla_schedule_info i; unsigned char tail[24]; };

static void test_struct_size_desc(void **state) {
    FIX;
    struct big_desc big;
    mla_plan *plan = NULL;
    mla_plan_desc d = f->desc;
    d.struct_size = 0;
    EXPECT(mla_plan_create(&d, &plan), MLA_ERROR_STRUCT_SIZE, "struct_size");
    assert_null(plan);
    d.struct_size = sizeof d - sizeof(int32_t);
    EXPECT(mla_plan_create(&d, &plan), MLA_ERROR_STRUCT_SIZE, "struct_size");
    d.struct_size = 8;
    EXPECT(mla_plan_create(&d, &plan), MLA_ERROR_STRUCT_SIZE, "struct_size");
    memset(&big, 0, sizeof big);
    big.d = f->desc;
    big.d.struct_size = sizeof big;
    big.tail[17] = 1;
    EXPECT(mla_plan_create(&big.d, &plan), MLA_ERROR_STRUCT_SIZE, "struct_size");
    assert_null(plan);
    big.tail[17] = 0; /* a larger struct with a zero tail is accepted */
    EXPECT_OK(mla_plan_create(&big.d, &plan));
    assert_non_null(plan);
    mla_plan_destroy(plan);
}

static void test_struct_size_batch(void **state) {
    FIX;
    struct big_batch big;
    mla_batch b = f->batch;
    b.struct_size = 0;
    EXPECT(mla_plan_build_metadata(f->plan, &b, NULL), MLA_ERROR_STRUCT_SIZE, "struct_size");
    b.struct_size = sizeof b - 1;
    EXPECT(mla_plan_build_metadata(f->plan, &b, NULL), MLA_ERROR_STRUCT_SIZE, "struct_size");
    memset(&big, 0, sizeof big);
    big.b = f->batch;
    big.b.struct_size = sizeof big;
    big.tail[0] = 0xff;
    EXPECT(mla_plan_build_metadata(f->plan, &big.b, NULL), MLA_ERROR_STRUCT_SIZE, "struct_size");
    big.tail[0] = 0;
    EXPECT_OK(mla_plan_build_metadata(f->plan, &big.b, NULL));
}

static void test_struct_size_tensors(void **state) {
    FIX;
    struct big_tensors big;
    mla_tensors t = f->t;
    t.struct_size = 0;
    EXPECT_EXEC_REFUSED(f, &t, MLA_ERROR_STRUCT_SIZE, "struct_size");
    t.struct_size = offsetof(mla_tensors, num_pages);
    EXPECT_EXEC_REFUSED(f, &t, MLA_ERROR_STRUCT_SIZE, "struct_size");
    memset(&big, 0, sizeof big);
    big.t = f->t;
    big.t.struct_size = sizeof big;
    big.tail[23] = 2;
    EXPECT_EXEC_REFUSED(f, &big.t, MLA_ERROR_STRUCT_SIZE, "struct_size");
    big.tail[23] = 0;
    EXPECT_OK(mla_plan_execute(f->plan, &big.t, NULL));
}

static void test_struct_size_schedule_info(void **state) {
    FIX;
    struct big_info big;
    mla_schedule_info info;
    mla_schedule_info_init(&info);
    info.struct_size = 0;
    EXPECT(mla_plan_schedule_info(f->plan, &info), MLA_ERROR_STRUCT_SIZE, "struct_size");
    memset(&big, 0, sizeof big);
    mla_schedule_info_init(&big.i);
    big.i.struct_size = sizeof big;
    big.tail[3] = 9;
    EXPECT(mla_plan_schedule_info(f->plan, &big.i), MLA_ERROR_STRUCT_SIZE, "struct_size");
    big.tail[3] = 0;
    EXPECT_OK(mla_plan_schedule_info(f->plan, &big.i));
    assert_true(big.i.num_work_items > 0);
}

/* ---- descriptor values -------------------------------------------------------------- */

static void expect_create_refused(const mla_plan_desc *d, mla_status want, const char *name, const char *what) {
    mla_plan *plan = (mla_plan *)(uintptr_t)1;
    const mla_status st = mla_plan_create(d, &plan);
    if (st != want)
        fail_msg("%s: mla_plan_create returned %s, expected %s (%s)", what, mla_status_string(st),
                 mla_status_string(want), mla_last_error_message());
    if (plan != NULL) fail_msg("%s: *plan was not set to NULL on failure", what);
    CHECK_MSG(name, what);
}

#define REFUSE_DESC(field, value, want, name)                        \
    do {                                                             \
        mla_plan_desc d_ = f->desc;                                  \
        d_.field = value;                                            \
        expect_create_refused(&d_, want, name, #field " = " #value); \
    } while (0)

static void test_bad_num_heads(void **state) {
    FIX;
    REFUSE_DESC(num_heads, 0, MLA_ERROR_INVALID_VALUE, "num_heads");
    REFUSE_DESC(num_heads, 129, MLA_ERROR_INVALID_VALUE, "num_heads");
    REFUSE_DESC(num_heads, -16, MLA_ERROR_INVALID_VALUE, "num_heads");
}

static void test_bad_head_dims(void **state) {
    FIX;
    REFUSE_DESC(head_dim_qk, 512, MLA_ERROR_INVALID_VALUE, "head_dim_qk");
    REFUSE_DESC(head_dim_qk, -576, MLA_ERROR_INVALID_VALUE, "head_dim_qk");
    REFUSE_DESC(head_dim_v, 576, MLA_ERROR_INVALID_VALUE, "head_dim_v");
}

static void test_bad_page_size(void **state) {
    FIX;
    REFUSE_DESC(page_size, 3, MLA_ERROR_INVALID_VALUE, "page_size");
    REFUSE_DESC(page_size, 512, MLA_ERROR_INVALID_VALUE, "page_size");
    REFUSE_DESC(page_size, -16, MLA_ERROR_INVALID_VALUE, "page_size");
    REFUSE_DESC(page_size, 48, MLA_ERROR_INVALID_VALUE, "page_size");
}

static void test_bad_max_q_len(void **state) {
    FIX;
    REFUSE_DESC(max_q_len, 9, MLA_ERROR_INVALID_VALUE, "max_q_len");
    REFUSE_DESC(max_q_len, -1, MLA_ERROR_INVALID_VALUE, "max_q_len");
}

static void test_bad_scalars(void **state) {
    FIX;
    REFUSE_DESC(max_batch_size, -1, MLA_ERROR_INVALID_VALUE, "max_batch_size");
    REFUSE_DESC(sm_scale, -0.5f, MLA_ERROR_INVALID_VALUE, "sm_scale");
    REFUSE_DESC(sm_scale, NAN, MLA_ERROR_INVALID_VALUE, "sm_scale");
    REFUSE_DESC(logit_cap, -1.0f, MLA_ERROR_INVALID_VALUE, "logit_cap");
    REFUSE_DESC(logit_cap, INFINITY, MLA_ERROR_INVALID_VALUE, "logit_cap");
    REFUSE_DESC(num_splits, MLA_MAX_SPLITS + 1, MLA_ERROR_INVALID_VALUE, "num_splits");
    REFUSE_DESC(num_splits, -1, MLA_ERROR_INVALID_VALUE, "num_splits");
    REFUSE_DESC(num_threads, -1, MLA_ERROR_INVALID_VALUE, "num_threads");
    REFUSE_DESC(backend, (mla_backend)7, MLA_ERROR_INVALID_VALUE, "backend");
    REFUSE_DESC(device, -1, MLA_ERROR_INVALID_DEVICE, "device");
}

static void test_unknown_flags(void **state) {
    FIX;
    REFUSE_DESC(flags, 1u << 3, MLA_ERROR_INVALID_VALUE, "flags");
    REFUSE_DESC(flags, MLA_FLAG_DETERMINISTIC | 0x80000000u, MLA_ERROR_INVALID_VALUE, "flags");
}

static void test_unsupported_dtypes(void **state) {
    FIX;
    REFUSE_DESC(q_dtype, MLA_DTYPE_MXFP4, MLA_ERROR_UNSUPPORTED_DTYPE, "q_dtype");
    REFUSE_DESC(q_dtype, MLA_DTYPE_FLOAT32, MLA_ERROR_UNSUPPORTED_DTYPE, "q_dtype");
    REFUSE_DESC(q_dtype, (mla_dtype)42, MLA_ERROR_UNSUPPORTED_DTYPE, "q_dtype");
    REFUSE_DESC(kv_dtype, MLA_DTYPE_FLOAT32, MLA_ERROR_UNSUPPORTED_DTYPE, "kv_dtype");
    REFUSE_DESC(out_dtype, MLA_DTYPE_FLOAT32, MLA_ERROR_UNSUPPORTED_DTYPE, "out_dtype");
    REFUSE_DESC(out_dtype, MLA_DTYPE_FP8_E4M3, MLA_ERROR_UNSUPPORTED_DTYPE, "out_dtype");
    {
        mla_plan_desc d = f->desc;
        d.q_dtype = MLA_DTYPE_FP8_E4M3;
        d.kv_dtype = MLA_DTYPE_FP8_E4M3_FNUZ;
        expect_create_refused(&d, MLA_ERROR_UNSUPPORTED_DTYPE, "kv_dtype", "fp8 e4m3 Q with fnuz KV");
        d.q_dtype = MLA_DTYPE_FP8_E4M3_FNUZ;
        d.kv_dtype = MLA_DTYPE_FP8_E4M3;
        expect_create_refused(&d, MLA_ERROR_UNSUPPORTED_DTYPE, "q_dtype", "fp8 fnuz Q with e4m3 KV");
    }
}

/* ---- batch --------------------------------------------------------------------------- */

#define REFUSE_BATCH(f, want, name) EXPECT(mla_plan_build_metadata((f)->plan, &(f)->batch, NULL), want, name)

static void test_qo_indptr_not_monotonic(void **state) {
    FIX;
    f->qo[2] = 0; /* {0, 1, 0, 4} */
    REFUSE_BATCH(f, MLA_ERROR_INVALID_INDPTR, "qo_indptr");
}

static void test_qo_indptr_nonzero_start(void **state) {
    FIX;
    f->qo[0] = 1;
    REFUSE_BATCH(f, MLA_ERROR_INVALID_INDPTR, "qo_indptr");
}

static void test_kv_indptr_not_monotonic(void **state) {
    FIX;
    f->kvp[2] = 1; /* {0, 2, 1, 6} */
    REFUSE_BATCH(f, MLA_ERROR_INVALID_INDPTR, "kv_indptr");
}

static void test_kv_indptr_nonzero_start(void **state) {
    FIX;
    f->kvp[0] = 2;
    REFUSE_BATCH(f, MLA_ERROR_INVALID_INDPTR, "kv_indptr");
}

static void test_kv_len_overflow(void **state) {
    /* (2^27 pages - 1) * 16 + 16 = 2^31 tokens: not an int32 length */
    FIX;
    f->kvp[1] = 1 << 27;
    f->kvp[2] = f->kvp[3] = f->kvp[1];
    f->last[0] = PAGE;
    REFUSE_BATCH(f, MLA_ERROR_INVALID_INDPTR, "kv_indptr");
}

static void test_last_page_len_zero(void **state) {
    FIX;
    f->last[1] = 0;
    REFUSE_BATCH(f, MLA_ERROR_INVALID_LAST_PAGE_LEN, "kv_last_page_len");
}

static void test_last_page_len_above_page_size(void **state) {
    FIX;
    f->last[2] = PAGE + 1;
    REFUSE_BATCH(f, MLA_ERROR_INVALID_LAST_PAGE_LEN, "kv_last_page_len");
    f->last[2] = -3;
    REFUSE_BATCH(f, MLA_ERROR_INVALID_LAST_PAGE_LEN, "kv_last_page_len");
}

static void test_q_len_above_max(void **state) {
    FIX;
    f->qo[2] = 4; /* sequence 1: q_len 3 > max_q_len 2 */
    f->qo[3] = 5;
    REFUSE_BATCH(f, MLA_ERROR_LIMIT_EXCEEDED, "max_q_len");
}

static void test_batch_above_max(void **state) {
    FIX;
    const int32_t qo[6] = {0, 1, 2, 3, 4, 5}, kvp[6] = {0, 1, 2, 3, 4, 5}, last[5] = {1, 1, 1, 1, 1};
    mla_batch b = f->batch;
    b.batch_size = 5; /* max_batch_size 4 */
    b.qo_indptr = qo;
    b.kv_indptr = kvp;
    b.kv_last_page_len = last;
    EXPECT(mla_plan_build_metadata(f->plan, &b, NULL), MLA_ERROR_LIMIT_EXCEEDED, "max_batch_size");
    b.batch_size = 4; /* the limit itself is fine */
    EXPECT_OK(mla_plan_build_metadata(f->plan, &b, NULL));
}

static void test_negative_batch_size(void **state) {
    FIX;
    mla_batch b = f->batch;
    b.batch_size = -1;
    EXPECT(mla_plan_build_metadata(f->plan, &b, NULL), MLA_ERROR_INVALID_VALUE, "batch_size");
}

static void test_device_batch_on_cpu_plan(void **state) {
    FIX;
    mla_batch b = f->batch;
    b.memory = MLA_MEMORY_DEVICE;
    EXPECT(mla_plan_build_metadata(f->plan, &b, NULL), MLA_ERROR_INVALID_VALUE, "memory");
    b.memory = (mla_memory)5;
    EXPECT(mla_plan_build_metadata(f->plan, &b, NULL), MLA_ERROR_INVALID_VALUE, "memory");
}

/* ---- execute ------------------------------------------------------------------------------ */

static void test_execute_before_metadata(void **state) {
    FIX;
    mla_plan *plan;
    mla_schedule_info info;
    EXPECT_OK(mla_plan_create(&f->desc, &plan));
    tu_buf_poison(&f->out);
    tu_buf_poison(&f->lse);
    EXPECT(mla_plan_execute(plan, &f->t, NULL), MLA_ERROR_NO_METADATA, "mla_plan_build_metadata");
    assert_untouched(f);
    mla_schedule_info_init(&info);
    EXPECT(mla_plan_schedule_info(plan, &info), MLA_ERROR_NO_METADATA, "metadata");
    mla_plan_destroy(plan);
}

static void test_execute_after_failed_metadata(void **state) {
    /* a refused build_metadata leaves no metadata behind */
    FIX;
    f->qo[0] = 1;
    REFUSE_BATCH(f, MLA_ERROR_INVALID_INDPTR, "qo_indptr");
    EXPECT_EXEC_REFUSED(f, &f->t, MLA_ERROR_NO_METADATA, "mla_plan_build_metadata");
}

static void test_page_out_of_range(void **state) {
    FIX;
    mla_tensors t = f->t;
    f->indices[4] = NPAGES; /* sequence 2's second page */
    EXPECT_EXEC_REFUSED(f, &t, MLA_ERROR_PAGE_OUT_OF_RANGE, "kv_indices");
    f->indices[4] = -1; /* negative: refused even without num_pages */
    t.num_pages = 0;
    EXPECT_EXEC_REFUSED(f, &t, MLA_ERROR_PAGE_OUT_OF_RANGE, "kv_indices");
    f->indices[4] = 4;
}

static void test_identity_pages_out_of_range(void **state) {
    FIX;
    mla_tensors t = f->t;
    t.kv_indices = NULL; /* identity: pages 0..5 */
    t.num_pages = 5;
    EXPECT_EXEC_REFUSED(f, &t, MLA_ERROR_PAGE_OUT_OF_RANGE, "num_pages");
    t.num_pages = 6;
    EXPECT_OK(mla_plan_execute(f->plan, &t, NULL));
}

static void test_misaligned(void **state) {
    FIX;
    mla_tensors t = f->t;
    t.q = f->q.data + 2;
    EXPECT_EXEC_REFUSED(f, &t, MLA_ERROR_MISALIGNED, "q");
    t = f->t;
    t.kv = f->kv.data + 8;
    EXPECT_EXEC_REFUSED(f, &t, MLA_ERROR_MISALIGNED, "kv");
    t = f->t;
    t.out = f->out.data + 2;
    EXPECT_EXEC_REFUSED(f, &t, MLA_ERROR_MISALIGNED, "out");
    t = f->t;
    t.lse = (float *)(f->lse.data + 1);
    EXPECT_EXEC_REFUSED(f, &t, MLA_ERROR_MISALIGNED, "lse");
    t = f->t;
    t.kv_indices = (const int32_t *)((const unsigned char *)f->indices + 2);
    EXPECT_EXEC_REFUSED(f, &t, MLA_ERROR_MISALIGNED, "kv_indices");
}

static void test_bad_tensor_scalars(void **state) {
    FIX;
    mla_tensors t = f->t;
    t.q_scale = -1.0f;
    EXPECT_EXEC_REFUSED(f, &t, MLA_ERROR_INVALID_VALUE, "q_scale");
    t.q_scale = NAN;
    EXPECT_EXEC_REFUSED(f, &t, MLA_ERROR_INVALID_VALUE, "q_scale");
    t = f->t;
    t.kv_scale = -0.25f;
    EXPECT_EXEC_REFUSED(f, &t, MLA_ERROR_INVALID_VALUE, "kv_scale");
    t.kv_scale = INFINITY;
    EXPECT_EXEC_REFUSED(f, &t, MLA_ERROR_INVALID_VALUE, "kv_scale");
    t = f->t;
    t.kv_scale_stride = MLA_MXFP4_SCALES_PER_ROW - 1;
    EXPECT_EXEC_REFUSED(f, &t, MLA_ERROR_INVALID_VALUE, "kv_scale_stride");
    t = f->t;
    t.num_pages = -1;
    EXPECT_EXEC_REFUSED(f, &t, MLA_ERROR_INVALID_VALUE, "num_pages");
}

static void test_workspace_too_small(void **state) {
    FIX;
    mla_tensors t = f->t;
    size_t need = 0;
    tu_buf ws;
    EXPECT_OK(mla_plan_workspace_size(f->plan, &need));
    assert_true(need > 0);
    assert_int_equal(tu_buf_alloc(&ws, need), 0);
    t.workspace = ws.data;
    t.workspace_size = need - 1;
    EXPECT_EXEC_REFUSED(f, &t, MLA_ERROR_WORKSPACE_TOO_SMALL, "workspace_size");
    t.workspace_size = need;
    t.workspace = ws.data + 8;
    EXPECT_EXEC_REFUSED(f, &t, MLA_ERROR_MISALIGNED, "workspace");
    t.workspace = ws.data;
    EXPECT_OK(mla_plan_execute(f->plan, &t, NULL));
    assert_true(tu_buf_guards_ok(&ws));
    tu_buf_free(&ws);
}

static void test_caller_workspace_missing(void **state) {
    FIX;
    mla_plan_desc d = f->desc;
    mla_plan *saved = f->plan, *plan;
    size_t need = 0;
    tu_buf ws;
    mla_tensors t = f->t;
    d.flags = MLA_FLAG_CALLER_WORKSPACE;
    EXPECT_OK(mla_plan_create(&d, &plan));
    EXPECT_OK(mla_plan_build_metadata(plan, &f->batch, NULL));
    f->plan = plan;
    EXPECT_EXEC_REFUSED(f, &t, MLA_ERROR_WORKSPACE_TOO_SMALL, "workspace");
    EXPECT_OK(mla_plan_workspace_size(plan, &need));
    assert_int_equal(tu_buf_alloc(&ws, need), 0);
    t.workspace = ws.data;
    t.workspace_size = need - 16;
    EXPECT_EXEC_REFUSED(f, &t, MLA_ERROR_WORKSPACE_TOO_SMALL, "workspace_size");
    t.workspace_size = need;
    EXPECT_OK(mla_plan_execute(plan, &t, NULL));
    assert_true(tu_buf_guards_ok(&ws));
    f->plan = saved;
    mla_plan_destroy(plan);
    tu_buf_free(&ws);
}

/* ---- backends, lifetime, strings ------------------------------------------------------------ */

static void test_gpu_backend_unavailable(void **state) {
    FIX;
    mla_plan_desc d = f->desc;
    mla_plan *plan = NULL;
    mla_backend backend;
    if (mla_gpu_device_count() > 0) {
        printf("[ info     ] a GPU is present: skipping the BACKEND_UNAVAILABLE check\n");
        skip();
    }
    d.backend = MLA_BACKEND_GPU;
    expect_create_refused(&d, MLA_ERROR_BACKEND_UNAVAILABLE, "backend|MLA_BACKEND_GPU", "MLA_BACKEND_GPU without a GPU");
    d.device = 3;
    expect_create_refused(&d, MLA_ERROR_BACKEND_UNAVAILABLE, "backend|MLA_BACKEND_GPU|device",
                          "MLA_BACKEND_GPU device 3 without a GPU");
    /* AUTO falls back to the CPU */
    d.backend = MLA_BACKEND_AUTO;
    d.device = 0;
    EXPECT_OK(mla_plan_create(&d, &plan));
    EXPECT_OK(mla_plan_backend(plan, &backend));
    assert_int_equal(backend, MLA_BACKEND_CPU);
    mla_plan_destroy(plan);
}

static void test_destroy_null(void **state) {
    (void)state;
    mla_plan_destroy(NULL);
}

static void test_status_strings(void **state) {
    const char *seen[MLA_ERROR_INTERNAL + 1];
    int s, k;
    (void)state;
    for (s = 0; s <= MLA_ERROR_INTERNAL; ++s) {
        seen[s] = mla_status_string((mla_status)s);
        assert_non_null(seen[s]);
        assert_true(strncmp(seen[s], "MLA_", 4) == 0);
        for (k = 0; k < s; ++k)
            if (strcmp(seen[k], seen[s]) == 0) fail_msg("status %d and %d share the name %s", k, s, seen[s]);
    }
    assert_string_equal(mla_status_string(MLA_SUCCESS), "MLA_SUCCESS");
    assert_string_equal(mla_status_string(MLA_ERROR_PAGE_OUT_OF_RANGE), "MLA_ERROR_PAGE_OUT_OF_RANGE");
    assert_non_null(mla_status_string((mla_status)1000));
    assert_non_null(mla_status_string((mla_status)-1));
}

static void test_version(void **state) {
    (void)state;
    assert_int_equal(mla_version(), MLA_VERSION);
    assert_int_equal(MLA_VERSION, MLA_VERSION_MAJOR * 10000 + MLA_VERSION_MINOR * 100 + MLA_VERSION_PATCH);
}

static void test_message_cleared_on_success(void **state) {
    FIX;
    mla_plan_desc d = f->desc;
    size_t bytes;
    d.num_heads = 0;
    expect_create_refused(&d, MLA_ERROR_INVALID_VALUE, "num_heads", "num_heads 0");
    EXPECT_OK(mla_plan_workspace_size(f->plan, &bytes));
    assert_string_equal(mla_last_error_message(), "");
}

static void *other_thread(void *arg) {
    /* a fresh thread starts with an empty message, and its failure stays its own */
    const char **seen = (const char **)arg;
    seen[0] = *mla_last_error_message() ? "not empty" : "";
    mla_plan_destroy(NULL);
    if (mla_batch_init(NULL) != MLA_ERROR_NULL_POINTER) seen[1] = "wrong status";
    return NULL;
}

static void test_message_is_per_thread(void **state) {
    FIX;
    mla_plan_desc d = f->desc;
    pthread_t th;
    const char *seen[2] = {NULL, NULL};
    char mine[512];
    d.page_size = 3;
    expect_create_refused(&d, MLA_ERROR_INVALID_VALUE, "page_size", "page_size 3");
    snprintf(mine, sizeof mine, "%s", mla_last_error_message());
    assert_int_equal(pthread_create(&th, NULL, other_thread, seen), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_string_equal(seen[0], "");
    assert_null(seen[1]);
    assert_string_equal(mla_last_error_message(), mine);
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, setup_bf16, teardown)

int main(void) {
    const struct CMUnitTest tests[] = {
        T(test_fixture_is_valid),
        cmocka_unit_test(test_null_desc),
        T(test_null_plan_out),
        T(test_null_plan_handle),
        T(test_null_out_parameters),
        T(test_null_batch),
        T(test_null_tensors),
        T(test_null_q),
        T(test_null_kv),
        T(test_null_out),
        T(test_null_qo_indptr),
        T(test_null_kv_indptr),
        cmocka_unit_test_setup_teardown(test_null_kv_block_scales_mxfp4, setup_mxfp4, teardown),
        T(test_struct_size_desc),
        T(test_struct_size_batch),
        T(test_struct_size_tensors),
        T(test_struct_size_schedule_info),
        T(test_bad_num_heads),
        T(test_bad_head_dims),
        T(test_bad_page_size),
        T(test_bad_max_q_len),
        T(test_bad_scalars),
        T(test_unknown_flags),
        T(test_unsupported_dtypes),
        T(test_qo_indptr_not_monotonic),
        T(test_qo_indptr_nonzero_start),
        T(test_kv_indptr_not_monotonic),
        T(test_kv_indptr_nonzero_start),
        T(test_kv_len_overflow),
        T(test_last_page_len_zero),
        T(test_last_page_len_above_page_size),
        T(test_q_len_above_max),
        T(test_batch_above_max),
        T(test_negative_batch_size),
        T(test_device_batch_on_cpu_plan),
        T(test_execute_before_metadata),
        T(test_execute_after_failed_metadata),
        T(test_page_out_of_range),
        T(test_identity_pages_out_of_range),
        T(test_misaligned),
        T(test_bad_tensor_scalars),
        T(test_workspace_too_small),
        T(test_caller_workspace_missing),
        T(test_gpu_backend_unavailable),
        cmocka_unit_test(test_destroy_null),
        cmocka_unit_test(test_status_strings),
        cmocka_unit_test(test_version),
        T(test_message_cleared_on_success),
        T(test_message_is_per_thread),
    };
    tu_seed();
    return cmocka_run_group_tests_name("errors", tests, NULL, NULL);
}
