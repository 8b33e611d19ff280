// Shared by the stage files that kernels.cu includes: the key-tile size, the key-tile
// loader of the tiled kernels and the compact-writeback scorer of arbitrary key ids.
#pragma once
#include <cuda_fp8.h>

#include "common.cuh"

#ifdef DOSA_TILE_N
#define TILE_N DOSA_TILE_N  // keys per block tile (dense logits, fused route, screening)
#else
#define TILE_N 128
#endif
#define NEG_INF __int_as_float(0xff800000)

using namespace dosa;

// ---------------------------------------------------------------------------------------
// Key tiles in shared memory (dense logits and screening).
// ---------------------------------------------------------------------------------------
__device__ __forceinline__ void load_key_tile(const uint8_t* __restrict__ kp,
                                              const float* __restrict__ alpha, long long N,
                                              long long n0, uint8_t* sk, float* sa) {
  // e4m3 → f16 once per tile (reused by every query of the block); layout: see KeysSmem.
  for (int i = threadIdx.x; i < TILE_N * 8; i += blockDim.x) {
    const int r = i >> 3, m = i & 7, c = m >> 1, j = 2 * (m & 1);
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (n0 + r < N) v = __ldg(reinterpret_cast<const uint4*>(kp + (n0 + r) * DOSA_D) + m);
    uint8_t* row = sk + r * ROWH + c * 16;
    *reinterpret_cast<uint4*>(row + j * 64) = make_uint4(f16x2_lo(v.x), f16x2_hi(v.x), f16x2_lo(v.y), f16x2_hi(v.y));
    *reinterpret_cast<uint4*>(row + (j + 1) * 64) = make_uint4(f16x2_lo(v.z), f16x2_hi(v.z), f16x2_lo(v.w), f16x2_hi(v.w));
  }
  for (int i = threadIdx.x; i < TILE_N; i += blockDim.x) sa[i] = (n0 + i < N) ? __ldg(alpha + n0 + i) : 0.f;
}

// How the warps of a key-tile block (dense logits, fused route) walk its queries: warp w
// takes t = blockIdx.y·QG + w, + nw, … < tend; tile_n = the keys of the tile (the last tile
// of N may be short); pos = the key a lane owns after reduce8 (batch_pos).  A macro, not a
// function: the declarations stay the kernels' own (their cubins are unchanged by it).
#define DOSA_TILE_QUERIES(Qn, QG, N, n0)                                         \
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5; \
  const int pos = batch_pos(lane);                                                 \
  const int tend = min(Qn, (int)(blockIdx.y + 1) * QG);                            \
  const int tile_n = (int)min((long long)TILE_N, N - n0)

// ---------------------------------------------------------------------------------------
// Score a batch of 32 arbitrary keys (ids, −1 = empty) for one query and append the
// records with s ≥ τ to the query's buffer (compact writeback, docs/method.md §9).  my[u] =
// id of key g of group u (this lane loads it); id = the key at batch_pos(lane).  The
// counter counts every qualifying record, so a full buffer is detected (count > cap) and
// nothing is silently lost.
// ---------------------------------------------------------------------------------------
template <int MT>
__device__ __forceinline__ void score_ids_and_emit(const Scorer::Rows<MT>& A, const float (&wlo)[MT],
                                                   const float (&whi)[MT],
                                                   const uint8_t* __restrict__ kp,
                                                   const float* __restrict__ alpha,
                                                   const int (&my)[4], int id, float tau, int lane,
                                                   unsigned int* count, unsigned long long* rec,
                                                   long long cap) {
  KeysReg B;
  gather_keys(kp, my, lane, B);
  float s = Scorer::score<MT>(A, B, wlo, whi, lane);
  s = (id >= 0) ? s * __ldg(alpha + id) : 0.f;
  warp_emit(id >= 0 && s >= tau, s, id, lane, count, rec, cap);
}
