// PTX wrappers of the kernels (docs/design.md "Kernel sources"): the f16 tensor-core step
// and the exact e4m3 → f16 conversions of the canonical scorer.  The Hopper-only wrappers
// (wgmma, mbarrier, bulk tensor copies) are ptx_sm90a.cuh (they need the sm_90a target).
#pragma once
#if defined(__CUDACC_RTC__)
typedef unsigned char uint8_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#else
#include <stdint.h>
#endif

#define DOSA_D 128

namespace dosa {

// One tensor-core step: D = A·B + D, m16n8k16, f16 inputs (every e4m3 value is exact in
// f16), fp32 accumulator.  (On sm_90, mma.sync …e4m3… is itself lowered to F2FP
// conversions + two HMMA.16816 + an FADD per step — seen in the SASS, docs/records/notes.md — so we
// convert once, outside the inner loop, and chain the HMMAs directly.)
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t a0, const uint32_t a1,
                                        const uint32_t a2, const uint32_t a3, const uint32_t b0,
                                        const uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One integer tensor-core step: D = A·B + D, m16n8k32, s8 inputs, s32 accumulator — exact
// in any order (the plan's activation pass, docs/method.md §2 "activation frequency").
__device__ __forceinline__ void mma_s8(int (&d)[4], const uint32_t a0, const uint32_t a1,
                                       const uint32_t a2, const uint32_t a3, const uint32_t b0,
                                       const uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The GPU's global nanosecond timer (%globaltimer): the route gate's time limit.
__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Inclusive prefix sum of x over the lanes of a warp (lane L gets Σ_{l ≤ L} x_l): the
// shuffle-up scan of the selection's histograms and of the survivor and record stages'
// bit counts.
template <class T>
__device__ __forceinline__ T warp_inclusive_sum(T x, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  return x;
}

// Σ x over the lanes of a warp, in every lane (the xor butterfly 16, 8, 4, 2, 1): integer
// counts and sums.
template <class T>
__device__ __forceinline__ T warp_sum_xor(T x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Two e4m3 (low 16 bits / high 16 bits of w) → f16x2 (exact; lower byte → lower half).
__device__ __forceinline__ uint32_t f16x2_lo(uint32_t w) {
  uint32_t r;
  const unsigned short x = (unsigned short)(w & 0xffffu);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(x));
  return r;
}
__device__ __forceinline__ uint32_t f16x2_hi(uint32_t w) {
  uint32_t r;
  const unsigned short x = (unsigned short)(w >> 16);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(x));
  return r;
}

}  // namespace dosa
