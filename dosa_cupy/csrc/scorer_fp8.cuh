// The native FP8 scorer (docs/error_model.md "A native FP8 scorer", docs/numerics.md "The
// e4m3 wgmma accumulator"): the arithmetic of one tile of 64 keys × NC columns (the heads
// of NC/H queries) after e4m3 wgmma k32 steps from fresh accumulators — the halves' sums in
// k order and the head sum — written once for every kernel that scores keys with it
// (dense_fp8.cu: keys streamed by TMA; score_fp8.cu: keys gathered by id), so a key's score
// has the same bits whichever kernel computes it.  Host model: dosa_ref.mma_model
// .fp8_fresh_scores.
#pragma once
#include "ptx_sm90a.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace dosa {
namespace fp8 {
using namespace dosa::wg;
// −inf by its bits: NVRTC has no <math.h> (INFINITY) — the library builds these files with it
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

__device__ __forceinline__ float relu(float x) { return fmaxf(x, 0.f); }

// The sum of a half's two fresh steps into acc (first half: acc = x0 + x1; second half:
// acc = (acc + x0) + x1) — the k order of the fresh-step dot — after the wait that
// completed them (pin keeps the reads after it).  NC/2 accumulators per thread.
template <int NC>
__device__ __forceinline__ void add_half(float (&x)[2][NC / 2], float (&acc)[NC / 2], bool first) {
  pin(x[0]);
  pin(x[1]);
#pragma unroll
  for (int e = 0; e < NC / 2; ++e)
    acc[e] = first ? x[0][e] + x[1][e] : (acc[e] + x[0][e]) + x[1][e];
}

// The fresh-step dots of a tile of N columns (docs/error_model.md "A native FP8 scorer"; the
// model dosa_ref.mma_model.fresh_dots): the four e4m3 k32 steps from fresh accumulators
// (scale-d = 0) — step s at the descriptors + 2s, 32 bytes further in the 128-byte rows —
// added in k order in fp32 round-to-nearest, acc = ((x0 + x1) + x2) + x3, with two buffers
// of N/2 registers (x is scratch): steps 0 and 1 into acc and x, then 2 and 3 one at a time
// into x.  hook() runs while steps 0 and 1 are in flight (a kernel's next gather, or nothing).
// No proxy fence or barrier: the caller orders the operands' stores before the call.  The
// pins keep each add after the wait that completed its steps.
template <int N, class Hook>
__device__ __forceinline__ void fresh_steps(float (&acc)[N / 2], float (&x)[N / 2], uint64_t da,
                                            uint64_t db, Hook&& hook) {
  pin(acc);
  pin(x);
  fence();
  mma_e4m3<N>(acc, da, db, 0);
  mma_e4m3<N>(x, da + 2, db + 2, 0);
  commit();
  hook();
  wait<0>();
  pin(acc);
  pin(x);
#pragma unroll
  for (int e = 0; e < N / 2; ++e) acc[e] = acc[e] + x[e];  // x0 + x1
#pragma unroll
  for (int s = 2; s < 4; ++s) {
    fence();
    mma_e4m3<N>(x, da + 2 * s, db + 2 * s, 0);
    commit();
    wait<0>();
    pin(x);
#pragma unroll
    for (int e = 0; e < N / 2; ++e) acc[e] = acc[e] + x[e];  // (… + x2) + x3
  }
}

// fresh_steps' values in the same registers with the tile's two halves of N/2 columns in a
// pipeline (screen_wgt.cu "The pipelined halves"; a lean dense-logits build with it spilled
// 8 bytes under NVRTC at the consumers' 160 registers, so none is built): each half's steps
// as m64n(N/2) MMAs — half h's columns N/2·h + 8j + 2qd + e in acc[N/4·h ..], the
// registers of the m64nN accumulator (ptx_sm90a.cuh acc_col; a column's bits do not depend on
// N, the probe's position checks) — on B operands db0 and db1 (half 1's rows); both halves'
// steps 0 and 1 in one group, then each half's next step issued as soon as its buffer is
// added, so one half's adds run while the other half's step is in flight.  Per value the same
// ((x0 + x1) + x2) + x3.
template <int N>
__device__ __forceinline__ void fresh_steps_pipe(float (&acc)[N / 2], float (&x)[N / 2],
                                                 uint64_t da, uint64_t db0, uint64_t db1) {
  constexpr int Q = N / 4;  // accumulators of a half
  float(&d0)[Q] = *reinterpret_cast<float(*)[Q]>(&acc[0]);
  float(&d1)[Q] = *reinterpret_cast<float(*)[Q]>(&acc[Q]);
  float(&x0)[Q] = *reinterpret_cast<float(*)[Q]>(&x[0]);
  float(&x1)[Q] = *reinterpret_cast<float(*)[Q]>(&x[Q]);
  auto add = [](float(&a)[Q], float(&y)[Q]) {
#pragma unroll
    for (int e = 0; e < Q; ++e) a[e] = a[e] + y[e];
  };
  pin(acc);
  pin(x);
  fence();
  mma_e4m3<N / 2>(d0, da, db0, 0);
  mma_e4m3<N / 2>(x0, da + 2, db0 + 2, 0);
  mma_e4m3<N / 2>(d1, da, db1, 0);
  mma_e4m3<N / 2>(x1, da + 2, db1 + 2, 0);
  commit();
  wait<0>();
  pin(acc);
  pin(x);
  add(d0, x0);  // x0 + x1, half 0
#pragma unroll
  for (int s = 2; s < 4; ++s) {
    fence();
    mma_e4m3<N / 2>(x0, da + 2 * s, db0 + 2 * s, 0);  // step s, half 0
    commit();
    if (s > 2) {  // half 1's step s − 1 done (half 0's step s in flight)
      wait<1>();
      pin(x1);
    }
    add(d1, x1);  // + x_{s−1} of half 1 (x0 + x1 at s = 2), under half 0's step s
    fence();
    mma_e4m3<N / 2>(x1, da + 2 * s, db1 + 2 * s, 0);  // step s, half 1
    commit();
    wait<1>();  // half 0's step s done
    pin(x0);
    add(d0, x0);  // + x_s, half 0, under half 1's step s
  }
  wait<0>();
  pin(x1);
  add(d1, x1);  // + x3, half 1
}

// The weights of a lane's columns of a tile of NC columns: wv[j] = (w[8j + 2qd], w[8j + 2qd
// + 1]) from the tile's NC weights in shared memory (a kernel that keeps one tile's weights
// for all its keys loads them once into registers).
template <int NC>
__device__ __forceinline__ void lane_weights(const float* __restrict__ sw_tile, int qd,
                                             float2 (&wv)[NC / 8]) {
#pragma unroll
  for (int j = 0; j < NC / 8; ++j) wv[j] = *reinterpret_cast<const float2*>(sw_tile + 8 * j + 2 * qd);
}

// The lane's partial head sums of a tile: per query u and row h two fmaf chains over the
// query's columns — its even column groups j and its odd ones, each in j order then e —
// added (even + odd); the quad's tree follows (head_sums' butterfly, or quad_scatter).
// wt(j): the lane's weights of column group j, (w[8j + 2qd], w[8j + 2qd + 1]) — from
// registers (lane_partials) or read where they are used (a kernel short of registers).
template <int H, int NC, class Weights>
__device__ __forceinline__ void lane_partials_of(const float (&x)[NC / 2], Weights wt,
                                                 float (&q)[NC / H][2]) {
  constexpr int QPT = NC / H;
  float p[QPT][2][2];
#pragma unroll
  for (int u = 0; u < QPT; ++u) p[u][0][0] = p[u][0][1] = p[u][1][0] = p[u][1][1] = 0.f;
#pragma unroll
  for (int j = 0; j < NC / 8; ++j) {
    const int u = j / (H / 8);
    const float2 wj = wt(j);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float& c = p[u][h][j & 1];
      c = fmaf(wj.x, relu(x[4 * j + 2 * h]), c);
      c = fmaf(wj.y, relu(x[4 * j + 2 * h + 1]), c);
    }
  }
#pragma unroll
  for (int u = 0; u < QPT; ++u)
#pragma unroll
    for (int h = 0; h < 2; ++h) q[u][h] = p[u][h][0] + p[u][h][1];
}

template <int H, int NC>
__device__ __forceinline__ void lane_partials(const float (&x)[NC / 2], const float2 (&wv)[NC / 8],
                                              float (&q)[NC / H][2]) {
  lane_partials_of<H, NC>(x, [&](int j) { return wv[j]; }, q);
}

// head_sums' butterfly as a reduce-scatter: each lane ends with only the values it stores,
// the same sums in the same order — after the lane ^ 1 step a lane holds q_L + q_{L^1}
// (head_sums' first add, a + b = b + a bit for bit), after the lane ^ 2 step (q_L + q_{L^1})
// + (q_{L^2} + q_{L^3}), head_sums' second.  Lane c of the quad keeps value k = 2u + h with
// k ≡ c (mod 4): h = c & 1, u ≡ c >> 1 (mod 2); r[v] is query u = 2v + (c >> 1) (QPT ≥ 2),
// or the single query (QPT = 1, every lane; lanes 2 and 3 hold lanes 0 and 1's values).
template <int QPT>
__device__ __forceinline__ void quad_scatter(const float (&q)[QPT][2], int qd,
                                             float (&r)[(QPT + 1) / 2]) {
  const bool b0 = qd & 1, b1 = qd & 2;
  float p[QPT];
#pragma unroll
  for (int u = 0; u < QPT; ++u) {
    const float keep = b0 ? q[u][1] : q[u][0], send = b0 ? q[u][0] : q[u][1];
    p[u] = keep + __shfl_xor_sync(0xffffffffu, send, 1);
  }
  if constexpr (QPT == 1) {
    r[0] = p[0] + __shfl_xor_sync(0xffffffffu, p[0], 2);
  } else {
#pragma unroll
    for (int v = 0; v < QPT / 2; ++v) {
      const float keep = b1 ? p[2 * v + 1] : p[2 * v], send = b1 ? p[2 * v] : p[2 * v + 1];
      r[v] = keep + __shfl_xor_sync(0xffffffffu, send, 2);
    }
  }
}

// The payload-unit scores Σ_h w_h [x_h]_+ of the warpgroup's 64 keys for the tile's NC/H
// queries from the combined dots x (the m64nNC accumulator layout: x[4j + 2h + e] is key
// row r_h, column 8j + 2qd + e) and the lane's weights wv (lane_weights): per lane and row
// two fmaf chains over the query's columns — its even column groups j and its odd ones,
// each in j order then e — added (even + odd), then the quad's butterfly (lane ^ 1, then
// ^ 2).  Every lane of a quad holds q[u][h]: query u's score of key row r_h (the caller
// multiplies by α).  The tree of a query does not depend on NC (a query's column groups
// start at a multiple of H / 8, which is even), so every tile width gives the same bits.
// Two chains, not one: four independent dependency chains per lane keep the FMA pipes busy.
template <int H, int NC>
__device__ __forceinline__ void head_sums(const float (&x)[NC / 2], const float2 (&wv)[NC / 8],
                                          float (&q)[NC / H][2]) {
  constexpr int QPT = NC / H;
  lane_partials<H, NC>(x, wv, q);
#pragma unroll
  for (int u = 0; u < QPT; ++u)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      q[u][h] = q[u][h] + __shfl_xor_sync(0xffffffffu, q[u][h], 1);
      q[u][h] = q[u][h] + __shfl_xor_sync(0xffffffffu, q[u][h], 2);
    }
}

}  // namespace fp8
}  // namespace dosa
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
