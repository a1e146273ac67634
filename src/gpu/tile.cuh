// Per-architecture tile primitives. The attention kernel is written once
// against this interface; each architecture supplies the warp-level matrix
// multiply on shared-memory bf16 tiles and the asynchronous copy.
//
//   Tile::kElems            accumulator elements per lane per 8-column tile
//   Tile::row(lane, e)      row (0..15) of element e of a lane
//   Tile::col(lane, e)      column (0..7) of element e within its 8-column tile
//   Tile::abt<NT, K>(acc, A, lda, B, ldb)   acc[16 x 8NT] += A[16 x K] * B[8NT x K]^T
//   Tile::ab<NT, K>(acc, A, lda, V, ldv)    acc[16 x 8NT] += A[16 x K] * V[K x 8NT]
// All matrices are bf16 (uint16_t) in shared memory, row-major, strides in
// elements; K is a multiple of 16.
#pragma once

#include <stdint.h>

#include "../formats.h"
#include "runtime.h"

namespace mla {
namespace gpu {

// The portable kernels: SIMT tile, synchronous copies and tiles sized for
// 64 KB of LDS. Always on AMD; on NVIDIA with -Dportable_kernels=true
// (MLA_FORCE_SIMT_TILE) so the AMD code path can be tested on NVIDIA hardware.
// Defined identically in host and device passes: tile sizes depend on it.
// The CPU emulation runs the portable kernels, or with MLA_GPU_EMULATED_NVIDIA
// the NVIDIA path with its warp-level operations emulated (emulated.h).
#if defined(MLA_GPU_AMD) || defined(__HIP_PLATFORM_AMD__) || defined(MLA_FORCE_SIMT_TILE) || \
    (defined(MLA_GPU_EMULATED) && !defined(MLA_GPU_EMULATED_NVIDIA))
#define MLA_PORTABLE_KERNELS 1
#endif

#if ((defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800) || defined(MLA_GPU_EMULATED_NVIDIA)) && \
    !defined(MLA_PORTABLE_KERNELS)
#define MLA_TILE_MMA_SYNC 1
#endif

// ---- NVIDIA sm_80+: mma.sync m16n8k16 bf16 with ldmatrix ------------------
struct MmaSyncTile {
    static constexpr int kElems = 4;
    __device__ static int row(int lane, int e) { return (lane >> 2) + ((e >> 1) << 3); }
    __device__ static int col(int lane, int e) { return ((lane & 3) << 1) + (e & 1); }

#if defined(MLA_TILE_MMA_SYNC) && defined(MLA_GPU_EMULATED)
    __device__ static void ldsm_x4(uint32_t (&r)[4], const void *p) { emu::ldmatrix(r, 4, p, false); }
    __device__ static void ldsm_x2(uint32_t (&r)[2], const void *p) { emu::ldmatrix(r, 2, p, false); }
    __device__ static void ldsm_x4_trans(uint32_t (&r)[4], const void *p) { emu::ldmatrix(r, 4, p, true); }
    __device__ static void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
        emu::mma_bf16_m16n8k16(c, a, b0, b1);
    }
#elif defined(MLA_TILE_MMA_SYNC)
    __device__ static uint32_t smem_addr(const void *p) { return uint32_t(__cvta_generic_to_shared(p)); }

    __device__ static void ldsm_x4(uint32_t (&r)[4], const void *p) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(smem_addr(p)));
    }
    __device__ static void ldsm_x2(uint32_t (&r)[2], const void *p) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                     : "=r"(r[0]), "=r"(r[1])
                     : "r"(smem_addr(p)));
    }
    __device__ static void ldsm_x4_trans(uint32_t (&r)[4], const void *p) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(smem_addr(p)));
    }
    __device__ static void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
#endif
#if defined(MLA_TILE_MMA_SYNC)
    // A fragment of rows 0..15, columns k0..k0+15.
    __device__ static void load_a(uint32_t (&a)[4], const uint16_t *A, int lda, int k0, int lane) {
        ldsm_x4(a, A + (lane & 15) * lda + k0 + ((lane >> 4) << 3));
    }
#endif

    template <int NT, int K>
    __device__ static void abt(float (&acc)[NT][4], const uint16_t *A, int lda, const uint16_t *B, int ldb) {
#if defined(MLA_TILE_MMA_SYNC)
        // With few output tiles the K loop is a chain of dependent MMAs:
        // spread it over kChains accumulators and add them at the end.
        constexpr int kSteps = K / 16;
        constexpr int kWant = NT >= 4 ? 1 : 4 / NT;
        constexpr int kChains = kSteps % kWant == 0 ? kWant : kSteps % 3 == 0 ? 3 : kSteps % 2 == 0 ? 2 : 1;
        const int lane = threadIdx.x & 31;
        float part[kChains][NT][4];
#pragma unroll
        for (int c = 0; c < kChains; ++c)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) part[c][nt][e] = 0.0f;
#pragma unroll 2
        for (int k0 = 0; k0 < K; k0 += 16 * kChains) {
#pragma unroll
            for (int c = 0; c < kChains; ++c) {
                const int k = k0 + 16 * c;
                uint32_t a[4];
                load_a(a, A, lda, k, lane);
#pragma unroll
                for (int nt = 0; nt + 1 < NT; nt += 2) {
                    // matrices: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15)
                    uint32_t b[4];
                    const int n = nt * 8 + (lane & 7) + ((lane >> 4) << 3);
                    ldsm_x4(b, B + n * ldb + k + (((lane >> 3) & 1) << 3));
                    mma(part[c][nt], a, b[0], b[1]);
                    mma(part[c][nt + 1], a, b[2], b[3]);
                }
                if (NT & 1) {
                    uint32_t b[2];
                    ldsm_x2(b, B + ((NT - 1) * 8 + (lane & 7)) * ldb + k + (((lane >> 3) & 1) << 3));
                    mma(part[c][NT - 1], a, b[0], b[1]);
                }
            }
        }
#pragma unroll
        for (int c = 0; c < kChains; ++c)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[nt][e] += part[c][nt][e];
#endif
    }

    template <int NT, int K>
    __device__ static void ab(float (&acc)[NT][4], const uint16_t *A, int lda, const uint16_t *V, int ldv) {
#if defined(MLA_TILE_MMA_SYNC)
        static_assert(NT % 2 == 0, "ab needs an even number of 8-column tiles");
        const int lane = threadIdx.x & 31;
#pragma unroll
        for (int k0 = 0; k0 < K; k0 += 16) {
            uint32_t a[4];
            load_a(a, A, lda, k0, lane);
#pragma unroll
            for (int nt = 0; nt < NT; nt += 2) {
                // matrices: (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15), transposed
                uint32_t b[4];
                const int k = k0 + (lane & 7) + (((lane >> 3) & 1) << 3);
                ldsm_x4_trans(b, V + k * ldv + nt * 8 + ((lane >> 4) << 3));
                mma(acc[nt], a, b[0], b[1]);
                mma(acc[nt + 1], a, b[2], b[3]);
            }
        }
#endif
    }
};

// ---- NVIDIA sm_90a: warpgroup MMA (wgmma) --------------------------------
// MLA_WGMMA_KERNELS comes from the build (every NVIDIA target is sm_90a, or
// the sm_90-like CPU emulation); the kernels it enables are chosen in host
// and device passes alike, the instructions exist only in the device pass.
#if defined(MLA_WGMMA_KERNELS) && !defined(MLA_PORTABLE_KERNELS) && \
    ((defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900) || defined(MLA_GPU_EMULATED_NVIDIA))
#define MLA_TILE_WGMMA 1
#endif

// wgmma.mma_async m64nNk16 bf16 or f16 -> f32 with A in registers (mma) or
// in shared memory (mma_ss) and B in shared memory. A fragments are those of
// mma.sync m16n8k16 for the warp's 16 rows (warp w of the warpgroup supplies
// rows 16w..16w+15, also of shared-memory A); accumulator element
// 4i + e of a lane is row 16w + g + 8 (e >> 1), column 8i + 2t + (e & 1)
// (g = lane / 4, t = lane % 4). B is K-major without swizzle: core matrices
// of 8 rows (of N) x 16 bytes (8 k), each stored as 128 contiguous bytes,
// `k_stride` bytes apart along K and `n_stride` bytes apart along N.
struct Wgmma {
    static constexpr int kCoreBytes = 128;

    __device__ static uint64_t desc(const void *smem, uint32_t k_stride, uint32_t n_stride) {
        const uint32_t a = shared_address(smem);
        return uint64_t((a >> 4) & 0x3fffu) | (uint64_t((k_stride >> 4) & 0x3fffu) << 16) |
               (uint64_t((n_stride >> 4) & 0x3fffu) << 32);
    }
    // An operand in the 128-byte-swizzled layout: 128-byte rows (64 16-bit
    // elements along K for K-major, along M for M-major), 8-row atoms of
    // 1024 bytes one after another along the other dimension, the next 64
    // elements of a row `block_stride` bytes on; `smem` is 1024-byte aligned,
    // or a multiple of 16 bytes past such an address inside a row (k steps).
    __device__ static uint64_t desc_swizzled(const void *smem, uint32_t block_stride) {
        return desc(smem, block_stride, 1024) | (uint64_t(1) << 62);
    }
    // The address of `smem` in the shared window (what descriptors and the
    // swizzle see).
    __device__ static uint32_t shared_address(const void *smem) {
#if defined(MLA_TILE_WGMMA) && defined(MLA_GPU_EMULATED)
        return emu::smem_offset(smem);
#elif defined(MLA_TILE_WGMMA)
        return uint32_t(__cvta_generic_to_shared(smem));
#else
        (void)smem;
        return 0;
#endif
    }
    // The descriptor `bytes` further on (a multiple of 16 inside shared memory).
    __device__ static uint64_t advance(uint64_t d, int bytes) { return d + uint64_t(bytes >> 4); }

    // Orders this thread's register accesses before the following wgmmas.
    __device__ static void fence() {
#if defined(MLA_TILE_WGMMA) && !defined(MLA_GPU_EMULATED)
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
    }
    __device__ static void commit() {
#if defined(MLA_TILE_WGMMA) && defined(MLA_GPU_EMULATED)
        emu::wgmma_commit();
#elif defined(MLA_TILE_WGMMA)
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
    }
    // Wait until at most N committed groups are in flight.
    template <int N>
    __device__ static void wait() {
#if defined(MLA_TILE_WGMMA) && defined(MLA_GPU_EMULATED)
        emu::wgmma_wait(N);
#elif defined(MLA_TILE_WGMMA)
        asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
    }
    // Registers the compiler must treat as read and rewritten here: keeps
    // accesses to accumulators and A fragments on the right side of a wait.
    template <int K>
    __device__ static void hold(float (&r)[K]) {
#if defined(MLA_TILE_WGMMA) && !defined(MLA_GPU_EMULATED)
#pragma unroll
        for (int i = 0; i < K; ++i) asm volatile("" : "+f"(r[i])::"memory");
#else
        (void)r;
#endif
    }
    template <int K>
    __device__ static void hold(uint32_t (&r)[K]) {
#if defined(MLA_TILE_WGMMA) && !defined(MLA_GPU_EMULATED)
#pragma unroll
        for (int i = 0; i < K; ++i) asm volatile("" : "+r"(r[i])::"memory");
#else
        (void)r;
#endif
    }

    // The asm statement MACRO(type) for F16's element type.
#define MLA_WGMMA_TYPED(MACRO) \
    if constexpr (F16) {       \
        MACRO("f16");          \
    } else {                   \
        MACRO("bf16");         \
    }

    // d[64 x N] (+)= A[64 x 16] B[16 x N] of bf16 (F16: f16) elements, N 16
    // or 32; accumulate = false overwrites d.
    template <int N, bool F16>
    __device__ static void mma(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b, bool accumulate) {
#if defined(MLA_TILE_WGMMA) && defined(MLA_GPU_EMULATED)
        emu::wgmma(d, N, F16, a, b, accumulate);
#elif defined(MLA_TILE_WGMMA)
        static_assert(N == 16 || N == 32, "wgmma shapes: m64n16k16, m64n32k16");
#define MLA_WGMMA_M64N16K16(type)                                                                              \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"                                                  \
                 "wgmma.mma_async.sync.aligned.m64n16k16.f32." type "." type " {%0,%1,%2,%3,%4,%5,%6,%7}, "     \
                 "{%8,%9,%10,%11}, %12, p, 1, 1, 0;\n}\n"                                                      \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]) \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int(accumulate)))
#define MLA_WGMMA_M64N32K16(type)                                                                              \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"                                                  \
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32." type "." type                                   \
                 " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),       \
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])      \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int(accumulate)))
        if constexpr (N == 16) {
            MLA_WGMMA_TYPED(MLA_WGMMA_M64N16K16);
        } else {
            MLA_WGMMA_TYPED(MLA_WGMMA_M64N32K16);
        }
#undef MLA_WGMMA_M64N16K16
#undef MLA_WGMMA_M64N32K16
#else
        (void)d, (void)a, (void)b, (void)accumulate;
#endif
    }

    // The same with A in shared memory too (`a` a descriptor from desc() or
    // desc_swizzled()): K-major (rows of M along which k runs) or, TRANS_A,
    // M-major (rows of k along which M runs). The field semantics of both,
    // with and without the 128-byte swizzle, were checked on the H200
    // (docs/performance.md, v9).
    template <int N, bool F16, bool TRANS_A>
    __device__ static void mma_ss(float (&d)[N / 2], uint64_t a, uint64_t b, bool accumulate) {
#if defined(MLA_TILE_WGMMA) && defined(MLA_GPU_EMULATED)
        emu::wgmma_ss(d, N, F16, a, TRANS_A, b, accumulate);
#elif defined(MLA_TILE_WGMMA)
        static_assert(N == 16 || N == 32, "wgmma shapes: m64n16k16, m64n32k16");
#define MLA_WGMMA_SS_M64N16K16(type)                                                                           \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"                                                  \
                 "wgmma.mma_async.sync.aligned.m64n16k16.f32." type "." type " {%0,%1,%2,%3,%4,%5,%6,%7}, "     \
                 "%8, %9, p, 1, 1, %11, 0;\n}\n"                                                                \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]) \
                 : "l"(a), "l"(b), "r"(int(accumulate)), "n"(int(TRANS_A)))
#define MLA_WGMMA_SS_M64N32K16(type)                                                                           \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                                  \
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32." type "." type                                   \
                 " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, %19, 0;\n}\n"     \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),       \
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])      \
                 : "l"(a), "l"(b), "r"(int(accumulate)), "n"(int(TRANS_A)))
        if constexpr (N == 16) {
            MLA_WGMMA_TYPED(MLA_WGMMA_SS_M64N16K16);
        } else {
            MLA_WGMMA_TYPED(MLA_WGMMA_SS_M64N32K16);
        }
#undef MLA_WGMMA_SS_M64N16K16
#undef MLA_WGMMA_SS_M64N32K16
#else
        (void)d, (void)a, (void)b, (void)accumulate;
#endif
    }
#undef MLA_WGMMA_TYPED
};

// Makes this thread's shared-memory writes visible to the async proxy
// (wgmma operands read from shared memory); a barrier must follow.
__device__ __forceinline__ void fence_proxy_async() {
#if defined(MLA_TILE_WGMMA) && !defined(MLA_GPU_EMULATED)
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Hopper's register hand-over between warpgroups (setmaxnreg): every
// thread of a warpgroup calls one, a producer to release registers down to
// N a thread, a consumer to claim up to N (it waits until released ones
// cover it). The kernel's launch allocation must cover the sum; code after
// a call is register-allocated for N. Elsewhere nothing changes hands.
template <int N>
__device__ __forceinline__ void warpgroup_release_registers() {
#if defined(MLA_TILE_WGMMA) && !defined(MLA_GPU_EMULATED)
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void warpgroup_claim_registers() {
#if defined(MLA_TILE_WGMMA) && !defined(MLA_GPU_EMULATED)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

// Named barriers: `threads` threads (whole warps) of the CTA meet at barrier
// `id` (1..15; 0 is __syncthreads'), so that one warpgroup can wait for
// another (bar.sync) or signal it without waiting (bar.arrive: a producer
// warpgroup handing a tile to a consumer). Each orders the shared-memory
// accesses of the threads before it against the waiters' after it. NVIDIA
// only (the warpgroup kernels); elsewhere they would be the whole CTA's.
__device__ __forceinline__ void barrier_sync(int id, int threads) {
#if defined(MLA_GPU_EMULATED_NVIDIA)
    emu::named_barrier(id, threads, true, 0);
#elif defined(MLA_TILE_MMA_SYNC) && !defined(MLA_GPU_EMULATED)
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#else
    (void)id, (void)threads;
    __syncthreads();
#endif
}
__device__ __forceinline__ void barrier_arrive(int id, int threads) {
#if defined(MLA_GPU_EMULATED_NVIDIA)
    emu::named_barrier(id, threads, false, 0);
#elif defined(MLA_TILE_MMA_SYNC) && !defined(MLA_GPU_EMULATED)
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#else
    (void)id, (void)threads;
#endif
}
// bar.sync that also returns whether any participant's predicate is non-zero.
__device__ __forceinline__ int barrier_sync_or(int id, int threads, int predicate) {
#if defined(MLA_GPU_EMULATED_NVIDIA)
    return emu::named_barrier(id, threads, true, predicate);
#elif defined(MLA_TILE_MMA_SYNC) && !defined(MLA_GPU_EMULATED)
    int any;
    asm volatile("{\n.reg .pred p, q;\nsetp.ne.b32 p, %3, 0;\nbar.red.or.pred q, %1, %2, p;\nselp.b32 %0, 1, 0, q;\n}\n"
                 : "=r"(any) : "r"(id), "r"(threads), "r"(predicate) : "memory");
    return any;
#else
    (void)id, (void)threads;
    return __syncthreads_or(predicate);
#endif
}

// ---- Portable SIMT tile: plain FMAs, any warp size (AMD until MFMA lands) -----
struct SimtTile {
    static constexpr int kElems = 128 / MLA_WARP_SIZE;
    __device__ static int row(int lane, int) { return lane & 15; }
    __device__ static int col(int lane, int e) { return (lane >> 4) * kElems + e; }

    template <int NT, int K>
    __device__ static void abt(float (&acc)[NT][kElems], const uint16_t *A, int lda, const uint16_t *B, int ldb) {
        const int lane = threadIdx.x % MLA_WARP_SIZE;
        const uint16_t *a = A + row(lane, 0) * lda;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < kElems; ++e) {
                const uint16_t *b = B + (nt * 8 + col(lane, e)) * ldb;
                float sum = 0.0f;
                for (int k = 0; k < K; ++k) sum += bf16_to_float(a[k]) * bf16_to_float(b[k]);
                acc[nt][e] += sum;
            }
    }

    template <int NT, int K>
    __device__ static void ab(float (&acc)[NT][kElems], const uint16_t *A, int lda, const uint16_t *V, int ldv) {
        const int lane = threadIdx.x % MLA_WARP_SIZE;
        const uint16_t *a = A + row(lane, 0) * lda;
        for (int k = 0; k < K; ++k) {
            const float ak = bf16_to_float(a[k]);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < kElems; ++e) acc[nt][e] += ak * bf16_to_float(V[k * ldv + nt * 8 + col(lane, e)]);
        }
    }
};

#if defined(MLA_TILE_MMA_SYNC)
using Tile = MmaSyncTile;
#else
using Tile = SimtTile;
#endif

// ---- Asynchronous global -> shared copies ---------------------------------
// 16 bytes of which the first src_bytes (0 or 16) are read and the rest
// zero-filled (src is not read when 0).
__device__ __forceinline__ void copy16_async_zfill(void *smem, const void *gmem, int src_bytes) {
#if defined(MLA_TILE_MMA_SYNC) && defined(MLA_GPU_EMULATED)
    emu::cp_async(smem, gmem, 16, src_bytes);
#elif defined(MLA_TILE_MMA_SYNC)
    const uint32_t dst = uint32_t(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes));
#else
    uint4 v = make_uint4(0, 0, 0, 0);
    if (src_bytes > 0) v = *static_cast<const uint4 *>(gmem);
    *static_cast<uint4 *>(smem) = v;
#endif
}

// 16 bytes; zero-fills the destination when !valid (src is then not read).
__device__ __forceinline__ void copy16_async(void *smem, const void *gmem, bool valid) {
    copy16_async_zfill(smem, gmem, valid ? 16 : 0);
}

// The byte at p, loaded where this call is (asm volatile keeps the load
// in issue order, so its latency overlaps what follows until the value is
// used). Unpredicated on purpose: see KvTile::ScaleLoads.
__device__ __forceinline__ uint32_t load_u8(const uint8_t *p) {
#if defined(MLA_TILE_MMA_SYNC) && !defined(MLA_GPU_EMULATED)
    uint32_t v;
    asm volatile("ld.global.nc.u8 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
#else
    return *p;
#endif
}

__device__ __forceinline__ void async_commit() {
#if defined(MLA_TILE_MMA_SYNC) && defined(MLA_GPU_EMULATED)
    emu::cp_async_commit();
#elif defined(MLA_TILE_MMA_SYNC)
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Wait until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void async_wait() {
#if defined(MLA_TILE_MMA_SYNC) && defined(MLA_GPU_EMULATED)
    emu::cp_async_wait(N);
#elif defined(MLA_TILE_MMA_SYNC)
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

}  // namespace gpu
}  // namespace mla
