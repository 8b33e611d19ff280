// Shared device code of every DoSA kernel (docs/method.md §8–§9, docs/design.md "Kernel
// sources"), in layers: ptx.cuh (PTX wrappers), scorer.cuh (THE canonical scorer and its
// interface `Scorer`), record.cuh (the record emitter); here the tie-aware rule's helpers.
#pragma once
#include "record.cuh"

namespace dosa {

// A positive fp32 on its bits (+0 < x ≤ +inf; not NaN): the comparison x > 0 of IEEE, which a
// kernel built with -ftz would give up for a positive subnormal (route.cu's histogram).
__device__ __forceinline__ bool positive_f32(float x) {
  return __float_as_uint(x) - 1u < 0x7f800000u;
}

// ---------------------------------------------------------------------------------------
// Tie-aware rejection and zero plateaus (docs/method.md §7 "Tie-aware rejection and zero
// plateaus"; the GPU statement and its check: proofs/gpu_zero_plateau.py).
// kj = id j of the query's K-th seed record (τ, j); kNoKthId (INT_MAX) when there is none
// or the rule is off, so the comparison below is then the plain rule U < τ.
// ---------------------------------------------------------------------------------------
constexpr int kNoKthId = 0x7fffffff;  // select.NO_KTH_ID

// The record (U, i) lies strictly below (τ, j) in the order (score desc, id asc): a key with
// s ≤ U is then in no Top-K (K distinct seed records sit at or above (τ, j)).  i = j (an
// explicit or certificate seed screened again) is never below.
__device__ __forceinline__ bool below_kth(double U, double tau, long long i, int kj) {
  return U < tau || (U == tau && i > (long long)kj);
}

// One plan row's zero-plateau test for one key, 1 when it fails: z < 0 marks a row without
// a condition (not a positive-weight head); otherwise the row's screened logit x must satisfy
// x + z·ρ ≤ 0 with z ≥ 2γ_mma·√D·‖q̄_row‖ (rounded up; screen.plateau_rows) and ρ√D ≥ ‖k̄‖, so
// the canonical logit of that head, within γ_mma·Σ|q̄||k̄| of the exact dot as x is, is ≤ 0.
// fp64 with upward rounding (CuPy's -ftz=true would flush fp32 directed results); a NaN
// x, z or ρ fails.
__device__ __forceinline__ float plateau_miss(float x, float z, double rho) {
  return (z < 0.f || __dadd_ru((double)x, __dmul_ru((double)z, rho)) <= 0.0) ? 0.f : 1.f;
}

}  // namespace dosa
