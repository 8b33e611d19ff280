#ifndef DOSA_DENSE_CU
#define DOSA_DENSE_CU
#include "stage.cuh"

// ---------------------------------------------------------------------------------------
// Dense logits (the canonical original scorer over every visible key; docs/method.md §1).
// out[t, i] = score for i ∈ [ks[t], ke[t]), −inf elsewhere.  grid (N/TILE_N, Qn/QG).
// ---------------------------------------------------------------------------------------
template <int MT>
__device__ void dense_logits_impl(const uint8_t* __restrict__ q, const float* __restrict__ w,
                                  const uint8_t* __restrict__ kp, const float* __restrict__ alpha,
                                  const int* __restrict__ ks, const int* __restrict__ ke, int Qn,
                                  long long N, int QG, float* __restrict__ out) {
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* sk = smem;
  float* sa = reinterpret_cast<float*>(smem + TILE_N * ROWH);
  const long long n0 = (long long)blockIdx.x * TILE_N;
  load_key_tile(kp, alpha, N, n0, sk, sa);
  __syncthreads();
  DOSA_TILE_QUERIES(Qn, QG, N, n0);
  for (int t = blockIdx.y * QG + warp; t < tend; t += nw) {
    const long long lo = max((long long)ks[t], n0), hi = min((long long)ke[t], n0 + tile_n);
    float* orow = out + (long long)t * N + n0;
    if (lo >= hi) {
      for (int i = lane; i < tile_n; i += 32) orow[i] = NEG_INF;
      continue;
    }
    Scorer::Rows<MT> A;
    float wlo[MT], whi[MT];
    A.load(q + (long long)t * (MT * 16) * DOSA_D, lane);
    load_weights<MT>(w + (long long)t * (MT * 16), wlo, whi, lane);
    const int blo = (int)((lo - n0) >> 5), bhi = (int)((hi - n0 + 31) >> 5);
    for (int b = 0; b < TILE_N / 32; ++b) {
      const int i = b * 32 + pos;
      float v = NEG_INF;
      if (b >= blo && b < bhi) {
        const float sc = Scorer::score<MT>(A, KeysSmem{sk + b * 32 * ROWH}, wlo, whi, lane);
        if (n0 + i >= lo && n0 + i < hi) v = sc * sa[i];
      }
      if (i < tile_n) orow[i] = v;
    }
  }
}

#define DENSE_INST(MT)                                                                        \
  extern "C" __global__ void __launch_bounds__(256) dense_logits_mt##MT(                       \
      const uint8_t* q, const float* w, const uint8_t* kp, const float* alpha, const int* ks, \
      const int* ke, int Qn, long long N, int QG, float* out) {                               \
    dense_logits_impl<MT>(q, w, kp, alpha, ks, ke, Qn, N, QG, out);                           \
  }
DENSE_INST(1)
DENSE_INST(2)
DENSE_INST(3)
DENSE_INST(4)

#endif  // DOSA_DENSE_CU
