#ifndef DOSA_E4M3_ROUND_CU
#define DOSA_E4M3_ROUND_CU
#include "stage.cuh"

// Saturating RNE e4m3 bits of fp64 values via fp32 (plan aux rows, docs/method.md §8).  Any
// rounding is acceptable here: the planner computes the reconstruction error exactly.
extern "C" __global__ void e4m3_round_f64(const double* __restrict__ x, long long n,
                                          uint8_t* __restrict__ out) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __nv_cvt_float_to_fp8((float)x[i], __NV_SATFINITE, __NV_E4M3);
}

#endif  // DOSA_E4M3_ROUND_CU
