// src/core/macros.h — host/device qualifiers usable from .cpp (g++) and .cu (nvcc) files.
#pragma once

#if defined(__CUDACC__)
#define FA4_HD __host__ __device__ __forceinline__
#else
#define FA4_HD inline
#endif
