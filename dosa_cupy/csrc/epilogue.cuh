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
