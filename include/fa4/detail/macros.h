// fa4/detail/macros.h — host/device qualifiers usable from .cpp (g++) and .cu (nvcc) files.
#pragma once

#if defined(__CUDACC__)
#define FA4_HD __host__ __device__ __forceinline__
#define FA4_DEVICE __device__ __forceinline__
#else
#define FA4_HD inline
#define FA4_DEVICE inline
#endif
