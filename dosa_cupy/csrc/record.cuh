// The record emitter (docs/method.md §9 "Compact writeback and selection"): the monotone
// score code, the (score, id) record, the warp-aggregated append and the survivor batches
// that refinement scores.  Every stage that writes records uses these, so one order
// (score desc, id asc) holds for all of them.
#pragma once
#include "scorer.cuh"

namespace dosa {

// Monotone 32-bit score code (docs/method.md §9 "compact score code"): larger code ⇔ larger
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

// Warp-aggregated compact writeback (docs/method.md §9): every lane with p appends the record
// (s, id) to rec[0 .. cap) through one atomicAdd per warp.  The counter counts every
// qualifying record, also past cap, so count > cap reveals an overflow and the caller
// re-runs with an exact-size buffer — nothing is silently dropped.  All 32 lanes call it.
__device__ __forceinline__ void warp_emit(bool p, float s, int id, int lane, unsigned int* count,
                                          unsigned long long* rec, long long cap) {
  const unsigned m = __ballot_sync(0xffffffffu, p);
  if (m == 0u) return;
  unsigned base = 0;
  if (lane == 0) base = atomicAdd(count, (unsigned)__popc(m));
  base = __shfl_sync(0xffffffffu, base, 0);
  if (p) {
    const unsigned at = base + __popc(m & ((1u << lane) - 1u));
    if ((long long)at < cap) rec[at] = make_record(s, id);
  }
}

// Survivor ids of one query's bitmask words [w0, w1), in key order, in batches of 32 (both
// refinement streams, docs/method.md §9).  The warp compacts the set bits of 32 words at a
// time into buf (room for 32 · 32 + 32 ids) and calls body(my, id) for every full batch and
// the last partial one: my[u] = the id of key g of group u (this lane gathers it), id = the
// key at batch_pos(lane), −1 padding.  Fewer than 32 ids carry over to the next 32 words.
template <class Body>
__device__ __forceinline__ void for_each_survivor_batch(const uint32_t* __restrict__ srow,
                                                        long long w0, long long w1, int* buf,
                                                        int lane, Body&& body) {
  const int g = lane >> 2, pos = batch_pos(lane);
  int have = 0;  // ids carried over in buf[0 .. have)
  for (long long wb = w0; wb < w1; wb += 32) {
    const long long wi = wb + lane;
    const uint32_t m = (wi < w1) ? srow[wi] : 0u;
    const int n = __popc(m);
    const int incl = warp_inclusive_sum(n, lane);
    const int total = have + __shfl_sync(0xffffffffu, incl, 31);
    int at = have + incl - n;
    uint32_t mm = m;
    while (mm) {
      const int bit = __ffs(mm) - 1;
      mm &= mm - 1u;
      buf[at++] = (int)(wi * 32 + bit);
    }
    __syncwarp();
    const bool last = wb + 32 >= w1;
    const int full = last ? total : (total & ~31);
    for (int j = 0; j < full; j += 32) {
      int my[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) my[u] = (j + 8 * u + g < total) ? buf[j + 8 * u + g] : -1;
      const int id = (j + pos < total) ? buf[j + pos] : -1;
      body(my, id);
    }
    __syncwarp();
    have = total - full;  // < 32 ids left: move them to the front
    const int src = (lane < have) ? buf[full + lane] : 0;
    __syncwarp();
    if (lane < have) buf[lane] = src;
    __syncwarp();
  }
}

}  // namespace dosa
