#ifndef DOSA_REFINE_CU
#define DOSA_REFINE_CU
#include "stage.cuh"

// ---------------------------------------------------------------------------------------
// Refinement (docs/method.md §9): score every surviving key of the bitmask with all H heads
// through score_batch (bit-identical to the dense route) and write records with s ≥ τ.
// Per-query stream: block = (query qlist[x], word chunk y); each warp takes RW words.  The
// query index varies fastest, so concurrently resident blocks work on the same key chunk
// for many queries and the gathered keys are served from L2 (a key that survives for
// several queries is read from HBM about once per chunk, not once per query).
// ---------------------------------------------------------------------------------------
#define RW 256
template <int MT>
__device__ void refine_impl(const uint8_t* __restrict__ q, const float* __restrict__ w,
                            const uint8_t* __restrict__ kp, const float* __restrict__ alpha,
                            const float* __restrict__ tau, const int* __restrict__ ks_,
                            const int* __restrict__ ke_, const int* __restrict__ qlist,
                            long long N, const uint32_t* __restrict__ surv,
                            unsigned int* __restrict__ count, unsigned long long* __restrict__ rec,
                            long long cap) {
  __shared__ int sid[8][1024 + 32];
  const int t = qlist[blockIdx.x];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long NW = (N + 31) >> 5;
  const long long wlo_ = (long long)ks_[t] >> 5, whi_ = ((long long)ke_[t] + 31) >> 5;
  const long long w0 = wlo_ + ((long long)blockIdx.y * (blockDim.x >> 5) + warp) * RW;
  if (w0 >= whi_) return;
  const long long w1 = min(whi_, w0 + RW);
  const uint32_t* srow = surv + (long long)t * NW;
  // Skip the warp entirely when it has no survivor (common: survival is a few percent).
  bool any = false;
  for (long long wi = w0 + lane; wi < w1; wi += 32) any |= srow[wi] != 0u;
  if (!__any_sync(0xffffffffu, any)) return;
  Scorer::Rows<MT> A;
  float wl[MT], wh[MT];
  A.load(q + (long long)t * (MT * 16) * DOSA_D, lane);
  load_weights<MT>(w + (long long)t * (MT * 16), wl, wh, lane);
  const float tq = tau[t];
  for_each_survivor_batch(srow, w0, w1, sid[warp], lane, [&](const int (&my)[4], int id) {
    score_ids_and_emit<MT>(A, wl, wh, kp, alpha, my, id, tq, lane, count + t,
                           rec + (long long)t * cap, cap);
  });
}

#define REFINE_INST(MT)                                                                        \
  extern "C" __global__ void __launch_bounds__(256) refine_mt##MT(                              \
      const uint8_t* q, const float* w, const uint8_t* kp, const float* alpha, const float* tau, \
      const int* ks, const int* ke, const int* qlist, long long N, const uint32_t* surv,       \
      unsigned int* count, unsigned long long* rec, long long cap) {                           \
    refine_impl<MT>(q, w, kp, alpha, tau, ks, ke, qlist, N, surv, count, rec, cap);            \
  }
REFINE_INST(1)
REFINE_INST(2)
REFINE_INST(3)
REFINE_INST(4)

#endif  // DOSA_REFINE_CU
