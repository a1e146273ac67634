/*
 * decode.c - one decode step of DeepSeek-style MLA attention with libmla.
 *
 * Build against the installed library and run:
 *
 *     cc decode.c $(pkg-config --cflags --libs mla) -o decode
 *     ./decode
 *
 * The program attends 4 sequences of different lengths (16 query heads, one
 * query token each, the R1 shape on 8-way tensor parallelism) to a paged
 * bf16 KV cache whose pages are scattered through a page table, the way a
 * serving engine's allocator leaves them. It runs on the CPU backend with
 * host memory, checks that the output is finite and that the log-sum-exp is
 * consistent with the scores, and prints one line.
 *
 * The calls are those of a real engine:
 *   once:            mla_plan_create        (static shape)
 *   every step:      mla_plan_build_metadata (sequence lengths only)
 *   every layer:     mla_plan_execute       (this layer's q, KV cache, out)
 */
#include <mla.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HEADS 16
#define PAGE_SIZE 64
#define BATCH 4
#define DQK MLA_HEAD_DIM_QK /* 576: the q / KV row */
#define DV MLA_HEAD_DIM_V   /* 512: V is the first 512 dims of the KV row */

/* Stop with the library's explanation when a call fails. */
#define CHECK(call)                                                                                       \
    do {                                                                                                  \
        mla_status status_ = (call);                                                                      \
        if (status_ != MLA_SUCCESS) {                                                                     \
            fprintf(stderr, "%s failed: %s: %s\n", #call, mla_status_string(status_), mla_last_error_message()); \
            exit(1);                                                                                      \
        }                                                                                                 \
    } while (0)

/* bfloat16 is the top half of a float32 (rounded to nearest even). */
static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Deterministic pseudo-random values in [-1, 1). */
static float next_value(uint32_t *state) {
    *state = *state * 1664525u + 1013904223u;
    return (float)(*state >> 8) / 8388608.0f - 1.0f;
}

/* q, kv and out must be 16-byte aligned. */
static void *alloc_aligned(size_t bytes) {
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

int main(void) {
    const int32_t kv_len[BATCH] = {1, 100, 777, 2048}; /* cached tokens per sequence */
    int32_t qo_indptr[BATCH + 1], kv_indptr[BATCH + 1], last_page_len[BATCH];
    uint32_t rng = 12345;
    int b, i;

    /* ---- 1. The plan: the static shape, made once. ------------------------ */
    mla_plan_desc desc;
    mla_plan *plan;
    mla_plan_desc_init(&desc); /* zero = default for every field */
    desc.num_heads = HEADS;
    desc.q_dtype = MLA_DTYPE_BF16;
    desc.kv_dtype = MLA_DTYPE_BF16; /* or FP8_E4M3 / MXFP4 with their scales */
    desc.page_size = PAGE_SIZE;
    desc.max_batch_size = BATCH;
    desc.max_q_len = 1;              /* plain decode; up to 8 for MTP */
    desc.backend = MLA_BACKEND_CPU;  /* AUTO would pick a GPU when one is present,
                                        and GPU plans take device pointers */
    CHECK(mla_plan_create(&desc, &plan));

    /* ---- 2. The batch of this step: lengths only. -------------------------- */
    /* Sequence b owns pages kv_indptr[b] .. kv_indptr[b+1]-1 of the page table;
     * its last page holds last_page_len[b] tokens. */
    qo_indptr[0] = kv_indptr[0] = 0;
    for (b = 0; b < BATCH; ++b) {
        const int32_t pages = (kv_len[b] + PAGE_SIZE - 1) / PAGE_SIZE;
        qo_indptr[b + 1] = qo_indptr[b] + 1; /* one query token each */
        kv_indptr[b + 1] = kv_indptr[b] + pages;
        last_page_len[b] = kv_len[b] - (pages - 1) * PAGE_SIZE;
    }
    const int32_t num_pages = kv_indptr[BATCH];
    const int32_t total_q = qo_indptr[BATCH];

    mla_batch batch;
    mla_batch_init(&batch);
    batch.batch_size = BATCH;
    batch.qo_indptr = qo_indptr;
    batch.kv_indptr = kv_indptr;
    batch.kv_last_page_len = last_page_len;
    batch.memory = MLA_MEMORY_HOST;
    CHECK(mla_plan_build_metadata(plan, &batch, NULL));

    /* ---- 3. One layer's data. ----------------------------------------------- */
    /* The page table: slot s of the CSR holds physical page (7 s) mod num_pages,
     * a permutation because 7 and num_pages share no factor here. */
    int32_t *kv_indices = malloc((size_t)num_pages * sizeof *kv_indices);
    for (i = 0; i < num_pages; ++i) kv_indices[i] = (int32_t)((7 * i) % num_pages);

    const size_t kv_elems = (size_t)num_pages * PAGE_SIZE * DQK;
    const size_t q_elems = (size_t)total_q * HEADS * DQK;
    const size_t out_elems = (size_t)total_q * HEADS * DV;
    uint16_t *kv = alloc_aligned(kv_elems * sizeof(uint16_t));
    uint16_t *q = alloc_aligned(q_elems * sizeof(uint16_t));
    uint16_t *out = alloc_aligned(out_elems * sizeof(uint16_t));
    float *lse = alloc_aligned((size_t)total_q * HEADS * sizeof(float));
    for (size_t e = 0; e < kv_elems; ++e) kv[e] = to_bf16(next_value(&rng));
    for (size_t e = 0; e < q_elems; ++e) q[e] = to_bf16(2.0f * next_value(&rng));

    mla_tensors t;
    mla_tensors_init(&t);
    t.q = q;
    t.kv = kv;
    t.kv_indices = kv_indices;
    t.num_pages = num_pages; /* lets the library range-check the page table */
    t.out = out;
    t.lse = lse;
    CHECK(mla_plan_execute(plan, &t, NULL));

    /* ---- 4. Check the result. ------------------------------------------------- */
    for (size_t e = 0; e < out_elems; ++e)
        if (!isfinite(from_bf16(out[e]))) {
            fprintf(stderr, "out[%zu] is not finite\n", e);
            return 1;
        }
    /* For every sequence and head: max_j s_j <= lse <= max_j s_j + ln(L),
     * with s_j = q . K_j / sqrt(576) computed here in double. */
    const double sm_scale = 1.0 / 24.0;
    for (b = 0; b < BATCH; ++b) {
        for (int h = 0; h < HEADS; ++h) {
            const uint16_t *qrow = q + ((size_t)qo_indptr[b] * HEADS + (size_t)h) * DQK;
            const double got = lse[(size_t)qo_indptr[b] * HEADS + (size_t)h];
            double max_s = -INFINITY;
            for (int j = 0; j < kv_len[b]; ++j) {
                const int32_t page = kv_indices[kv_indptr[b] + j / PAGE_SIZE];
                const uint16_t *krow = kv + ((size_t)page * PAGE_SIZE + (size_t)(j % PAGE_SIZE)) * DQK;
                double s = 0.0;
                for (int d = 0; d < DQK; ++d) s += (double)from_bf16(qrow[d]) * from_bf16(krow[d]);
                if (s * sm_scale > max_s) max_s = s * sm_scale;
            }
            /* ln(L) <= log2(L) <= bit length of L */
            int bits = 0;
            for (int32_t l = kv_len[b]; l > 0; l >>= 1) ++bits;
            if (!isfinite(got) || got < max_s - 1e-3 || got > max_s + bits + 1e-3) {
                fprintf(stderr, "lse of sequence %d head %d = %g, expected within [%g, %g]\n", b, h, got, max_s,
                        max_s + bits);
                return 1;
            }
        }
    }
    /* A single cached token gets all the attention: its V row is the output. */
    {
        const uint16_t *v0 = kv + (size_t)kv_indices[0] * PAGE_SIZE * DQK;
        for (int d = 0; d < DV; ++d)
            if (out[d] != v0[d]) {
                fprintf(stderr, "sequence 0: out[%d] = %g, expected V[%d] = %g\n", d, from_bf16(out[d]), d,
                        from_bf16(v0[d]));
                return 1;
            }
    }

    mla_backend backend;
    CHECK(mla_plan_backend(plan, &backend));
    printf("libmla %d.%d.%d: %d sequences (kv_len 1..2048) x %d heads on the %s backend: "
           "out finite, lse consistent; lse[3][0] = %.4f\n",
           mla_version() / 10000, mla_version() / 100 % 100, mla_version() % 100, BATCH, HEADS,
           backend == MLA_BACKEND_CPU ? "CPU" : "GPU", lse[3 * HEADS]);

    mla_plan_destroy(plan);
    free(kv_indices);
    free(kv);
    free(q);
    free(out);
    free(lse);
    return 0;
}
