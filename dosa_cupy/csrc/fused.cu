#ifndef DOSA_FUSED_CU
#define DOSA_FUSED_CU
#include "stage.cuh"

// ---------------------------------------------------------------------------------------
// Fused route (what LiteTopK does; issue 5): full-head scoring of every visible non-seed
// key with the canonical scorer, filtered online against the query's seed threshold τ,
// compact writeback of s ≥ τ — no dense logits.  Exact by Theorem 1 with U = +inf.
// grid (N/TILE_N, Qn/QG), like dense_logits.
// ---------------------------------------------------------------------------------------
template <int MT>
__device__ void fused_impl(const uint8_t* __restrict__ q, const float* __restrict__ w,
                           const uint8_t* __restrict__ kp, const float* __restrict__ alpha,
                           const float* __restrict__ tau, const int* __restrict__ ks_,
                           const int* __restrict__ ke_, int sinks, int window,
                           const uint32_t* __restrict__ poolmask, int Qn, long long N, int QG,
                           unsigned int* __restrict__ count, unsigned long long* __restrict__ rec,
                           long long cap) {
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* sk = smem;
  float* sa = reinterpret_cast<float*>(smem + TILE_N * ROWH);
  const long long n0 = (long long)blockIdx.x * TILE_N;
  __shared__ uint32_t spm[TILE_N / 32];  // anchor-pool bits of the tile (seeds)
  load_key_tile(kp, alpha, N, n0, sk, sa);
  if (threadIdx.x < TILE_N / 32) spm[threadIdx.x] = (n0 + 32 * threadIdx.x < N) ? __ldg(poolmask + (n0 >> 5) + threadIdx.x) : 0u;
  __syncthreads();
  DOSA_TILE_QUERIES(Qn, QG, N, n0);
  for (int t = blockIdx.y * QG + warp; t < tend; t += nw) {
    const int ks = ks_[t], ke = ke_[t];
    const long long lo = max((long long)ks, n0), hi = min((long long)ke, n0 + tile_n);
    if (lo >= hi) continue;
    const int ns = min(sinks, ke - ks);
    const long long s_hi = (long long)ks + ns, loc_lo = max(s_hi, (long long)ke - window);
    Scorer::Rows<MT> A;
    float wlo[MT], whi[MT];
    A.load(q + (long long)t * (MT * 16) * DOSA_D, lane);
    load_weights<MT>(w + (long long)t * (MT * 16), wlo, whi, lane);
    const float tq = tau[t];
    const int blo = (int)((lo - n0) >> 5), bhi = (int)((hi - n0 + 31) >> 5);
    for (int b = blo; b < bhi; ++b) {
      const float sc = Scorer::score<MT>(A, KeysSmem{sk + b * 32 * ROWH}, wlo, whi, lane);
      const int i = b * 32 + pos;
      const long long key = n0 + i;
      const float s = sc * sa[i];
      const bool seed = key < s_hi || key >= loc_lo || ((spm[b] >> pos) & 1u);
      const bool p = key >= lo && key < hi && !seed && s >= tq;
      warp_emit(p, s, (int)key, lane, count + t, rec + (long long)t * cap, cap);
    }
  }
}

#define FUSED_INST(MT)                                                                          \
  extern "C" __global__ void __launch_bounds__(256) fused_mt##MT(                                \
      const uint8_t* q, const float* w, const uint8_t* kp, const float* alpha, const float* tau, \
      const int* ks, const int* ke, int sinks, int window, const uint32_t* poolmask, int Qn,    \
      long long N, int QG, unsigned int* count, unsigned long long* rec, long long cap) {        \
    fused_impl<MT>(q, w, kp, alpha, tau, ks, ke, sinks, window, poolmask, Qn, N, QG, count, rec, \
                   cap);                                                                         \
  }
FUSED_INST(1)
FUSED_INST(2)
FUSED_INST(3)
FUSED_INST(4)

#endif  // DOSA_FUSED_CU
