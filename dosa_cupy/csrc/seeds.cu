#ifndef DOSA_SEEDS_CU
#define DOSA_SEEDS_CU
#include "stage.cuh"

// ---------------------------------------------------------------------------------------
// Seed scoring (docs/method.md §2): S_t = sinks [ks, ks+sinks) ∪ local [max(ks+ns, ke−W), ke)
// ∪ (anchor pool ∩ [ks, ke)).  All seed records go to seed_rec[t, :]; τ is then the K-th
// largest (selection kernel).  grid (ceil(Smax / (8 warps·SEEDW)), Qn).
// ---------------------------------------------------------------------------------------
#define SEEDW 256
__device__ __forceinline__ int seed_id(long long j, int ks, int ns, int loc_lo, int nloc,
                                       const int* __restrict__ pool, int plo, int phi) {
  if (j < ns) return ks + (int)j;
  j -= ns;
  if (j < nloc) return loc_lo + (int)j;
  j -= nloc;
  if (plo + j >= phi) return -1;
  const int id = __ldg(pool + plo + j);
  if (id < ks + ns || id >= loc_lo) return -1;  // already a sink / local seed
  return id;
}

template <int MT>
__device__ void seed_score_impl(const uint8_t* __restrict__ q, const float* __restrict__ w,
                                const uint8_t* __restrict__ kp, const float* __restrict__ alpha,
                                const int* __restrict__ ks_, const int* __restrict__ ke_, int sinks,
                                int window, const int* __restrict__ pool,
                                const int* __restrict__ plo_, const int* __restrict__ phi_,
                                unsigned int* __restrict__ count, unsigned long long* __restrict__ rec,
                                long long cap) {
  const int t = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int ks = ks_[t], ke = ke_[t];
  const int ns = min(sinks, ke - ks);
  const int loc_lo = max(ks + ns, ke - window), nloc = ke - loc_lo;
  const int plo = plo_[t], phi = phi_[t];
  const long long total = (long long)ns + nloc + (phi - plo);
  const long long j0 = ((long long)blockIdx.x * (blockDim.x >> 5) + warp) * SEEDW;
  if (j0 >= total) return;
  QRows<MT> A;
  float wlo[MT], whi[MT];
  A.load(q + (long long)t * (MT * 16) * DOSA_D, lane);
  load_weights<MT>(w + (long long)t * (MT * 16), wlo, whi, lane);
  const long long j1 = min(total, j0 + SEEDW);
  const int g = lane >> 2, pos = batch_pos(lane);
  for (long long jb = j0; jb < j1; jb += 32) {
    int my[4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      my[u] = (jb + 8 * u + g < j1) ? seed_id(jb + 8 * u + g, ks, ns, loc_lo, nloc, pool, plo, phi) : -1;
    const int id = (jb + pos < j1) ? seed_id(jb + pos, ks, ns, loc_lo, nloc, pool, plo, phi) : -1;
    score_ids_and_emit<MT>(A, wlo, whi, kp, alpha, my, id, NEG_INF, lane, count + t,
                           rec + (long long)t * cap, cap);
  }
}

#define SEED_INST(MT)                                                                           \
  extern "C" __global__ void __launch_bounds__(256) seed_score_mt##MT(                           \
      const uint8_t* q, const float* w, const uint8_t* kp, const float* alpha, const int* ks,   \
      const int* ke, int sinks, int window, const int* pool, const int* plo, const int* phi,    \
      unsigned int* count, unsigned long long* rec, long long cap) {                            \
    seed_score_impl<MT>(q, w, kp, alpha, ks, ke, sinks, window, pool, plo, phi, count, rec, cap); \
  }
SEED_INST(1)
SEED_INST(2)
SEED_INST(3)
SEED_INST(4)

// ---------------------------------------------------------------------------------------
// The anchor pool (docs/method.md §2) without a sort: the anchors' Top-K ids mark bits of a
// key bitmask (pool_mark; a repeated id sets its bit once), the bits' exclusive prefix
// counts (pool_count, then a scan on the host side) place every set bit at its rank
// (pool_ids: the sorted distinct ids), and the rank of a key id x — the number of pool ids
// below x, numpy's searchsorted(pool, x) — is offs[x/32] + popc(bits of word x/32 below x)
// (pool_ranges).  References: dosa_ref.stages.pool_ids / pool_ranges.
// ---------------------------------------------------------------------------------------
extern "C" __global__ void pool_mark(const int* __restrict__ ids, long long n,
                                     unsigned int* __restrict__ mask) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    const int id = ids[i];
    if (id >= 0) atomicOr(mask + (id >> 5), 1u << (id & 31));
  }
}

// cnt[w + 1] = set bits of word w (cnt[0] = 0 is the caller's): its inclusive scan is offs.
extern "C" __global__ void pool_count(const unsigned int* __restrict__ mask, long long NW,
                                      long long* __restrict__ cnt) {
  const long long w = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (w < NW) cnt[w + 1] = __popc(mask[w]);
}

extern "C" __global__ void pool_ids(const unsigned int* __restrict__ mask,
                                    const long long* __restrict__ offs, long long NW,
                                    int* __restrict__ pool) {
  const long long w = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (w >= NW) return;
  unsigned int m = mask[w];
  long long o = offs[w];
  while (m) {
    pool[o++] = (int)(32 * w) + (__ffs(m) - 1);
    m &= m - 1u;
  }
}

__device__ __forceinline__ int pool_rank(const unsigned int* mask, const long long* offs,
                                         long long NW, int x) {
  const long long w = x >> 5;
  const unsigned int below = (1u << (x & 31)) - 1u;
  return (int)(offs[w] + (w < NW ? __popc(mask[w] & below) : 0));
}

extern "C" __global__ void pool_ranges(const unsigned int* __restrict__ mask,
                                       const long long* __restrict__ offs, long long NW,
                                       const int* __restrict__ ks, const int* __restrict__ ke,
                                       int Qn, int* __restrict__ plo, int* __restrict__ phi) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= Qn) return;
  plo[t] = pool_rank(mask, offs, NW, ks[t]);
  phi[t] = pool_rank(mask, offs, NW, ke[t]);
}

#endif  // DOSA_SEEDS_CU
