#pragma once
// SPECDEC_HD marks the device math that is also host code: nvcc compiles it for both sides, a plain C++
// compiler for the host only (bind_host_math.cpp: the host builds the CPU tests run against the kernels'
// own arithmetic).

#if defined(__CUDACC__)
#define SPECDEC_HD __host__ __device__ __forceinline__
#else
#define SPECDEC_HD inline
#endif
