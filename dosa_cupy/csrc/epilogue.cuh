// The screen epilogue (docs/method.md §8, docs/design.md "Kernel sources"): the guard U^num
// of a key from its fp32 head sum Û, written once.  Every screen kernel (screen.cu:
// screen_mt*, screen_cert_mt*, screen_pair; screen_sm90a.cu: screen_wg_mt*) evaluates it
// through guard_bound_ru, so proofs/numerical_dominance.py and proofs/gpu_screen_epilogue.py
// check one expression.  The fp32 pre-test and the keep/reject rule are still written per
// kernel: as functions taking the candidate flag as an argument they change the kernels'
// schedule (python -m dosa_cupy.sass), which the next restructuring step measures.
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

}  // namespace dosa
