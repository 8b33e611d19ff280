// The screen epilogue (docs/method.md §8, docs/design.md "Kernel sources"): the guard U^num
// of a key from its fp32 head sum Û, written once.  Every screen kernel (screen.cu:
// screen_mt*, screen_cert_mt*, screen_pair; screen_sm90a.cu: screen_wg_mt*) evaluates it
// through guard_bound_ru, so proofs/numerical_dominance.py and proofs/gpu_screen_epilogue.py
// check one expression; and the keep rule (DOSA_KEEP) of both variants of every screen
// kernel.
#pragma once
#include "common.cuh"

namespace dosa {

// U^num = RU(RU(α · RU(RU(Û + RU(ρ·C)) + ε_raw)) + ε_out) in fp64, every step rounded up, so
// U^num ≥ the canonical score of the key (docs/method.md §8).  ρ and α as the callers hold
// them (R = float: the key tile's fp32 values, converted exactly here; R = double: fp64
// copies made once per tile).
template <class R>
__device__ __forceinline__ double guard_bound_ru(float uh, R rho, R alpha, double C,
                                                 double eps_raw, double eps_out) {
  double u = __dadd_ru(__dadd_ru((double)uh, __dmul_ru((double)rho, C)), eps_raw);
  u = __dadd_ru(__dmul_ru((double)alpha, u), eps_out);
  return u;
}

// The same guard in fp32, every step rounded up (docs/error_model.md "The fp32 guard"): PTX
// add.rp / mul.rp without .ftz, so a subnormal result stays itself where the build's
// -ftz=true would flush it to zero (below the value); C32, er32, eo32 are C, ε_raw, ε_out
// rounded up to fp32.  Each step is at least its exact value (ρ, α ≥ 0), so U32 ≥ α(Û + ρC +
// ε_raw) + ε_out — the value guard_bound_ru bounds — with no fp64 operation and no
// conversion per key (proofs/gpu_screen_epilogue.py check_guard32).
__device__ __forceinline__ float add_ru_keep_subnormal(float a, float b) {
  float r;
  asm("add.rp.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float mul_ru_keep_subnormal(float a, float b) {
  float r;
  asm("mul.rp.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
// A double rounded up to fp32, and a double that holds an fp32 value converted to it
// (exactly): cvt without .ftz — the build's -ftz=true makes cvt.f32.f64 flush a subnormal
// result, which costs a compare and a fix-up per conversion and, rounded up, lands below
// the value.
__device__ __forceinline__ float f32_ru_keep_subnormal(double x) {
  float r;
  asm("cvt.rp.f32.f64 %0, %1;" : "=f"(r) : "d"(x));
  return r;
}
__device__ __forceinline__ float f32_of_f32_value(double x) {
  float r;
  asm("cvt.rn.f32.f64 %0, %1;" : "=f"(r) : "d"(x));
  return r;
}
// a < b on the values themselves (setp without .ftz: the build's flush would compare a
// subnormal as zero)
__device__ __forceinline__ bool less_keep_subnormal(float a, float b) {
  unsigned int r;
  asm("{\n .reg .pred p;\n setp.lt.f32 p, %1, %2;\n selp.u32 %0, 1, 0, p;\n}"
      : "=r"(r)
      : "f"(a), "f"(b));
  return r != 0u;
}
__device__ __forceinline__ float guard_bound_ru32(float uh, float rho, float alpha, float C32,
                                                  float er32, float eo32) {
  const float u = add_ru_keep_subnormal(
      add_ru_keep_subnormal(uh, mul_ru_keep_subnormal(rho, C32)), er32);
  return add_ru_keep_subnormal(mul_ru_keep_subnormal(alpha, u), eo32);
}

// The keep rule of a screen kernel's variant TIE (screen.cu "The keep rule"; docs/method.md
// §7) for a visible non-seed key whose strict-rule answer is `plain` (= candidate and
// U ≥ τ): TIE = false keeps `plain`; TIE = true also rejects a record (U, i) below the K-th
// seed record (τ, kj), with min(U, 0) for a certified plateau key (plat).  An expression at
// each use, not a function: a function call here changes the kernels' schedule (python -m
// dosa_cupy.sass).
#define DOSA_KEEP(TIE, plain, U, tq, plat, i, kj) \
  ((TIE) ? ((plain) && !below_kth((plat) ? fmin((U), 0.0) : (U), (double)(tq), (i), (kj))) : (plain))

}  // namespace dosa

// The Hopper screens' parameter lists (screen_sm90a.cu screen_wg_mt*, screen_wgt.cu
// screen_wgt_rows*; screen.ScreenLaunch passes the same arguments to both): the plan and τ,
// then the keys, the ranges, the seeds' pool and the outputs.
#define SCREEN_WG_PARAMS_IN                                                               \
  const uint8_t* __restrict__ rows, const float* __restrict__ om,                         \
      const float* __restrict__ sig, const double* __restrict__ Cq,                       \
      const double* __restrict__ eps_raw, double eps_out, const float* __restrict__ tau
#define SCREEN_WG_PARAMS_KEYS                                                             \
  const uint8_t* __restrict__ kp, const float* __restrict__ alpha,                        \
      const float* __restrict__ rho, const int* __restrict__ ks_,                         \
      const int* __restrict__ ke_, int sinks, int window,                                 \
      const uint32_t* __restrict__ poolmask, int Qn, long long N, int QG,                 \
      uint32_t* __restrict__ surv, double* __restrict__ Uout
#define SCREEN_WG_ARGS_IN rows, om, sig, Cq, eps_raw, eps_out, tau
#define SCREEN_WG_ARGS_KEYS kp, alpha, rho, ks_, ke_, sinks, window, poolmask, Qn, N, QG, surv, Uout
