// Shared device code of every DoSA kernel (docs/method.md §8–§9).
//
// THE CANONICAL GPU SCORER (docs/method.md §1, eq. (1) in payload units):
//     s_i = α_i · Σ_h w'_h [q̄_h · k̄_i]_+
// q̄_h: e4m3 query payload of head h (query scale folded into w'_h), k̄_i: e4m3 key payload,
// α_i: fp32 key scale.  `score_batch` below is the ONLY place where this arithmetic is
// written; the dense route, seed scoring and refinement all call it, so a key's score is
// bit-for-bit the same value whichever route computes it (docs/method.md §9, "Refinement").
//
// Fixed MMA sequence (D = 128): keys are processed in batches of 32 = 4 groups of 8 (the
// n = 8 columns of mma.m16n8k16), heads in tiles of 16 (the m rows); e4m3 values are
// converted exactly to f16.  Lane (g = lane/4, c = lane%4) owns dims [32c, 32c+32) of key
// g of each group and of query rows g, g+8; step s' = 0..7 feeds dims 32c+4s'+{0,1} as
// k = 2c, 2c+1 and 32c+4s'+{2,3} as k = 2c+8, 2c+9.  Each (head tile, key) chain runs the
// eight steps in order from +0 with fp32 accumulation inside the MMA.  A column of the MMA
// depends only on its own key, so a key's score does not depend on the other keys.
// Head summation: per lane, fmaf over tiles mt = 0..MT-1, rows (g, then g+8); then the
// transpose-reduce `reduce8` over the 8 lanes sharing c (a fixed pairing tree, the same
// for every key); finally one fp32 multiply by α.
//
// The scorer interface (docs/design.md "Kernel sources"): ScorerF16 below names the query
// operand (Rows), the MMA chain of one batch (mma) and the full score of one batch (score)
// of this arithmetic; every kernel reaches them through `Scorer`, the build's canonical
// scorer, and its error model (the accumulator bits kept per step) is a property of the
// scorer (kMmaBits = dosa_cupy.scorer.MMA_BITS).
#pragma once
#include "ptx.cuh"

namespace dosa {

// k-order: lane c owns dims [32c, 32c+32) of every row; f16 step s' = 0..7 covers dims
// 32c + 4s' + {0,1} (MMA k = 2c, 2c+1) and 32c + 4s' + {2,3} (k = 2c+8, 2c+9).

// Query rows (MT tiles of 16 rows, payload [MT*16, 128] e4m3).  For MT ≤ 4 the f16
// fragments are kept in registers (converted once per query); for larger MT the e4m3
// words are kept and converted at each use (register budget).
#ifndef DOSA_QROWS_F16_MAX
#define DOSA_QROWS_F16_MAX 4  // f16 fragments in registers up to this MT (a tuning knob)
#endif
template <int MT>
struct QRows {
  static constexpr bool kF16 = MT <= DOSA_QROWS_F16_MAX;  // all H ≤ 64: 240 regs at MT=4
  uint32_t w8[kF16 ? 1 : MT][kF16 ? 1 : 2][8];     // [mt][row g / g+8][word]
  uint32_t h[kF16 ? MT : 1][8][4];                  // [mt][s'][a0..a3]
  __device__ __forceinline__ void load(const uint8_t* __restrict__ rows, int lane) {
    const int g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const uint4* lo = reinterpret_cast<const uint4*>(rows + (mt * 16 + g) * DOSA_D + 32 * c);
      const uint4* hi = reinterpret_cast<const uint4*>(rows + (mt * 16 + g + 8) * DOSA_D + 32 * c);
      const uint4 l0 = __ldg(lo), l1 = __ldg(lo + 1), h0 = __ldg(hi), h1 = __ldg(hi + 1);
      const uint32_t wl[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
      const uint32_t wh[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
#pragma unroll
      for (int sp = 0; sp < 8; ++sp) {
        if constexpr (kF16) {
          h[mt][sp][0] = f16x2_lo(wl[sp]);
          h[mt][sp][1] = f16x2_lo(wh[sp]);
          h[mt][sp][2] = f16x2_hi(wl[sp]);
          h[mt][sp][3] = f16x2_hi(wh[sp]);
        } else {
          w8[mt][0][sp] = wl[sp];
          w8[mt][1][sp] = wh[sp];
        }
      }
    }
  }
  __device__ __forceinline__ void frag(int mt, int sp, uint32_t& a0, uint32_t& a1, uint32_t& a2,
                                       uint32_t& a3) const {
    if constexpr (kF16) {
      a0 = h[mt][sp][0]; a1 = h[mt][sp][1]; a2 = h[mt][sp][2]; a3 = h[mt][sp][3];
    } else {
      a0 = f16x2_lo(w8[mt][0][sp]); a1 = f16x2_lo(w8[mt][1][sp]);
      a2 = f16x2_hi(w8[mt][0][sp]); a3 = f16x2_hi(w8[mt][1][sp]);
    }
  }
};

// Keys of a batch (4 groups × 8 keys) in a shared-memory f16 tile.  Row layout (ROWH
// bytes per key): 16-byte chunk (j, c) at j*64 + c*16 holds f16 dims 32c + 8j .. +8, i.e.
// the b0, b1 words of steps 2j and 2j+1 for lane c.  ROWH = 320 makes the LDS.128 of a
// quarter warp (g ∈ {2p, 2p+1}, c = 0..3) conflict-free.
#define ROWH 320
struct KeysSmem {
  const uint8_t* sk;  // row of key 0 of the batch
  __device__ __forceinline__ uint4 chunk(int u, int j, int lane) const {
    return *reinterpret_cast<const uint4*>(sk + (u * 8 + (lane >> 2)) * ROWH + j * 64 + (lane & 3) * 16);
  }
};

// Keys of a batch gathered from global memory (e4m3 payload): lane g holds bytes
// [32c, 32c+32) of key g of each group u.
struct KeysReg {
  uint4 v[4][2];
  __device__ __forceinline__ uint4 chunk(int u, int j, int) const {
    const uint4& x = v[u][j >> 1];
    const uint32_t w0 = (j & 1) ? x.z : x.x, w1 = (j & 1) ? x.w : x.y;
    return make_uint4(f16x2_lo(w0), f16x2_hi(w0), f16x2_lo(w1), f16x2_hi(w1));
  }
};

// Key fragments of 32 arbitrary keys: lane g loads key my[u] (= ids[8u + g]) of group u.
// (Used by seed_ids.cu and refine.cu.)
__device__ __forceinline__ void gather_keys(const uint8_t* __restrict__ kp, const int (&my)[4], int lane,
                                            KeysReg& K) {
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    K.v[u][0] = make_uint4(0u, 0u, 0u, 0u);
    K.v[u][1] = K.v[u][0];
    if (my[u] >= 0) {
      const uint4* p = reinterpret_cast<const uint4*>(kp + (long long)my[u] * DOSA_D + 32 * (lane & 3));
      K.v[u][0] = __ldg(p);
      K.v[u][1] = __ldg(p + 1);
    }
  }
}

// A batch = 4 key groups = 32 keys.  For every (row tile mt, group u) the accumulator
// chain runs over s' = 0..7 in order from +0 (the canonical MMA sequence); chains are
// interleaved for instruction-level parallelism, which does not change their values.
// AR: where the A fragments come from — QRows<MT> (registers; every route today) or any
// type with the same frag(mt, s', a0..a3) interface returning the same f16 words; the MMA
// sequence, hence every value, is the same.
template <int MT, class KS, class AR = QRows<MT>>
__device__ __forceinline__ void mma_batch(const AR& A, const KS& keys, int lane,
                                          float (&C)[4][MT][4]) {
#pragma unroll
  for (int u = 0; u < 4; ++u)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      C[u][mt][0] = 0.f; C[u][mt][1] = 0.f; C[u][mt][2] = 0.f; C[u][mt][3] = 0.f;
    }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint4 b[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) b[u] = keys.chunk(u, j, lane);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        uint32_t a0, a1, a2, a3;
        A.frag(mt, 2 * j + h, a0, a1, a2, a3);
#pragma unroll
        for (int u = 0; u < 4; ++u)
          mma_f16(C[u][mt], a0, a1, a2, a3, h ? b[u].z : b[u].x, h ? b[u].w : b[u].y);
      }
    }
  }
}

// Transpose-reduce over the 8 lanes sharing c (lane bits 2..4 = g): x[i] are the lane's
// partials of 8 values; afterwards lane g holds the full sum of value i = g.  Every value
// is summed by the same tree ((P_a + P_a^4) + (P_a^2 + P_a^6)) + ((P_a^1 + …) …) of lane
// partials — IEEE addition is commutative, so the result does not depend on which lane
// (i.e. which batch position) computes it.  7 shuffles for 8 values.
__device__ __forceinline__ float reduce8(const float (&x)[8], int lane) {
  const int g = lane >> 2;
  const bool b2 = (g & 4) != 0, b1 = (g & 2) != 0, b0 = (g & 1) != 0;
  float y[4], z[2];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float keep = b2 ? x[k + 4] : x[k], send = b2 ? x[k] : x[k + 4];
    y[k] = keep + __shfl_xor_sync(0xffffffffu, send, 16);
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const float keep = b1 ? y[k + 2] : y[k], send = b1 ? y[k] : y[k + 2];
    z[k] = keep + __shfl_xor_sync(0xffffffffu, send, 8);
  }
  const float keep = b0 ? z[1] : z[0], send = b0 ? z[0] : z[1];
  return keep + __shfl_xor_sync(0xffffffffu, send, 4);
}

// Position (0..31) in the batch of the key whose result lane (g, c) holds after reduce8:
// value i = g = 2u + v ↔ group u = g/2, key n = 2c + v of that group.
__device__ __forceinline__ int batch_pos(int lane) {
  const int g = lane >> 2, c = lane & 3;
  return 8 * (g >> 1) + 2 * c + (g & 1);
}

// One 16-row tile's share of the lane's two fmaf chains (keys 2c, 2c + 1 of a group): c is
// the tile's m16n8 accumulator (c[0], c[1]: row g; c[2], c[3]: row g + 8), wlo / whi the
// rows' weights; row g before row g + 8, as score_batch orders the canonical sum.
__device__ __forceinline__ void weigh_tile(const float* c, float wlo, float whi, float& a0,
                                           float& a1) {
  a0 = fmaf(wlo, fmaxf(c[0], 0.f), a0);
  a1 = fmaf(wlo, fmaxf(c[1], 0.f), a1);
  a0 = fmaf(whi, fmaxf(c[2], 0.f), a0);
  a1 = fmaf(whi, fmaxf(c[3], 0.f), a1);
}

// The screen's last tile (docs/method.md §9): the aux lane (aux_add = 1, g = 7) weighs
// [x_7 + x_15]_+ by lo = −σ_a and row 15 by hi = 0, the other lanes (aux_add = 0) weigh both
// rows by their ω — fmaf(1, c2, c0) = c0 + c2 (one rounding), fmaf(0, c2, c0) = c0 exactly.
__device__ __forceinline__ void weigh_last_tile(const float* c, float lo, float hi,
                                                float aux_add, float& a0, float& a1) {
  a0 = fmaf(lo, fmaxf(fmaf(aux_add, c[2], c[0]), 0.f), a0);
  a1 = fmaf(lo, fmaxf(fmaf(aux_add, c[3], c[1]), 0.f), a1);
  a0 = fmaf(hi, fmaxf(c[2], 0.f), a0);
  a1 = fmaf(hi, fmaxf(c[3], 0.f), a1);
}

// THE canonical scorer of one batch of 32 keys (see the header comment): per lane,
// x[2u+v] = fmaf chain over tiles mt of w'[16mt+g]·[C_row g]_+ then w'[16mt+g+8]·[C_row g+8]_+
// for key 2c+v of group u; then reduce8.  Returns the payload-unit sum Σ_h w'_h[x_h]_+
// of the key at batch_pos(lane); the caller multiplies by α (one fp32 multiply).
template <int MT, class KS, class AR = QRows<MT>>
__device__ __forceinline__ float score_batch(const AR& A, const KS& keys, const float (&wlo)[MT],
                                             const float (&whi)[MT], int lane) {
  float C[4][MT][4];
  mma_batch<MT, KS, AR>(A, keys, lane, C);
  float x[8];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    float a0 = 0.f, a1 = 0.f;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) weigh_tile(C[u][mt], wlo[mt], whi[mt], a0, a1);
    x[2 * u] = a0;
    x[2 * u + 1] = a1;
  }
  return reduce8(x, lane);
}

template <int MT>
__device__ __forceinline__ void load_weights(const float* __restrict__ w, float (&wlo)[MT],
                                             float (&whi)[MT], int lane) {
  const int g = lane >> 2;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    wlo[mt] = __ldg(w + mt * 16 + g);
    whi[mt] = __ldg(w + mt * 16 + g + 8);
  }
}

// The canonical scorer as one type: the f16 mma.sync chain above (its accumulator keeps
// kMmaBits bits per step: docs/error_model.md, docs/numerics.md "The mma.sync accumulator").
struct ScorerF16 {
  static constexpr int kMmaBits = 17;  // dosa_cupy.scorer.MMA_BITS (tests/test_cuda_build.py)
  template <int MT>
  using Rows = QRows<MT>;
  template <int MT, class KS>
  static __device__ __forceinline__ void mma(const Rows<MT>& A, const KS& keys, int lane,
                                             float (&C)[4][MT][4]) {
    mma_batch<MT>(A, keys, lane, C);
  }
  template <int MT, class KS>
  static __device__ __forceinline__ float score(const Rows<MT>& A, const KS& keys,
                                                const float (&wlo)[MT], const float (&whi)[MT],
                                                int lane) {
    return score_batch<MT>(A, keys, wlo, whi, lane);
  }
};
using Scorer = ScorerF16;  // the canonical scorer of every route

}  // namespace dosa
