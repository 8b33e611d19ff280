// The shared refinement stream (docs/method.md §9): within a group of 4 consecutive queries
// t = 4g..4g+3 (the last group may be short), every key of the group's shared set — inside
// the group's common visible range [max ks, min ke) and a survivor for ≥ 2 of its queries
// (dosa_cupy/refine.py split_shared computes the set on the host) — is gathered
// from global memory ONCE and scored for every query of the group whose survivor bit is
// set, by the canonical scorer dosa::score_batch (common.cuh), so each score is bit for bit
// the dense route's value.  A record is written for query t iff the key's survivor bit of
// t is set and s ≥ τ_t: the per-query stream (refine.cu refine_mt*) then refines only the
// residual masks surv[t] & ~shared[g], so every (query, surviving key) pair is refined by
// exactly one stream and no record can be written twice (tests/test_refine_shared.py).
// Records and counters are the per-query buffers of refine_mt* (same overflow semantics:
// the counter counts every qualifying record, entries at ≥ cap are not written, the host
// re-runs with the exact count as capacity).
//
// Separate module (built like decode.cu, dosa_cupy/refine.py `_shared_kernel`), compiled
// with the same options as kernels.cu (CuPy appends -ftz=true to both).
#include "common.cuh"

using namespace dosa;

#define RS_G 4              // queries per group (docs/method.md §9)
#define RS_WARPS 8          // warps per block (256 threads)
#define RS_W 256            // shared-mask words per warp (= refine.cu RW)
#define RS_BUF (1024 + 32)  // per-warp id buffer: one 32-word step + < 32 carried ids

// The A fragments of one query in shared memory, in fragment order [mt][s'][lane] (one
// uint4 = a0..a3 per lane): exactly the f16x2 words QRows<MT>::h[mt][s'][0..3] of that lane,
// written from a QRows<MT> loaded by QRows::load (the same e4m3 → f16 conversion).  `p`
// points at the query's block + lane.  Same frag() interface as QRows, so mma_batch /
// score_batch run the same MMA sequence on the same values.
template <int MT>
struct QFragSmem {
  const uint4* p;
  __device__ __forceinline__ void frag(int mt, int sp, uint32_t& a0, uint32_t& a1, uint32_t& a2,
                                       uint32_t& a3) const {
    const uint4 v = p[(mt * 8 + sp) * 32];
    a0 = v.x; a1 = v.y; a2 = v.z; a3 = v.w;
  }
};

// Dynamic shared memory (bytes) of refine_shared_mt<MT>: A fragments [RS_G][MT][8][32]
// uint4, weights [RS_G][MT*16] fp32, id buffers [RS_WARPS][RS_BUF] int32
// (refine.shared_smem_bytes mirrors this).
#define RS_SMEM(MT) (RS_G * (MT) * 8 * 32 * 16 + RS_G * (MT) * 16 * 4 + RS_WARPS * RS_BUF * 4)

// grid (glist size, ceil(NW / (RS_WARPS·RS_W))), block 256 threads, RS_SMEM(MT) bytes of
// dynamic shared memory.  Block (x, y): group glist[x], shared-mask words
// [wlo + y·RS_WARPS·RS_W, +RS_WARPS·RS_W) of the group's common range (wlo = max ks >> 5);
// warp k of the block takes the RS_W words from wlo + (y·RS_WARPS + k)·RS_W.
template <int MT>
__device__ void refine_shared_impl(const uint8_t* __restrict__ q, const float* __restrict__ w,
                                   const uint8_t* __restrict__ kp, const float* __restrict__ alpha,
                                   const float* __restrict__ tau, const int* __restrict__ ks_,
                                   const int* __restrict__ ke_, int Qn, const int* __restrict__ glist,
                                   long long N, const uint32_t* __restrict__ shared,
                                   const uint32_t* __restrict__ surv, unsigned int* __restrict__ count,
                                   unsigned long long* __restrict__ rec, long long cap) {
  static_assert(MT >= 1 && MT <= 4, "f16 fragments (QRows<MT>::kF16) need MT <= 4");
  extern __shared__ __align__(16) uint8_t smem[];
  uint4* sA = reinterpret_cast<uint4*>(smem);                                   // [RS_G][MT][8][32]
  float* sw = reinterpret_cast<float*>(smem + RS_G * MT * 8 * 32 * 16);         // [RS_G][MT*16]
  int* sid = reinterpret_cast<int*>(smem + RS_G * MT * 8 * 32 * 16 + RS_G * MT * 16 * 4);
  const int grp = glist[blockIdx.x];
  const int t0 = grp * RS_G;
  const int nq = min(RS_G, Qn - t0);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // The group's common visible range (block-uniform; the host's split used the same one).
  long long lo = 0, hi = N;
  for (int i = 0; i < nq; ++i) {
    lo = max(lo, (long long)ks_[t0 + i]);
    hi = min(hi, (long long)ke_[t0 + i]);
  }
  if (nq < 2 || lo >= hi) return;  // empty shared set (block-uniform)
  const long long NW = (N + 31) >> 5;
  const long long wlo_ = lo >> 5, whi_ = (hi + 31) >> 5;
  const long long b0 = wlo_ + (long long)blockIdx.y * (RS_WARPS * RS_W);
  if (b0 >= whi_) return;  // block-uniform
  const long long b1 = min(whi_, b0 + RS_WARPS * RS_W);
  const uint32_t* srow = shared + (long long)grp * NW;
  // Skip the block (before loading any query) when its words hold no shared key.
  bool any = false;
  for (long long wi = b0 + threadIdx.x; wi < b1; wi += blockDim.x) any |= srow[wi] != 0u;
  if (!__syncthreads_or(any)) return;
  // A fragments (warp i converts query t0 + i with QRows::load) and weights of the group.
  if (warp < nq) {
    QRows<MT> A;
    A.load(q + (long long)(t0 + warp) * (MT * 16) * DOSA_D, lane);
    uint4* dst = sA + warp * (MT * 8 * 32) + lane;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int sp = 0; sp < 8; ++sp)
        dst[(mt * 8 + sp) * 32] = make_uint4(A.h[mt][sp][0], A.h[mt][sp][1], A.h[mt][sp][2], A.h[mt][sp][3]);
  }
  for (int i = threadIdx.x; i < nq * MT * 16; i += blockDim.x) sw[i] = __ldg(w + (long long)t0 * (MT * 16) + i);
  __syncthreads();
  // From here on no block-wide barrier: warps leave independently.
  const long long w0 = b0 + (long long)warp * RS_W;
  if (w0 >= b1) return;
  const long long w1 = min(b1, w0 + RS_W);
  bool anyw = false;
  for (long long wi = w0 + lane; wi < w1; wi += 32) anyw |= srow[wi] != 0u;
  if (!__any_sync(0xffffffffu, anyw)) return;
  const int g = lane >> 2;
  for_each_survivor_batch(srow, w0, w1, sid + warp * RS_BUF, lane, [&](const int (&my)[4], int id) {
    KeysReg B;
    gather_keys(kp, my, lane, B);  // once for the whole group
    const float al = (id >= 0) ? __ldg(alpha + id) : 0.f;
    for (int qi = 0; qi < nq; ++qi) {
      const int t = t0 + qi;
      const bool sv = id >= 0 && ((__ldg(surv + (long long)t * NW + (id >> 5)) >> (id & 31)) & 1u);
      if (!__any_sync(0xffffffffu, sv)) continue;  // warp-uniform: no survivor of t here
      float wl[MT], wh[MT];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        wl[mt] = sw[qi * (MT * 16) + mt * 16 + g];
        wh[mt] = sw[qi * (MT * 16) + mt * 16 + g + 8];
      }
      const QFragSmem<MT> A{sA + qi * (MT * 8 * 32) + lane};
      float s = score_batch<MT, KeysReg, QFragSmem<MT>>(A, B, wl, wh, lane);
      s = (id >= 0) ? s * al : 0.f;  // = score_ids_and_emit's s · α (one fp32 multiply)
      warp_emit(sv && s >= __ldg(tau + t), s, id, lane, count + t, rec + (long long)t * cap,
                cap);
    }
  });
}

#define REFINE_SHARED_INST(MT)                                                                  \
  extern "C" __global__ void __launch_bounds__(256) refine_shared_mt##MT(                        \
      const uint8_t* q, const float* w, const uint8_t* kp, const float* alpha, const float* tau, \
      const int* ks, const int* ke, int Qn, const int* glist, long long N,                      \
      const uint32_t* shared, const uint32_t* surv, unsigned int* count,                        \
      unsigned long long* rec, long long cap) {                                                 \
    refine_shared_impl<MT>(q, w, kp, alpha, tau, ks, ke, Qn, glist, N, shared, surv, count,    \
                           rec, cap);                                                           \
  }
REFINE_SHARED_INST(1)
REFINE_SHARED_INST(2)
REFINE_SHARED_INST(3)
REFINE_SHARED_INST(4)
