#ifndef DOSA_SEED_IDS_CU
#define DOSA_SEED_IDS_CU
#include "stage.cuh"
#include "seeds.cu"  // the seed stage this one extends

#define SEEDW 256  // seed slots per warp (seeds.py SEEDW)

// ---------------------------------------------------------------------------------------
// Explicit seeds (docs/method.md §2, Prop. 4; reference: dosa_ref.stages.seed_ids).  Caller-given
// key ids per query (e.g. the previous chunk's selections) are scored by the canonical
// scorer — score_ids_and_emit, i.e. dosa::score_batch, bit-identical to refinement and to
// the dense route — and their records go to rec[t, :]; the host then takes τ = the K-th
// record of (default seed records ∪ these records).  Explicit seeds ONLY raise τ: they are
// not excluded from screening, so one with s ≥ τ survives (U ≥ s ≥ τ) and refinement
// writes it into the compact records (docs/method.md §7 steps 4–7 with S = the default seeds).
// Precondition (seeds.explicit_seed_table): each row of `ids` holds distinct visible
// ids that are not default seeds (sinks, local window, anchor pool), −1 padding — a key
// counted twice in the union could raise τ above τ_K(Ω) (docs/method.md §2 needs *distinct*
// seeds).  The visibility test below only keeps the gathers in bounds.
// grid (ceil(S / (8 warps·SEEDW)), Qn); rec is [Qn, S] (count[t] ≤ S: no overflow).
// ---------------------------------------------------------------------------------------
template <int MT>
__device__ void seed_ids_impl(const uint8_t* __restrict__ q, const float* __restrict__ w,
                              const uint8_t* __restrict__ kp, const float* __restrict__ alpha,
                              const int* __restrict__ ks_, const int* __restrict__ ke_,
                              const int* __restrict__ ids, long long S,
                              unsigned int* __restrict__ count, unsigned long long* __restrict__ rec) {
  const int t = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int ks = ks_[t], ke = ke_[t];
  const long long j0 = ((long long)blockIdx.x * (blockDim.x >> 5) + warp) * SEEDW;
  if (j0 >= S) return;
  const long long j1 = min(S, j0 + SEEDW);
  const int* row = ids + (long long)t * S;
  // Rows are padded with −1 at the end: skip a warp whose entries are all padding.
  bool any = false;
  for (long long j = j0 + lane; j < j1; j += 32) any |= row[j] >= 0;
  if (!__any_sync(0xffffffffu, any)) return;
  Scorer::Rows<MT> A;
  float wlo[MT], whi[MT];
  A.load(q + (long long)t * (MT * 16) * DOSA_D, lane);
  load_weights<MT>(w + (long long)t * (MT * 16), wlo, whi, lane);
  const int g = lane >> 2, pos = batch_pos(lane);
  for (long long jb = j0; jb < j1; jb += 32) {
    int my[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int v = (jb + 8 * u + g < j1) ? row[jb + 8 * u + g] : -1;
      my[u] = (v >= ks && v < ke) ? v : -1;
    }
    int id = (jb + pos < j1) ? row[jb + pos] : -1;
    if (id < ks || id >= ke) id = -1;
    if (!__any_sync(0xffffffffu, id >= 0)) continue;  // warp-uniform: padding only
    score_ids_and_emit<MT>(A, wlo, whi, kp, alpha, my, id, NEG_INF, lane, count + t,
                           rec + (long long)t * S, S);
  }
}

#define SEED_IDS_INST(MT)                                                                    \
  extern "C" __global__ void __launch_bounds__(256) seed_ids_mt##MT(                          \
      const uint8_t* q, const float* w, const uint8_t* kp, const float* alpha, const int* ks, \
      const int* ke, const int* ids, long long S, unsigned int* count,                        \
      unsigned long long* rec) {                                                              \
    seed_ids_impl<MT>(q, w, kp, alpha, ks, ke, ids, S, count, rec);                           \
  }
SEED_IDS_INST(1)
SEED_IDS_INST(2)
SEED_IDS_INST(3)
SEED_IDS_INST(4)

#endif  // DOSA_SEED_IDS_CU
