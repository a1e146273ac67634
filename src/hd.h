// Host/device portability macros shared by every file that is compiled both
// by the host C++ compiler and by a GPU compiler (nvcc or hipcc).
#pragma once

#if defined(__HIP__) || defined(__HIPCC__)
#include <hip/hip_runtime.h>  // __host__, __device__, __forceinline__ on AMD
#endif

#if defined(__CUDACC__) || defined(__HIPCC__) || defined(__HIP__)
#define MLA_HD __host__ __device__ __forceinline__
#define MLA_GPU_COMPILER 1
#else
#define MLA_HD inline
#endif

// 1 while compiling device code (nvcc's or hipcc's device pass), else 0:
// selects device intrinsics inside MLA_HD functions.
#if defined(MLA_GPU_COMPILER) && (defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__))
#define MLA_DEVICE_PASS 1
#else
#define MLA_DEVICE_PASS 0
#endif
