#ifndef DOSA_SEEDS_CU
#define DOSA_SEEDS_CU
#include "stage.cuh"

// ---------------------------------------------------------------------------------------
// The anchor pool (docs/method.md §2) without a sort: the anchors' Top-K ids mark bits of a
// key bitmask (pool_mark; a repeated id sets its bit once), the bits' exclusive prefix
// counts (pool_count, then a scan on the host side) place every set bit at its rank
// (pool_ids: the sorted distinct ids), and the rank of a key id x — the number of pool ids
// below x, numpy's searchsorted(pool, x) — is offs[x/32] + popc(bits of word x/32 below x)
// (pool_rank, seed_ranges).  Reference: dosa_ref.stages.pool_ids.
// ---------------------------------------------------------------------------------------
extern "C" __global__ void pool_mark(const int* __restrict__ ids, long long n, long long NW,
                                     unsigned int* __restrict__ mask) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    const int id = ids[i];  // −1 padding; an id past the mask is not a key (never written)
    if (id >= 0 && (id >> 5) < NW) atomicOr(mask + (id >> 5), 1u << (id & 31));
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

// The plan's activation sample (plan.plan_stage with a pool at its capacity): out[i] =
// pool[i·last / max(ns − 1, 1)], last = max(P − 1, 0), P = *pcount the pool's ids on the
// device, i < ns — the array path's arange · last // (ns − 1) in one launch instead of six
// array operations in front of every plan (docs/records/benchmarks.md "The sampled
// decision's host work").  Integer arithmetic, nonnegative: the same ids.
extern "C" __global__ void pool_sample(const int* __restrict__ pool,
                                       const long long* __restrict__ pcount, long long ns,
                                       int* __restrict__ out) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= ns) return;
  const long long last = max(*pcount - 1, 0ll);
  out[i] = pool[i * last / max(ns - 1, 1ll)];
}

__device__ __forceinline__ int pool_rank(const unsigned int* mask, const long long* offs,
                                         long long NW, int x) {
  const long long w = x >> 5;
  const unsigned int below = (1u << (x & 31)) - 1u;
  return (int)(offs[w] + (w < NW ? __popc(mask[w] & below) : 0));
}

// The sinks [ks, ks + ns) and the local window [loc_lo, ke) of a query with range [ks, ke):
// rg[0..3] of seed_ranges.
__device__ __forceinline__ void local_range(const int* ks_, const int* ke_, int sinks,
                                            int window, int Qn, int t, int* rg, int& ns,
                                            int& loc_lo) {
  const int ks = ks_[t], ke = ke_[t];
  ns = min(sinks, ke - ks);
  loc_lo = max(ks + ns, ke - window);
  rg[t] = ks;
  rg[Qn + t] = ks + ns;
  rg[2 * Qn + t] = loc_lo;
  rg[3 * Qn + t] = ke;
}

// The default seeds of query t as three index ranges (docs/method.md §2): rg[0..1] the sinks
// [ks, ks + ns), rg[2..3] the local window [loc_lo, ke), rg[4..5] the anchor pool's indices
// of its ids in [ks + ns, loc_lo) — pool ids below are sinks or not visible, above are local
// seeds, so no key appears in two ranges.  rg int32 [6, Qn].  Reference:
// dosa_ref.stages.seed_ranges.
extern "C" __global__ void seed_ranges(const unsigned int* __restrict__ mask,
                                       const long long* __restrict__ offs, long long NW,
                                       const int* __restrict__ ks_, const int* __restrict__ ke_,
                                       int sinks, int window, int Qn, int* __restrict__ rg) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= Qn) return;
  int ns, loc_lo;
  local_range(ks_, ke_, sinks, window, Qn, t, rg, ns, loc_lo);
  rg[4 * Qn + t] = pool_rank(mask, offs, NW, ks_[t] + ns);
  rg[5 * Qn + t] = pool_rank(mask, offs, NW, loc_lo);
}

// rg int32 [4, Qn]: seed_ranges' first four rows only (the sinks and the local window, which
// do not depend on the anchor pool), so that they can be scored while the pool is built
// (seeds.py SIDE_STREAM).
extern "C" __global__ void local_ranges(const int* __restrict__ ks_, const int* __restrict__ ke_,
                                        int sinks, int window, int Qn, int* __restrict__ rg) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= Qn) return;
  int ns, loc_lo;
  local_range(ks_, ke_, sinks, window, Qn, t, rg, ns, loc_lo);
}

// ---------------------------------------------------------------------------------------
// Seed records from key tiles (docs/method.md §2, §9): query t's seeds in one launch are the
// keys [lo[t], hi[t]) of a contiguous key array — the sinks or the local window of the key
// array itself, or a range of the gathered anchor-pool keys, whose ids are idmap[i].  As in
// the dense route, a block loads a key tile into shared memory once for its QG queries and
// scores it with dosa::score_batch (the canonical scorer: a record's score is the dense
// route's logit bit for bit).  The block walks the tiles of its queries' span [min lo, max hi) from
// gridDim.x interleaved starts, so any ranges are covered; consecutive causal queries share
// most of their windows and pool ranges, which is what the tiles reuse.  Every record goes
// to rec[t, :] (the counter counts every record, so a full buffer would be detected; the
// caller sizes it for every seed).
// grid (G, ceil(Qn / QG)), 256 threads, shared memory TILE_N·(ROWH + 4) bytes.
// ---------------------------------------------------------------------------------------
template <int MT>
__device__ void seed_score_impl(const uint8_t* __restrict__ q, const float* __restrict__ w,
                               const uint8_t* __restrict__ kp, const float* __restrict__ alpha,
                               long long n_keys, const int* __restrict__ lo_,
                               const int* __restrict__ hi_, const int* __restrict__ idmap, int Qn,
                               int QG, unsigned int* __restrict__ count,
                               unsigned long long* __restrict__ rec, long long cap) {
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* sk = smem;
  float* sa = reinterpret_cast<float*>(smem + TILE_N * ROWH);
  __shared__ int span[2];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int pos = batch_pos(lane);
  const int t0 = blockIdx.y * QG, tend = min(Qn, t0 + QG);
  if (threadIdx.x == 0) {
    span[0] = 0x7fffffff;
    span[1] = -0x7fffffff - 1;
  }
  __syncthreads();
  for (int t = t0 + threadIdx.x; t < tend; t += blockDim.x) {
    const int a = lo_[t], b = hi_[t];
    if (a < b) {
      atomicMin(span, a);
      atomicMax(span + 1, b);
    }
  }
  __syncthreads();
  const long long s0 = span[0], s1 = span[1];
  for (long long n0 = s0 + (long long)blockIdx.x * TILE_N; n0 < s1;
       n0 += (long long)gridDim.x * TILE_N) {
    // skip a tile no query of the block needs (its queries' ranges can be far apart, e.g. a
    // block whose queries belong to several requests of a ragged batch); the vote is also
    // the barrier after which the previous tile may be overwritten
    bool need = false;
    for (int t = t0 + threadIdx.x; t < tend; t += blockDim.x)
      need |= max((long long)lo_[t], n0) < min((long long)hi_[t], n0 + TILE_N);
    if (!__syncthreads_or(need)) continue;
    load_key_tile(kp, alpha, n_keys, n0, sk, sa);
    __syncthreads();
    for (int t = t0 + warp; t < tend; t += nw) {
      const long long lo = max((long long)lo_[t], n0), hi = min((long long)hi_[t], n0 + TILE_N);
      if (lo >= hi) continue;
      Scorer::Rows<MT> A;
      float wlo[MT], whi[MT];
      A.load(q + (long long)t * (MT * 16) * DOSA_D, lane);
      load_weights<MT>(w + (long long)t * (MT * 16), wlo, whi, lane);
      const int blo = (int)((lo - n0) >> 5), bhi = (int)((hi - n0 + 31) >> 5);
      for (int bt = blo; bt < bhi; ++bt) {
        const float sc = Scorer::score<MT>(A, KeysSmem{sk + bt * 32 * ROWH}, wlo, whi, lane);
        const long long i = n0 + bt * 32 + pos;
        const bool in = i >= lo && i < hi;
        const int id = in ? (idmap ? __ldg(idmap + i) : (int)i) : -1;
        warp_emit(in, sc * sa[bt * 32 + pos], id, lane, count + t, rec + (long long)t * cap, cap);
      }
    }
  }
}

#define SEED_INST(MT)                                                                      \
  extern "C" __global__ void __launch_bounds__(256) seed_score_mt##MT(                            \
      const uint8_t* q, const float* w, const uint8_t* kp, const float* alpha, long long n_keys, \
      const int* lo, const int* hi, const int* idmap, int Qn, int QG, unsigned int* count,       \
      unsigned long long* rec, long long cap) {                                                  \
    seed_score_impl<MT>(q, w, kp, alpha, n_keys, lo, hi, idmap, Qn, QG, count, rec, cap);         \
  }
SEED_INST(1)
SEED_INST(2)
SEED_INST(3)
SEED_INST(4)

#endif  // DOSA_SEEDS_CU
