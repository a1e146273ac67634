/*
 * libFuzzer harness over the whole host-side C API of libmla on the CPU
 * backend: mla_plan_create, mla_plan_build_metadata, mla_plan_execute and
 * the small queries around them.
 *
 * The input bytes are read, front to back, as the fields of a descriptor, of
 * one to three decode steps (batch arrays) and of the tensors of one or two
 * execute calls per step. Most bytes map to valid values (so the fuzzer gets
 * deep), a few to hostile ones: invalid enum values, out-of-range counts,
 * non-monotonic or overflowing indptr arrays, bad last_page_len, page indices
 * outside the cache, NaN / negative scales, misaligned or NULL pointers,
 * short workspaces, struct_size variations (short, long with a zero tail,
 * long with a non-zero tail). Exhausted input reads as zero = the defaults.
 *
 * The harness keeps the caller's side of the contract exactly: every buffer
 * is allocated with the size that the (accepted) batch implies, and no more
 * (q and out: qo_indptr[batch] rows; kv and the MXFP4 scales: the true page
 * count, always passed in num_pages, or num_pages = 0 only when the harness
 * itself has checked that every page the batch reads exists; kv_indices:
 * kv_indptr[batch] entries; indptr arrays: batch_size + 1 entries; each
 * descriptor struct: exactly struct_size bytes). So any read or write of the
 * library outside them is an AddressSanitizer report.
 *
 * Oracles, beyond the sanitizers:
 *   - the harness knows which of the values it produced are invalid, and so
 *     whether each call must succeed; a refusal of valid input, or acceptance
 *     of invalid input, aborts (so does a failed call that leaves no message,
 *     a successful one that leaves one, or a failed create that leaves *plan
 *     non-NULL);
 *   - execute after a refused build_metadata must say MLA_ERROR_NO_METADATA;
 *   - after a successful execute on finite data: every row of out written
 *     (out is poisoned with NaN first and unread KV rows hold NaN encodings,
 *     so a read of a row the batch does not own shows as NaN), rows without
 *     a visible key are exactly 0 / -inf, and out / lse agree with the
 *     float64 reference of tests/reference.c within the CPU suite's
 *     tolerances; a second execute on the same metadata is bitwise equal.
 * Shapes stay tiny (work per input is capped) so one input runs in
 * milliseconds even under ASan.
 *
 * Build: tests/fuzz/build.sh (clang -fsanitize=fuzzer,address,undefined).
 * The same file built with -DMLA_FUZZ_REPLAY_MAIN (tests/fuzz/replay.c)
 * replays the committed corpus in the normal test suite.
 */
#define _POSIX_C_SOURCE 200809L /* posix_memalign */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mla.h>

#include "../reference.h"
#include "../testutil.h"

#define DQK MLA_HEAD_DIM_QK
#define DV MLA_HEAD_DIM_V

/* Bounds that keep one input cheap. */
#define WORK_BUDGET 10000     /* sum over sequences of q_len * heads * kv_len */
#define MAX_ROWS_ALLOC 12288  /* KV rows (pages * page_size) the harness allocates */
#define MAX_TABLE 65536       /* explicit page-table entries the harness allocates */
#define MAX_WORKSPACE_EST (16u << 20)

/* ---- statistics (MLA_FUZZ_STATS=1 prints them at exit) ------------------------- */

static struct {
    unsigned long inputs, creates_ok, builds, builds_ok, executes, executes_ok, compared, rows, splits_gt1, long_seqs;
} g_stats;

static void print_stats(void) {
    fprintf(stderr,
            "fuzz_api stats: %lu inputs, %lu plans created, %lu/%lu builds accepted, %lu/%lu executes accepted, "
            "%lu checked against the reference (%lu rows), %lu schedules with splits, %lu with >64 blocks\n",
            g_stats.inputs, g_stats.creates_ok, g_stats.builds_ok, g_stats.builds, g_stats.executes_ok,
            g_stats.executes, g_stats.compared, g_stats.rows, g_stats.splits_gt1, g_stats.long_seqs);
}

/* ---- reading the input -------------------------------------------------------- */

typedef struct rd {
    const uint8_t *p;
    size_t n, i;
} rd;

static uint8_t r8(rd *r) { return r->i < r->n ? r->p[r->i++] : 0; }
static uint32_t r32(rd *r) {
    uint32_t v = r8(r);
    v |= (uint32_t)r8(r) << 8;
    v |= (uint32_t)r8(r) << 16;
    return v | (uint32_t)r8(r) << 24;
}
static uint64_t r64(rd *r) { return (uint64_t)r32(r) | (uint64_t)r32(r) << 32; }

/* One of `ok` most of the time (byte < 256 - bad_rate), else one of `bad`, or
 * (1 in 8 of those) any 32-bit value. `*is_bad` is set when the value came
 * from the bad side (the caller decides whether it is really invalid). */
static int32_t gen(rd *r, const int32_t *ok, int nok, const int32_t *bad, int nbad, int bad_rate, int *is_bad) {
    const uint8_t b = r8(r);
    if (b < 256 - bad_rate || nbad == 0) return ok[b % nok];
    *is_bad = 1;
    {
        const uint8_t c = r8(r);
        if (c < 32) return (int32_t)r32(r);
        return bad[c % nbad];
    }
}

#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---- checks ------------------------------------------------------------------- */

static void die(const char *what, mla_status st) {
    fprintf(stderr, "fuzz_api: %s (status %s, message \"%s\")\n", what, mla_status_string(st), mla_last_error_message());
    fflush(stderr);
    abort();
}

static int g_verbose = -1; /* MLA_FUZZ_VERBOSE=1: print every checked call */

/* A call that must succeed (want = 1) or be refused (want = 0). */
static void expect(const char *call, mla_status st, int want_ok) {
    if (g_verbose < 0) g_verbose = getenv("MLA_FUZZ_VERBOSE") != NULL;
    if (g_verbose)
        fprintf(stderr, "  %s -> %s %s\n", call, mla_status_string(st), mla_last_error_message());
    if (want_ok && st != MLA_SUCCESS) die(call, st);
    if (!want_ok && st == MLA_SUCCESS) die(call, st);
    if (st == MLA_SUCCESS && mla_last_error_message()[0] != '\0') die("success left an error message", st);
    if (st != MLA_SUCCESS && mla_last_error_message()[0] == '\0') die("refusal without a message", st);
    if (mla_status_string(st) == NULL) die("mla_status_string returned NULL", st);
}

/* ---- exactly sized buffers ---------------------------------------------------- */

typedef struct xbuf {
    void *base;
    uint8_t *p; /* base + offset: exactly n bytes are the caller's */
    size_t n;
} xbuf;

/* n bytes starting `offset` bytes past a 16-byte boundary; allocation ends
 * exactly at p + n so ASan sees any overrun. */
static void xalloc(xbuf *b, size_t n, size_t offset) {
    b->base = NULL;
    if (posix_memalign(&b->base, 16, n + offset ? n + offset : 1) != 0 || !b->base) {
        fprintf(stderr, "fuzz_api: harness out of memory (%zu bytes)\n", n);
        abort();
    }
    b->p = (uint8_t *)b->base + offset;
    b->n = n;
}

static void xfree(xbuf *b) {
    free(b->base);
    b->base = NULL;
    b->p = NULL;
    b->n = 0;
}

/* A descriptor struct of `size` bytes (at least the size field) holding a
 * copy of `src`, with `extra` bytes beyond sizeof filled with `tail_byte`. */
static void *make_struct(const void *src, size_t real, size_t size, uint8_t tail_byte, xbuf *b) {
    const size_t alloc = size < sizeof(size_t) ? sizeof(size_t) : size;
    xalloc(b, alloc, 0);
    memset(b->p, tail_byte, alloc);
    memcpy(b->p, src, real < alloc ? real : alloc);
    memcpy(b->p, &size, sizeof size); /* struct_size */
    return b->p;
}

/* struct_size variation: returns the size to use and whether it is valid. */
static size_t gen_struct_size(rd *r, size_t real, uint8_t *tail, int *bad) {
    const uint8_t b = r8(r);
    *tail = 0;
    if (b < 236) return real;
    switch (b % 8) {
        case 0: *bad = 1; return 0;
        case 1: *bad = 1; return real - 1;
        case 2: *bad = 1; return sizeof(size_t);
        case 3: return real + 8; /* newer header, zero tail */
        case 4: return real + 1 + (r8(r) % 40);
        case 5: *bad = 1; *tail = (uint8_t)(1 + r8(r) % 255); return real + 1 + (r8(r) % 40);
        case 6: *bad = 1; return real / 2;
        default: return real;
    }
}

/* ---- data ---------------------------------------------------------------------- */

static int is_fp8(int32_t d) { return d == MLA_DTYPE_FP8_E4M3 || d == MLA_DTYPE_FP8_E4M3_FNUZ; }

static void poison_kv_row(int32_t kvd, uint8_t *row, size_t row_bytes, uint8_t *scales, int stride) {
    if (kvd == MLA_DTYPE_BF16) memset(row, 0xff, row_bytes);
    else if (is_fp8(kvd)) memset(row, tu_fp8_nan((mla_dtype)kvd), row_bytes);
    else {
        size_t i;
        for (i = 0; i < row_bytes; ++i) row[i] = (uint8_t)(0x77 ^ i);
        memset(scales, 0xff, (size_t)stride);
    }
}

/* tu_fill_random into memory of any alignment (the misaligned-pointer inputs). */
static void fill_random(tu_rng *rng, int32_t dtype, uint8_t *dst, size_t n) {
    const size_t bytes = n * (dtype == MLA_DTYPE_BF16 ? 2 : 1);
    if (((uintptr_t)dst & 1) == 0) {
        tu_fill_random(rng, (mla_dtype)dtype, dst, n, 1.0);
    } else {
        void *tmp = malloc(bytes ? bytes : 1);
        if (!tmp) abort();
        tu_fill_random(rng, (mla_dtype)dtype, tmp, n, 1.0);
        memcpy(dst, tmp, bytes);
        free(tmp);
    }
}

static void random_kv_row(int32_t kvd, uint8_t *row, size_t row_bytes, uint8_t *scales, tu_rng *rng) {
    size_t i;
    if (kvd == MLA_DTYPE_MXFP4) {
        for (i = 0; i < row_bytes; ++i) row[i] = (uint8_t)tu_next(rng);
        for (i = 0; i < MLA_MXFP4_SCALES_PER_ROW; ++i) scales[i] = (uint8_t)tu_range(rng, 123, 127);
    } else {
        fill_random(rng, kvd, row, DQK);
    }
}

/* ---- one input ------------------------------------------------------------------ */

typedef struct shape {
    int32_t heads, qd, kvd, ps, max_batch, max_q_len, splits, threads;
    uint32_t flags;
    float sm_scale, cap;
    int moderate; /* scores of moderate size: the reference comparison applies */
} shape;

/* Lengths of the last accepted batch (what execute's buffers are sized from). */
typedef struct step {
    int ok; /* build_metadata accepted it */
    int32_t n;
    int32_t *qo, *kv, *last; /* exactly sized copies the library read */
    int last_null;
    int32_t total_q, total_pages;
    int big; /* kv_indptr beyond what the harness can back with memory */
} step;

static void step_free(step *s) {
    free(s->qo);
    free(s->kv);
    free(s->last);
    memset(s, 0, sizeof *s);
}

static int32_t seq_len(const step *s, const shape *sh, int b) {
    const int32_t pages = s->kv[b + 1] - s->kv[b];
    const int32_t last = s->last_null ? sh->ps : s->last[b];
    return pages == 0 ? 0 : (pages - 1) * sh->ps + last;
}

/* Build the batch arrays of one step from the input and call build_metadata. */
static void do_build(rd *r, mla_plan *plan, const shape *sh, step *s) {
    static const int32_t bad_bs[] = {-1, INT32_MIN, 65537};
    mla_batch batch, *bp;
    xbuf qo, kv, last, sb;
    uint8_t tail;
    int bad = 0, bad_size = 0;
    int32_t n, alloc_n, b, work = 0, long_done = 0;
    int64_t q_end = 0, p_end = 0; /* running indptr values, before clamping */
    const uint8_t mode = r8(r);
    size_t size;
    mla_status st;

    step_free(s);
    {
        const uint8_t c = r8(r);
        const int32_t cap = sh->max_batch < 24 ? sh->max_batch : 24;
        if (c < 248) n = c % (cap + 1);
        else if (c < 252) n = sh->max_batch + 1, bad = 1;
        else n = bad_bs[c % N_OF(bad_bs)], bad = 1;
        if (n > sh->max_batch) bad = 1;
    }
    alloc_n = n < 0 ? 0 : (n > sh->max_batch ? (sh->max_batch < 64 ? sh->max_batch : 64) : n);
    xalloc(&qo, (size_t)(alloc_n + 1) * 4, 0);
    xalloc(&kv, (size_t)(alloc_n + 1) * 4, 0);
    xalloc(&last, (size_t)alloc_n * 4, 0);
    ((int32_t *)qo.p)[0] = 0;
    ((int32_t *)kv.p)[0] = 0;
    const int last_null = (mode & 0x18) == 0x18;
    for (b = 0; b < alloc_n; ++b) {
        const uint8_t cq = r8(r), ck = r8(r), cl = r8(r);
        int32_t q_len, lastlen;
        int64_t pages;
        int32_t *qv = (int32_t *)qo.p, *kvv = (int32_t *)kv.p, *lv = (int32_t *)last.p;
        /* q_len */
        if (cq < 250) q_len = cq % (sh->max_q_len + 1);
        else if (cq < 253) q_len = sh->max_q_len + 1;
        else q_len = -1 - (cq & 1);
        /* pages */
        if (ck < 240) {
            const int32_t max_tokens = 160;
            const int32_t maxp = max_tokens / sh->ps > 1 ? max_tokens / sh->ps : 1;
            pages = ck % (maxp + 1);
        } else if (ck < 248 && !long_done && sh->heads * sh->max_q_len <= 16) {
            /* a long sequence (up to 66 blocks of 64: real 64-way splits) */
            const int32_t tokens = 65 + (int32_t)(r8(r) * 16) + (int32_t)(r8(r) & 15);
            pages = (tokens + sh->ps - 1) / sh->ps;
            long_done = 1;
        } else if (ck < 252) {
            pages = -1 - (ck & 1); /* decreasing kv_indptr */
        } else if (ck < 254) {
            pages = INT32_MAX - p_end; /* kv_indptr = INT32_MAX: length overflow or cache range */
        } else {
            /* kv_len just above 2^31 tokens */
            const int64_t want = (int64_t)2147483648 / sh->ps + 1 - p_end;
            pages = want < 1 ? 1 : want;
        }
        /* last page fill */
        if (cl < 248) lastlen = 1 + cl % sh->ps;
        else if (cl < 251) lastlen = 0;
        else if (cl < 253) lastlen = sh->ps + 1;
        else if (cl < 254) lastlen = -1;
        else lastlen = INT32_MAX;
        /* the work budget (valid sequences only: invalid ones are refused) */
        if (q_len > 0 && pages > 0 && pages < (1 << 20)) {
            const int32_t fill = !last_null && lastlen >= 1 && lastlen <= sh->ps ? lastlen : sh->ps;
            int64_t tokens = (int64_t)(pages - 1) * sh->ps + fill;
            if (work + tokens * q_len * sh->heads > WORK_BUDGET) {
                pages = 0; /* over budget: make it an empty sequence */
                tokens = 0;
            }
            work += (int32_t)(tokens * q_len * sh->heads);
        }
        q_end += q_len;
        p_end += pages;
        if (p_end > INT32_MAX) p_end = INT32_MAX;
        qv[b + 1] = (int32_t)q_end; /* |q_end| <= 2 * 64 */
        kvv[b + 1] = (int32_t)(p_end < INT32_MIN ? INT32_MIN : p_end);
        lv[b] = lastlen;
    }
    /* rare corruption of the first entries */
    if (mode >= 250) {
        if (mode & 1) ((int32_t *)qo.p)[0] = (mode & 2) ? 1 : -1;
        else ((int32_t *)kv.p)[0] = (mode & 2) ? 1 : -1;
    }

    /* validity of what was written (mirrors the documented rules) */
    {
        const int32_t *qv = (const int32_t *)qo.p, *kvv = (const int32_t *)kv.p, *lv = (const int32_t *)last.p;
        if (qv[0] != 0 || kvv[0] != 0) bad = 1;
        for (b = 0; b < alloc_n && !bad; ++b) {
            const int32_t ql = qv[b + 1] - qv[b], pg = kvv[b + 1] - kvv[b];
            const int32_t ll = last_null ? sh->ps : lv[b];
            if (ql < 0 || ql > sh->max_q_len || pg < 0) bad = 1;
            else if (pg > 0 && (ll < 1 || ll > sh->ps)) bad = 1;
            else if (pg > 0 && (int64_t)(pg - 1) * sh->ps + ll > INT32_MAX) bad = 1;
        }
        mla_batch_init(&batch);
        batch.batch_size = n;
        batch.qo_indptr = (const int32_t *)qo.p;
        batch.kv_indptr = (const int32_t *)kv.p;
        batch.kv_last_page_len = last_null ? NULL : (const int32_t *)last.p;
        s->last_null = last_null;
        if (mode >= 240 && mode < 250) {
            switch (mode % 5) {
                case 0: batch.qo_indptr = NULL; bad = 1; break;
                case 1: batch.kv_indptr = NULL; bad = 1; break;
                case 2: batch.memory = MLA_MEMORY_DEVICE; bad = 1; break; /* CPU plan */
                case 3: batch.memory = (mla_memory)(2 + (mode & 7)); bad = 1; break;
                default: batch.memory = (mla_memory)-1; bad = 1; break;
            }
        }
    }
    size = gen_struct_size(r, sizeof batch, &tail, &bad_size);
    bp = (mla_batch *)make_struct(&batch, sizeof batch, size, tail, &sb);
    st = mla_plan_build_metadata(plan, bp, NULL);
    expect("mla_plan_build_metadata", st, !bad && !bad_size);
    g_stats.builds++;
    g_stats.builds_ok += st == MLA_SUCCESS;
    xfree(&sb);

    if (st == MLA_SUCCESS) {
        mla_schedule_info info, *ip;
        xbuf ib;
        int bad_info = 0;
        s->ok = 1;
        s->n = n;
        s->qo = (int32_t *)malloc((size_t)(n + 1) * 4);
        s->kv = (int32_t *)malloc((size_t)(n + 1) * 4);
        s->last = (int32_t *)malloc((size_t)n * 4 + 4);
        memcpy(s->qo, qo.p, (size_t)(n + 1) * 4);
        memcpy(s->kv, kv.p, (size_t)(n + 1) * 4);
        memcpy(s->last, last.p, (size_t)n * 4);
        s->total_q = s->qo[n];
        s->total_pages = s->kv[n];
        s->big = s->total_pages > MAX_TABLE;
        mla_schedule_info_init(&info);
        size = gen_struct_size(r, sizeof info, &tail, &bad_info);
        ip = (mla_schedule_info *)make_struct(&info, sizeof info, size, tail, &ib);
        st = mla_plan_schedule_info(plan, ip);
        expect("mla_plan_schedule_info", st, !bad_info);
        if (st == MLA_SUCCESS) {
            if (ip->num_work_items < 0 || ip->max_splits < 0 || ip->max_splits > MLA_MAX_SPLITS ||
                (sh->splits > 0 && ip->max_splits > sh->splits) || ip->num_split_rows > ip->num_work_items)
                die("implausible schedule info", st);
            g_stats.splits_gt1 += ip->max_splits > 1;
        }
        xfree(&ib);
    } else {
        s->ok = 0;
    }
    xfree(&qo);
    xfree(&kv);
    xfree(&last);
}

/* Execute calls of one step. */
static void do_execute(rd *r, mla_plan *plan, const shape *sh, const step *s, uint64_t seed) {
    static const int32_t ok_stride[] = {0, 0, 0, 18, 19, 32, 64};
    static const int32_t bad_stride[] = {17, 1, -1, 4097, INT32_MIN};
    const uint8_t mode = r8(r), mode2 = r8(r), mode3 = r8(r);
    const size_t q_row = ref_q_row_bytes((mla_dtype)sh->qd), kv_row = ref_kv_row_bytes((mla_dtype)sh->kvd);
    const int mx = sh->kvd == MLA_DTYPE_MXFP4;
    int bad = 0, moderate = sh->moderate, explicit_table, stride_bad = 0;
    int32_t stride, true_pages, b, slot;
    int64_t num_pages;
    float q_scale = 0.0f, kv_scale = 0.0f;
    xbuf q, kvb, sc, out, lse, ws, tab, tb;
    size_t need = 0, total_rows, kv_rows, size;
    uint8_t tail;
    mla_tensors t, *tp;
    mla_status st;
    tu_rng rng;
    int reads_all_valid = 1, bad_size = 0;

    memset(&q, 0, sizeof q);
    memset(&kvb, 0, sizeof kvb);
    memset(&sc, 0, sizeof sc);
    memset(&out, 0, sizeof out);
    memset(&lse, 0, sizeof lse);
    memset(&ws, 0, sizeof ws);
    memset(&tab, 0, sizeof tab);
    tu_rng_init(&rng, seed);
    mla_tensors_init(&t);

    if (!s->ok) {
        /* No metadata (never built, or the last build was refused). */
        uint8_t dummy[64] __attribute__((aligned(16)));
        memset(dummy, 0, sizeof dummy);
        t.q = t.kv = t.out = dummy;
        t.kv_block_scales = dummy;
        st = mla_plan_execute(plan, &t, NULL);
        if (st != MLA_ERROR_NO_METADATA) die("execute without metadata", st);
        return;
    }

    stride = gen(r, ok_stride, N_OF(ok_stride), bad_stride, N_OF(bad_stride), 6, &stride_bad);
    if (stride != 0 && (stride < 18 || stride > 4096)) stride_bad = 1;
    else stride_bad = 0;
    bad |= stride_bad;

    /* Scales: moderate ones, extreme but valid ones, invalid ones. */
    {
        static const float ok_sc[] = {0.0f, 0.5f, 1.0f, 0.25f, 0.75f, -0.0f};
        static const float ext_sc[] = {1e-30f, 1e30f, 3.4e38f, 1e-45f, 65536.0f};
        const uint8_t c1 = r8(r), c2 = r8(r);
        float *dst[2] = {&q_scale, &kv_scale};
        const uint8_t cs[2] = {c1, c2};
        int k;
        for (k = 0; k < 2; ++k) {
            const uint8_t c = cs[k];
            if (c < 236) *dst[k] = ok_sc[c % N_OF(ok_sc)];
            else if (c < 246) *dst[k] = ext_sc[c % N_OF(ext_sc)], moderate = 0;
            else {
                static const float bad_sc[] = {-1.0f, -1e-30f, NAN, INFINITY, -INFINITY, -NAN};
                *dst[k] = bad_sc[c % N_OF(bad_sc)];
                bad = 1;
            }
        }
    }

    /* Page table and the cache's true page count. */
    explicit_table = (mode & 1) && !s->big;
    {
        const uint8_t c = r8(r);
        int64_t tp;
        if (!explicit_table) {
            int32_t spare = c % 4;
            if (c >= 240) spare = -1 - (c % 3); /* short cache */
            tp = (int64_t)s->total_pages + spare;
        } else {
            tp = 1 + c % 48;
        }
        if (tp < 1) tp = 1;
        if (tp * sh->ps > MAX_ROWS_ALLOC) tp = MAX_ROWS_ALLOC / sh->ps;
        true_pages = (int32_t)(tp < 1 ? 1 : tp);
    }
    if (explicit_table) {
        xalloc(&tab, (size_t)s->total_pages * 4, 0);
        for (slot = 0; slot < s->total_pages; ++slot) {
            const uint8_t c = r8(r);
            int32_t v;
            if (c < 250) v = c % true_pages;
            else {
                static const int32_t badp[] = {-1, INT32_MIN, INT32_MAX, 0};
                v = (c & 3) == 3 ? true_pages + (c & 4) : badp[c & 3];
            }
            ((int32_t *)tab.p)[slot] = v;
        }
    }
    /* Which pages are read, and are they all in the cache? */
    for (b = 0; b < s->n; ++b) {
        const int32_t ql = s->qo[b + 1] - s->qo[b];
        const int32_t p0 = s->kv[b], p1 = s->kv[b + 1];
        if (!explicit_table) continue;
        if (ql == 0) continue;
        for (slot = p0; slot < p1; ++slot) {
            const int32_t v = ((int32_t *)tab.p)[slot];
            if (v < 0) bad = 1;           /* refused whatever num_pages says */
            if (v < 0 || v >= true_pages) reads_all_valid = 0;
        }
    }
    if (!explicit_table && s->n > 0 && s->total_pages > true_pages) reads_all_valid = 0;
    /* num_pages: the true count; 0 (unchecked) only when every read page exists. */
    {
        const uint8_t c = r8(r);
        num_pages = true_pages;
        if (c >= 200 && c < 240 && (reads_all_valid || (explicit_table && bad))) num_pages = 0;
        else if (c >= 250) {
            num_pages = (c & 1) ? -1 : INT64_MIN;
            bad = 1;
        }
        if (num_pages > 0 && !reads_all_valid) bad = 1;
        if (num_pages == 0 && !reads_all_valid && !bad) abort(); /* harness bug */
    }

    /* Buffers, exactly sized. */
    total_rows = (size_t)s->total_q * (size_t)sh->heads;
    kv_rows = (size_t)true_pages * (size_t)sh->ps;
    {
        const int32_t eff_stride = stride == 0 || stride_bad ? MLA_MXFP4_SCALES_PER_ROW : stride;
        size_t off_q = 0, off_kv = 0, off_out = 0, off_lse = 0;
        if (mode2 >= 248) {
            const size_t off = 1 + (mode2 & 7) * 2; /* 1..15, never 0 or 16 */
            switch (mode2 % 4) {
                case 0: off_q = off; break;
                case 1: off_kv = off; break;
                case 2: off_out = off; break;
                default: off_lse = 1 + (mode2 & 1) * 2; break;
            }
            if (off_lse == 0 || !(mode & 2)) bad = 1; /* a NULL lse has no alignment */
        }
        xalloc(&q, total_rows * q_row, off_q);
        xalloc(&kvb, kv_rows * kv_row, off_kv);
        if (mx) xalloc(&sc, kv_rows * (size_t)eff_stride, 0);
        xalloc(&out, total_rows * DV * 2, off_out);
        if (!(mode & 2)) xalloc(&lse, total_rows * 4, off_lse);

        /* data: unread rows poisoned, read rows random and finite */
        {
            size_t row;
            for (row = 0; row < kv_rows; ++row)
                poison_kv_row(sh->kvd, kvb.p + row * kv_row, kv_row, mx ? sc.p + row * (size_t)eff_stride : NULL,
                              eff_stride);
            for (b = 0; b < s->n; ++b) {
                const int32_t ql = s->qo[b + 1] - s->qo[b], len = seq_len(s, sh, b);
                int32_t j;
                if (ql == 0 || !reads_all_valid) continue;
                for (j = 0; j < len; ++j) {
                    const int32_t sl = s->kv[b] + j / sh->ps;
                    const int32_t page = explicit_table ? ((int32_t *)tab.p)[sl] : sl;
                    const size_t rr = (size_t)page * (size_t)sh->ps + (size_t)(j % sh->ps);
                    random_kv_row(sh->kvd, kvb.p + rr * kv_row, kv_row, mx ? sc.p + rr * (size_t)eff_stride : NULL,
                                  &rng);
                }
            }
            fill_random(&rng, sh->qd, q.p, total_rows * DQK);
        }
        t.q = q.p;
        t.kv = kvb.p;
        t.kv_block_scales = mx ? sc.p : NULL;
        t.kv_indices = explicit_table ? (const int32_t *)tab.p : NULL;
        t.out = out.p;
        t.lse = (mode & 2) ? NULL : (float *)lse.p;
        t.q_scale = q_scale;
        t.kv_scale = kv_scale;
        t.kv_scale_stride = stride;
        t.num_pages = num_pages;
        if (mode3 >= 244) {
            switch (mode3 % 4) {
                case 0: t.q = NULL; break;
                case 1: t.kv = NULL; break;
                case 2: t.out = NULL; break;
                default:
                    if (mx) t.kv_block_scales = NULL;
                    else t.kv_block_scales = q.p; /* ignored for other dtypes */
                    break;
            }
            if (mode3 % 4 != 3 || mx) bad = 1;
        }
    }

    /* Workspace. */
    if (mla_plan_workspace_size(plan, &need) != MLA_SUCCESS) die("mla_plan_workspace_size", MLA_ERROR_INTERNAL);
    {
        const uint8_t c = r8(r);
        const int caller = (sh->flags & MLA_FLAG_CALLER_WORKSPACE) != 0;
        const int give = caller ? c < 240 : c >= 160;
        if (give) {
            size_t n_ws = need, off = 0;
            if (c >= 230 && c < 240) {
                n_ws = need - 1 - (c % 3 == 0 ? 0 : need / 2);
                bad = 1;
            } else if (c % 7 == 1) {
                n_ws = need + 1 + (c % 64);
            }
            if (c % 11 == 5) {
                off = 4 + (c & 8);
                bad = 1;
            }
            xalloc(&ws, n_ws, off);
            memset(ws.p, 0xff, n_ws < (4u << 20) ? n_ws : (4u << 20)); /* partials are written before read */
            t.workspace = ws.p;
            t.workspace_size = n_ws;
        } else if (caller) {
            bad = 1;
        }
    }

    size = gen_struct_size(r, sizeof t, &tail, &bad_size);
    tp = (mla_tensors *)make_struct(&t, sizeof t, size, tail, &tb);
    memset(out.p, 0xff, out.n);
    if (lse.p) memset(lse.p, 0xff, lse.n);
    st = mla_plan_execute(plan, tp, NULL);
    expect("mla_plan_execute", st, !bad && !bad_size);
    g_stats.executes++;
    g_stats.executes_ok += st == MLA_SUCCESS;
    if (st == MLA_SUCCESS)
        for (b = 0; b < s->n; ++b)
            if (s->qo[b + 1] > s->qo[b] && seq_len(s, sh, b) > 64 * 64) {
                g_stats.long_seqs++;
                break;
            }

    if (st == MLA_SUCCESS) {
        const uint16_t *o = (const uint16_t *)out.p;
        const float *l = (const float *)lse.p;
        if (moderate && tu_count_bf16_nan(o, total_rows * DV)) die("out holds NaN after execute on finite data", st);
        if (moderate && l && tu_count_f32_nan(l, total_rows)) die("lse holds NaN after execute on finite data", st);
        if (moderate && total_rows > 0) {
            ref_problem p;
            double *ro = (double *)malloc(total_rows * DV * sizeof(double));
            double *rl = (double *)malloc(total_rows * sizeof(double));
            double *vm = (double *)malloc(total_rows * sizeof(double));
            double *sg = (double *)malloc(total_rows * sizeof(double));
            static const tu_tol tol = {0x1p-7, 0x1p-9, 1e-4, 1e-4, 0x1p-16};
            tu_cmp cmp;
            memset(&p, 0, sizeof p);
            p.num_heads = sh->heads;
            p.q_dtype = (mla_dtype)sh->qd;
            p.kv_dtype = (mla_dtype)sh->kvd;
            p.page_size = sh->ps;
            p.sm_scale = sh->sm_scale;
            p.logit_cap = sh->cap;
            p.batch_size = s->n;
            p.qo_indptr = s->qo;
            p.kv_indptr = s->kv;
            p.kv_last_page_len = s->last_null ? NULL : s->last;
            p.kv_indices = t.kv_indices;
            p.q = q.p;
            p.kv = kvb.p;
            p.kv_block_scales = mx ? sc.p : NULL;
            p.kv_scale_stride = stride;
            p.q_scale = q_scale;
            p.kv_scale = kv_scale;
            if (!ro || !rl || !vm || !sg) abort();
            if (ref_attention(&p, ro, rl, vm, sg) != 0) die("reference refused the problem (harness bug)", st);
            tu_cmp_init(&cmp);
            if (tu_compare("fuzz", o, l, ro, rl, vm, sg, total_rows, &tol, &cmp, 4))
                die("output differs from the float64 reference", st);
            g_stats.compared++;
            g_stats.rows += total_rows;
            free(ro);
            free(rl);
            free(vm);
            free(sg);
        }
        /* Again on the same metadata: bitwise the same. */
        if ((mode & 4) && total_rows > 0) {
            uint8_t *o1 = (uint8_t *)malloc(out.n), *l1 = (uint8_t *)malloc(lse.n + 1);
            if (!o1 || !l1) abort();
            memcpy(o1, out.p, out.n);
            if (lse.p) memcpy(l1, lse.p, lse.n);
            memset(out.p, 0xff, out.n);
            st = mla_plan_execute(plan, tp, NULL);
            expect("second mla_plan_execute", st, 1);
            if (memcmp(o1, out.p, out.n) != 0) die("second execute: out differs", st);
            if (lse.p && memcmp(l1, lse.p, lse.n) != 0) die("second execute: lse differs", st);
            free(o1);
            free(l1);
        }
    }
    xfree(&tb);
    xfree(&q);
    xfree(&kvb);
    xfree(&sc);
    xfree(&out);
    xfree(&lse);
    xfree(&ws);
    xfree(&tab);
}

/* The descriptor. Returns whether it is valid. */
static int gen_desc(rd *r, mla_plan_desc *d, shape *sh) {
    static const int32_t ok_heads[] = {1, 2, 3, 4, 5, 7, 8, 16, 1, 2, 16, 11, 32, 64, 100, 128};
    static const int32_t bad_heads[] = {0, -1, 129, INT32_MIN, INT32_MAX};
    static const int32_t ok_dim_qk[] = {0, 0, 0, 576};
    static const int32_t ok_dim_v[] = {0, 0, 0, 512};
    static const int32_t bad_dim[] = {-1, 1, 512, 576, 575, 513, 1024};
    static const int32_t ok_dtype[] = {0, 1, 2, 3, 4};
    static const int32_t bad_dtype[] = {5, 6, 7, 8, 255, -1, 0x7fffffff, 256};
    static const int32_t ok_out[] = {0, 1};
    static const int32_t bad_out[] = {2, 3, 4, 5, 6, -1, 99};
    static const int32_t ok_ps[] = {1, 16, 64, 0, 2, 4, 8, 32, 128, 256};
    static const int32_t bad_ps[] = {-1, 3, 6, 48, 257, 512, 1024, INT32_MIN, 0x40000000};
    static const int32_t ok_mb[] = {4, 1, 2, 3, 8, 16, 5, 0};
    static const int32_t bad_mb[] = {-1, 65537, INT32_MIN, INT32_MAX, 1 << 20};
    static const int32_t ok_mq[] = {1, 0, 2, 4, 8, 3};
    static const int32_t bad_mq[] = {9, -1, 16, INT32_MIN};
    static const int32_t ok_sp[] = {0, 0, 0, 1, 2, 3, 7, 64};
    static const int32_t bad_sp[] = {-1, 65, INT32_MIN, INT32_MAX};
    static const int32_t ok_be[] = {MLA_BACKEND_CPU, MLA_BACKEND_AUTO};
    static const int32_t bad_be[] = {3, -1, 255};
    static const int32_t ok_th[] = {1, 2, 1, 2, 3, 0};
    static const int32_t bad_th[] = {-1, 1025, INT32_MIN};
    int bad = 0, b;
    const uint8_t fsel = r8(r), ssel = r8(r), csel = r8(r), dsel = r8(r);

    mla_plan_desc_init(d);
    b = 0, d->num_heads = gen(r, ok_heads, N_OF(ok_heads), bad_heads, N_OF(bad_heads), 6, &b);
    bad |= d->num_heads < 1 || d->num_heads > 128;
    b = 0, d->head_dim_qk = gen(r, ok_dim_qk, N_OF(ok_dim_qk), bad_dim, N_OF(bad_dim), 4, &b);
    bad |= d->head_dim_qk != 0 && d->head_dim_qk != 576;
    b = 0, d->head_dim_v = gen(r, ok_dim_v, N_OF(ok_dim_v), bad_dim, N_OF(bad_dim), 4, &b);
    bad |= d->head_dim_v != 0 && d->head_dim_v != 512;
    {
        int32_t qd = gen(r, ok_dtype, 4 /* no MXFP4 for q */, bad_dtype, N_OF(bad_dtype), 8, &b);
        int32_t kvd = gen(r, ok_dtype, N_OF(ok_dtype), bad_dtype, N_OF(bad_dtype), 8, &b);
        int32_t od = gen(r, ok_out, N_OF(ok_out), bad_out, N_OF(bad_out), 6, &b);
        if ((fsel & 0xf0) == 0xf0) qd = MLA_DTYPE_MXFP4; /* refused for Q */
        d->q_dtype = (mla_dtype)qd;
        d->kv_dtype = (mla_dtype)kvd;
        d->out_dtype = (mla_dtype)od;
        sh->qd = qd == 0 ? MLA_DTYPE_BF16 : qd;
        sh->kvd = kvd == 0 ? MLA_DTYPE_BF16 : kvd;
        bad |= !(sh->qd == MLA_DTYPE_BF16 || is_fp8(sh->qd));
        bad |= !(sh->kvd == MLA_DTYPE_BF16 || is_fp8(sh->kvd) || sh->kvd == MLA_DTYPE_MXFP4);
        bad |= is_fp8(sh->qd) && is_fp8(sh->kvd) && sh->qd != sh->kvd;
        bad |= od != 0 && od != MLA_DTYPE_BF16;
    }
    d->page_size = gen(r, ok_ps, N_OF(ok_ps), bad_ps, N_OF(bad_ps), 6, &b);
    sh->ps = d->page_size == 0 ? 1 : d->page_size;
    bad |= sh->ps < 1 || sh->ps > 256 || (sh->ps & (sh->ps - 1)) != 0;
    d->max_batch_size = gen(r, ok_mb, N_OF(ok_mb), bad_mb, N_OF(bad_mb), 6, &b);
    sh->max_batch = d->max_batch_size == 0 ? 256 : d->max_batch_size;
    bad |= sh->max_batch < 1 || sh->max_batch > 65536;
    d->max_q_len = gen(r, ok_mq, N_OF(ok_mq), bad_mq, N_OF(bad_mq), 6, &b);
    sh->max_q_len = d->max_q_len == 0 ? 1 : d->max_q_len;
    bad |= sh->max_q_len < 1 || sh->max_q_len > 8;
    d->num_splits = gen(r, ok_sp, N_OF(ok_sp), bad_sp, N_OF(bad_sp), 6, &b);
    sh->splits = d->num_splits;
    bad |= d->num_splits < 0 || d->num_splits > 64;
    d->flags = fsel & 7u;
    if ((fsel & 0xf8) == 0xe8) d->flags |= 1u << (3 + (fsel & 7) * 4 % 29), bad = 1;
    sh->flags = d->flags;
    d->backend = (mla_backend)gen(r, ok_be, N_OF(ok_be), bad_be, N_OF(bad_be), 6, &b);
    if ((int32_t)d->backend == MLA_BACKEND_GPU) bad = 1; /* from bad_be's random values */
    if ((int32_t)d->backend != 0 && (int32_t)d->backend != 1) bad = 1;
    if ((dsel & 0xf8) == 0xf8) d->backend = MLA_BACKEND_GPU, bad = 1; /* no GPU backend built / present */
    d->device = (dsel & 0xf0) == 0xe0 ? -1 - (dsel & 1) : ((dsel & 0xf0) == 0xd0 ? 7 : 0);
    bad |= d->device < 0;
    d->num_threads = gen(r, ok_th, N_OF(ok_th), bad_th, N_OF(bad_th), 5, &b);
    sh->threads = d->num_threads;
    bad |= d->num_threads < 0 || d->num_threads > 1024;

    /* sm_scale and logit_cap */
    sh->moderate = 1;
    if (ssel < 200) d->sm_scale = 0.0f;
    else if (ssel < 240) {
        static const float ok_sm[] = {0.0416666f, 1.0f, 0.001f, 0.5f, 1e-45f, 0.125f, 0.01f, 0.2f};
        d->sm_scale = ok_sm[ssel % N_OF(ok_sm)];
    } else if (ssel < 248) {
        static const float big_sm[] = {100.0f, 1e4f, 3e38f};
        d->sm_scale = big_sm[ssel % N_OF(big_sm)];
        sh->moderate = 0;
    } else {
        static const float bad_sm[] = {-1.0f, NAN, INFINITY, -INFINITY, -1e-30f, -0.0f};
        d->sm_scale = bad_sm[ssel % N_OF(bad_sm)];
        if (!(d->sm_scale == 0.0f)) bad = 1; /* -0.0 == 0: the default */
    }
    if (csel < 200) d->logit_cap = 0.0f;
    else if (csel < 246) {
        static const float ok_cap[] = {30.0f, 50.0f, 0.5f, 1e-30f, 5.0f, 1e30f};
        d->logit_cap = ok_cap[csel % N_OF(ok_cap)];
    } else {
        static const float bad_cap[] = {-1.0f, NAN, INFINITY, -INFINITY, -1e-30f};
        d->logit_cap = bad_cap[csel % N_OF(bad_cap)];
        bad = 1;
    }
    sh->sm_scale = d->sm_scale;
    sh->cap = d->logit_cap;
    sh->heads = d->num_heads;

    /* Keep the plan's own allocations small: the workspace grows with
     * max_batch x splits x rows. A still-valid smaller max_batch replaces a
     * too-large one (the fuzzer explores limits on the refusal side). */
    if (!bad) {
        const double s = sh->splits > 0 ? sh->splits : ((sh->flags & MLA_FLAG_DETERMINISTIC) ? 8 : 2);
        const double rows = (double)sh->heads * sh->max_q_len + 64;
        while (sh->max_batch > 1 && (double)sh->max_batch * s * rows * 2052.0 > MAX_WORKSPACE_EST) {
            sh->max_batch /= 2;
            d->max_batch_size = sh->max_batch;
        }
    }
    return !bad;
}

static void api_odds_and_ends(rd *r) {
    const int32_t v = (int32_t)(r8(r) % 40) - 4; /* the enum's range, and a bit beyond its values */
    if (v >= 0 && v < 32 && mla_status_string((mla_status)v) == NULL) abort();
    if (mla_version() != MLA_VERSION) abort();
    if (mla_plan_desc_init(NULL) != MLA_ERROR_NULL_POINTER) abort();
    if (mla_batch_init(NULL) != MLA_ERROR_NULL_POINTER) abort();
    if (mla_tensors_init(NULL) != MLA_ERROR_NULL_POINTER) abort();
    if (mla_schedule_info_init(NULL) != MLA_ERROR_NULL_POINTER) abort();
    if (mla_plan_build_metadata(NULL, NULL, NULL) != MLA_ERROR_NULL_POINTER) abort();
    if (mla_plan_execute(NULL, NULL, NULL) != MLA_ERROR_NULL_POINTER) abort();
    if (mla_plan_create(NULL, NULL) != MLA_ERROR_NULL_POINTER) abort();
    mla_plan_destroy(NULL);
    (void)mla_gpu_device_count();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rd r = {data, size, 0};
    mla_plan_desc desc, *dp;
    mla_plan *plan = (mla_plan *)(uintptr_t)0x1; /* create must overwrite it */
    shape sh;
    step s;
    xbuf db;
    uint8_t tail;
    int bad_size = 0, ok, k, steps;
    size_t dsize;
    mla_status st;
    uint64_t seed;

    memset(&sh, 0, sizeof sh);
    memset(&s, 0, sizeof s);
    if (g_stats.inputs++ == 0 && getenv("MLA_FUZZ_STATS")) atexit(print_stats);
    seed = r64(&r);
    api_odds_and_ends(&r);
    ok = gen_desc(&r, &desc, &sh);
    dsize = gen_struct_size(&r, sizeof desc, &tail, &bad_size);
    dp = (mla_plan_desc *)make_struct(&desc, sizeof desc, dsize, tail, &db);
    st = mla_plan_create(dp, &plan);
    xfree(&db);
    expect("mla_plan_create", st, ok && !bad_size);
    g_stats.creates_ok += st == MLA_SUCCESS;
    if (st != MLA_SUCCESS) {
        if (plan != NULL) die("failed create left *plan non-NULL", st);
        return 0;
    }
    {
        mla_backend be;
        size_t ws = 0;
        mla_schedule_info info;
        if (mla_plan_backend(plan, &be) != MLA_SUCCESS || be != MLA_BACKEND_CPU) die("backend query", st);
        if (mla_plan_workspace_size(plan, &ws) != MLA_SUCCESS || ws == 0) die("workspace query", st);
        mla_schedule_info_init(&info);
        if (mla_plan_schedule_info(plan, &info) != MLA_ERROR_NO_METADATA) die("schedule info before metadata", st);
    }
    do_execute(&r, plan, &sh, &s, seed); /* before any metadata */
    steps = 1 + r8(&r) % 3;
    for (k = 0; k < steps; ++k) {
        int e, execs;
        do_build(&r, plan, &sh, &s);
        execs = 1 + (r8(&r) & 1);
        for (e = 0; e < execs; ++e) do_execute(&r, plan, &sh, &s, seed + (uint64_t)(k * 2 + e));
    }
    step_free(&s);
    mla_plan_destroy(plan);
    return 0;
}
