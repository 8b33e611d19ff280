// The K-th largest of a row's records, found by one block (docs/method.md §10 "The
// witnesses' K-th in their kernel"): a most-significant-digit radix selection over the 64
// record bits in digits of 11, 11, 10, 11, 11 and 10 bits.  Each pass counts, in a shared
// histogram, the next digit of the records whose bits above it equal the K-th record's
// (found so far); the digit of the K-th record is the largest b with #(digit > b) < k ≤
// #(digit ≥ b), and k drops by #(digit > b).  Where one record is left with the known bits,
// it is the K-th, and one more pass fetches it.  No order is assumed of the records (a
// row's witnesses are appended by many blocks), and equal records are counted each time,
// so the result is the K-th of the multiset — the same record as select_kernel's K-th
// (dosa_cupy/emulate.py block_kth_record is this procedure on the host, step for step).
#pragma once

namespace dosa {

constexpr int kKthBins = 2048;  // the widest digit: 11 bits

struct KthShared {
  unsigned hist[kKthBins];
  unsigned part[32];  // per-warp sums of the digit search
  unsigned digit, above;
  unsigned long long found;
};

// The digit of rank k (1-based, from the top) in sh.hist[0 .. 2^width) and the count above
// it, into sh.digit / sh.above.  Thread t sums bins [nb − 16(t + 1), nb − 16t) of the
// padded 2048 (the highest first); an exclusive scan over the threads places k.  T threads, a
// multiple of 32 with 16·T ≥ kKthBins.  Requires 1 ≤ k ≤ the histogram's total.
template <int T>
__device__ __forceinline__ void kth_digit(KthShared& sh, unsigned k) {
  static_assert(T % 32 == 0 && 16 * T >= kKthBins, "T: threads of the block");
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int hi = kKthBins - 16 * t;  // bins [hi − 16, hi), hi ≤ 0 for surplus threads
  unsigned s = 0u;
  if (hi > 0)
#pragma unroll
    for (int j = 1; j <= 16; ++j) s += sh.hist[hi - j];
  unsigned inc = s;  // inclusive scan within the warp
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned v = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += v;
  }
  if (lane == 31) sh.part[warp] = inc;
  __syncthreads();
  unsigned before = inc - s;  // the exclusive prefix: warps before this one, then lanes
  for (int u = 0; u < warp; ++u) before += sh.part[u];
  if (s != 0u && before < k && k <= before + s) {  // exactly one thread
    unsigned acc = before;
    for (int j = hi - 1; j >= hi - 16; --j) {
      const unsigned c = sh.hist[j];
      if (acc + c >= k) {
        sh.digit = (unsigned)j;
        sh.above = acc;
        break;
      }
      acc += c;
    }
  }
  __syncthreads();
}

// The k-th largest (1 ≤ k ≤ n) of rec[0 .. n), read through L2 (records other blocks of the
// grid wrote: the caller has ordered them by a fence).  Every thread of the block calls it
// and gets the record.
template <int T>
__device__ __forceinline__ unsigned long long block_kth_record(
    const unsigned long long* __restrict__ rec, long long n, unsigned k, KthShared& sh) {
  const int t = threadIdx.x;
  unsigned long long prefix = 0ull;  // the K-th record's bits found so far
  int fixed = 0;                     // how many, from the top
#pragma unroll 1
  for (int d = 0; d < 6; ++d) {
    const int w = d % 3 == 2 ? 10 : 11, shift = 64 - fixed - w;
    for (int i = t; i < kKthBins; i += T) sh.hist[i] = 0u;
    __syncthreads();
    for (long long i = t; i < n; i += T) {
      const unsigned long long v = __ldcg(rec + i);
      if (fixed == 0 || (v >> (64 - fixed)) == (prefix >> (64 - fixed)))
        atomicAdd(&sh.hist[(unsigned)(v >> shift) & ((1u << w) - 1u)], 1u);
    }
    __syncthreads();
    kth_digit<T>(sh, k);
    const unsigned b = sh.digit, left = sh.hist[b];
    prefix |= (unsigned long long)b << shift;
    fixed += w;
    k -= sh.above;
    if (fixed == 64) return prefix;
    __syncthreads();  // every thread has read digit, above and hist[b]
    if (left == 1u) {  // one record has these bits: fetch it
      for (long long i = t; i < n; i += T) {
        const unsigned long long v = __ldcg(rec + i);
        if ((v >> shift) == (prefix >> shift)) sh.found = v;
      }
      __syncthreads();
      return sh.found;
    }
  }
  return prefix;  // not reached: the sixth digit fixes all 64 bits
}

}  // namespace dosa
