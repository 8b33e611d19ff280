// Scores of gathered keys on the native FP8 scorer (scorer_fp8.cuh; docs/error_model.md "A
// native FP8 scorer"): for query t and the ids of its row, out[t, m] = α_i · Σ_h w_h
// [q̄_h · k̄_i]_+ with i = ids[t, m] (−inf where i < 0) — the arithmetic of dense_fp8.cu's
// logits, bit for bit: the same fresh k32 steps in halves, the same head sum, a key's bits
// independent of its row in the tile (the probe's position checks) and of the MMA's column
// count (H = 32 runs m64n32k32 with one query, the dense logits m64n64k32 with two).  The
// building block of refinement and seed scoring on this scorer.  One warpgroup per block
// and 64 ids per block; keys by 16-byte loads into the 128-byte-swizzled tile (a gather:
// the bulk tensor copy of Hopper reads boxes, not rows by id).
#include "scorer_fp8.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace dosa {
namespace fp8 {

// grid (⌈M / 64⌉, Qn), 128 threads: q [Qn, H, 128] e4m3, w [Qn, H] fp32, kp [N, 128] e4m3,
// alpha [N] fp32, ids [Qn, M] int32 (−1: none), out [Qn, M] fp32.
template <int H>
__device__ __forceinline__ void score_ids(const uint8_t* __restrict__ q,
                                          const float* __restrict__ w,
                                          const uint8_t* __restrict__ kp,
                                          const float* __restrict__ alpha,
                                          const int* __restrict__ ids, int M,
                                          float* __restrict__ out) {
  static_assert(H == 64 || H == 32, "H: 64 or 32 heads");
  __shared__ __align__(1024) uint8_t sk[64 * 128];
  __shared__ __align__(1024) uint8_t sq[H * 128];
  __shared__ __align__(16) float sw[H];
  const int t = threadIdx.x, tq = blockIdx.y, m0 = blockIdx.x * 64;
  const int* row_ids = ids + (long long)tq * M;
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // 64 keys × 8 chunks of 16 bytes
    const int it = t + 128 * i, r = it >> 3, j = it & 7;
    const int id = m0 + r < M ? row_ids[m0 + r] : -1;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (id >= 0) v = __ldg(reinterpret_cast<const uint4*>(kp + (long long)id * 128 + 16 * j));
    *reinterpret_cast<uint4*>(sk + sw128_offset(r, j)) = v;
  }
  for (int it = t; it < H * 8; it += 128) {
    const int r = it >> 3, j = it & 7;
    *reinterpret_cast<uint4*>(sq + sw128_offset(r, j)) =
        __ldg(reinterpret_cast<const uint4*>(q + ((long long)tq * H + r) * 128 + 16 * j));
  }
  if (t < H) sw[t] = w[(long long)tq * H + t];
  // shared memory written by ordinary stores and read by the tensor cores (async proxy)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  const uint64_t da = desc_sw128((uint32_t)__cvta_generic_to_shared(sk));
  const uint64_t db = desc_sw128((uint32_t)__cvta_generic_to_shared(sq));
  float x[2][H / 2], acc[H / 2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    pin(x[0]);
    pin(x[1]);
    fence();
    mma_e4m3<H>(x[0], da + 4 * half, db + 4 * half, 0);
    mma_e4m3<H>(x[1], da + 4 * half + 2, db + 4 * half + 2, 0);
    commit();
    wait<0>();
    add_half<H>(x, acc, half == 0);
  }
  const int warp = t >> 5, lane = t & 31, g = lane >> 2, qd = lane & 3;
  float s[1][2];
  float2 wv[H / 8];
  lane_weights<H>(sw, qd, wv);
  head_sums<H, H>(acc, wv, s);
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // lane qd = h writes key row 16·warp + g + 8h
    if (qd != h) continue;
    const int m = m0 + 16 * warp + g + 8 * h;
    if (m >= M) continue;
    const int id = row_ids[m];
    out[(long long)tq * M + m] = id >= 0 ? s[0][h] * __ldg(alpha + id) : neg_inf();
  }
}

}  // namespace fp8
}  // namespace dosa
#endif

#define SCORE_FP8_INST(H)                                                                       \
  extern "C" __global__ void __launch_bounds__(128) score_fp8_ids_h##H(                         \
      const uint8_t* __restrict__ q, const float* __restrict__ w, const uint8_t* __restrict__ kp, \
      const float* __restrict__ alpha, const int* __restrict__ ids, int M,                      \
      float* __restrict__ out) {                                                                \
    SCORE_FP8_BODY(H)                                                                           \
  }
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SCORE_FP8_BODY(H) dosa::fp8::score_ids<H>(q, w, kp, alpha, ids, M, out);
#else
#define SCORE_FP8_BODY(H)
#endif
SCORE_FP8_INST(64)
SCORE_FP8_INST(32)
