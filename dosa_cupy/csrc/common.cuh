// Shared device code of every DoSA kernel (METHOD.md §8–§9).
//
// THE CANONICAL GPU SCORER (METHOD.md §1, eq. (1) in payload units):
//     s_i = α_i · Σ_h w'_h [q̄_h · k̄_i]_+
// q̄_h: e4m3 query payload of head h (query scale folded into w'_h), k̄_i: e4m3 key payload,
// α_i: fp32 key scale.  `score_batch` below is the ONLY place where this arithmetic is
// written; the dense route, seed scoring and refinement all call it, so a key's score is
// bit-for-bit the same value whichever route computes it (METHOD.md §9, "Refinement").
//
// Fixed MMA sequence (D = 128): keys are processed in batches of 32 = 4 groups of 8 (the
// n = 8 columns of mma.m16n8k32); heads in tiles of 16 (the m rows).  Lane (g = lane/4, c = lane%4) holds
// bytes [32c, 32c+32) of key g of the group.  k-step s ∈ {0,1,2,3} feeds the MMA with
// b0 = bytes 32c+8s+[0,4), b1 = bytes 32c+8s+[4,8) and the same bytes of the query rows
// (a0/a2 row g, a1/a3 row g+8).  Each head tile's four steps are chained through the
// accumulator in order s = 0,1,2,3 starting from +0.  A column of the MMA depends only on
// its own key, so the score of a key does not depend on the other keys of its group.
// Head summation: per lane, fmaf over tiles mt = 0..MT-1, rows (g, then g+8); then the
// transpose-reduce `reduce8` over the 8 lanes sharing c (a fixed pairing tree, the same
// for every key); finally one fp32 multiply by α.
#pragma once
#if defined(__CUDACC_RTC__)
typedef unsigned char uint8_t;
typedef unsigned int uint32_t;
#else
#include <stdint.h>
#endif

#define DOSA_D 128

namespace dosa {

__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t a0, const uint32_t a1,
                                         const uint32_t a2, const uint32_t a3, const uint32_t b0,
                                         const uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Query rows in registers: A[mt][s][0..3] for MT head tiles.  `rows` points at the
// query's [MT*16, 128] payload.
template <int MT>
__device__ __forceinline__ void load_rows(const uint8_t* __restrict__ rows, uint32_t (&A)[MT][4][4],
                                          int lane) {
  const int g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const uint4* lo = reinterpret_cast<const uint4*>(rows + (mt * 16 + g) * DOSA_D + 32 * c);
    const uint4* hi = reinterpret_cast<const uint4*>(rows + (mt * 16 + g + 8) * DOSA_D + 32 * c);
    uint4 l0 = __ldg(lo), l1 = __ldg(lo + 1), h0 = __ldg(hi), h1 = __ldg(hi + 1);
    // step s uses bytes 8s..8s+7 of the lane's 32 bytes: word 2s (a0/a1), word 2s+1 (a2/a3)
    A[mt][0][0] = l0.x; A[mt][0][1] = h0.x; A[mt][0][2] = l0.y; A[mt][0][3] = h0.y;
    A[mt][1][0] = l0.z; A[mt][1][1] = h0.z; A[mt][1][2] = l0.w; A[mt][1][3] = h0.w;
    A[mt][2][0] = l1.x; A[mt][2][1] = h1.x; A[mt][2][2] = l1.y; A[mt][2][3] = h1.y;
    A[mt][3][0] = l1.z; A[mt][3][1] = h1.z; A[mt][3][2] = l1.w; A[mt][3][3] = h1.w;
  }
}

// Key fragment: the lane's 32 bytes of its key row, as B[s][0..1].
__device__ __forceinline__ void key_frag(const uint4 u0, const uint4 u1, uint32_t (&B)[4][2]) {
  B[0][0] = u0.x; B[0][1] = u0.y; B[1][0] = u0.z; B[1][1] = u0.w;
  B[2][0] = u1.x; B[2][1] = u1.y; B[3][0] = u1.z; B[3][1] = u1.w;
}

// Raw MMA products of MT row tiles with one key group: C[mt][0..3] (rows g / g+8, keys
// 2c / 2c+1 of the group), each tile chained over s = 0..3 from +0.
template <int MT>
__device__ __forceinline__ void mma_group(const uint32_t (&A)[MT][4][4], const uint32_t (&B)[4][2],
                                          float (&C)[MT][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    C[mt][0] = 0.f; C[mt][1] = 0.f; C[mt][2] = 0.f; C[mt][3] = 0.f;
  }
#pragma unroll
  for (int s = 0; s < 4; ++s) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      mma_e4m3(C[mt], A[mt][s][0], A[mt][s][1], A[mt][s][2], A[mt][s][3], B[s][0], B[s][1]);
  }
}

// A batch = 4 key groups = 32 keys.  Same per-(tile, key) chains as mma_group (each chain
// runs s = 0..3 from +0), interleaved for instruction-level parallelism: the value of a
// chain does not depend on the interleaving.
template <int MT>
__device__ __forceinline__ void mma_batch(const uint32_t (&A)[MT][4][4], const uint32_t (&B)[4][4][2],
                                          float (&C)[4][MT][4]) {
#pragma unroll
  for (int u = 0; u < 4; ++u)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      C[u][mt][0] = 0.f; C[u][mt][1] = 0.f; C[u][mt][2] = 0.f; C[u][mt][3] = 0.f;
    }
#pragma unroll
  for (int s = 0; s < 4; ++s)
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        mma_e4m3(C[u][mt], A[mt][s][0], A[mt][s][1], A[mt][s][2], A[mt][s][3], B[u][s][0], B[u][s][1]);
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

// THE canonical scorer of one batch of 32 keys (see the header comment): per lane,
// x[2u+v] = fmaf chain over tiles mt of w'[16mt+g]·[C_row g]_+ then w'[16mt+g+8]·[C_row g+8]_+
// for key 2c+v of group u; then reduce8.  Returns the payload-unit sum Σ_h w'_h[x_h]_+
// of the key at batch_pos(lane); the caller multiplies by α (one fp32 multiply).
template <int MT>
__device__ __forceinline__ float score_batch(const uint32_t (&A)[MT][4][4], const uint32_t (&B)[4][4][2],
                                             const float (&wlo)[MT], const float (&whi)[MT], int lane) {
  float C[4][MT][4];
  mma_batch<MT>(A, B, C);
  float x[8];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    float a0 = 0.f, a1 = 0.f;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      a0 = fmaf(wlo[mt], fmaxf(C[u][mt][0], 0.f), a0);
      a1 = fmaf(wlo[mt], fmaxf(C[u][mt][1], 0.f), a1);
      a0 = fmaf(whi[mt], fmaxf(C[u][mt][2], 0.f), a0);
      a1 = fmaf(whi[mt], fmaxf(C[u][mt][3], 0.f), a1);
    }
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

// Monotone 32-bit score code (METHOD.md §9 "compact score code"): larger code ⇔ larger
// score; −0 is folded onto +0 (equal reals tie, then id decides); NaN → 0 (lowest).
__device__ __forceinline__ uint32_t score_code(float f) {
  uint32_t b = __float_as_uint(f);
  if (f != f) return 0u;
  if (f == 0.f) b = 0u;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float code_score(uint32_t c) {
  uint32_t b = (c & 0x80000000u) ? (c & 0x7fffffffu) : ~c;
  return __uint_as_float(b);
}

// Record = (code << 32) | ~id: the larger record is the earlier one in the order
// (score desc, id asc).  All records of distinct ids are distinct.
__device__ __forceinline__ unsigned long long make_record(float s, int id) {
  return ((unsigned long long)score_code(s) << 32) | (unsigned long long)(~(uint32_t)id);
}

}  // namespace dosa
