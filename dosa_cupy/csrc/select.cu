#ifndef DOSA_SELECT_CU
#define DOSA_SELECT_CU
#include "stage.cuh"

// ---------------------------------------------------------------------------------------
// Exact selection (docs/method.md §7, §9): the K largest records (code << 32 | ~id) of a row —
// i.e. order score desc, id asc — by radix select over the 64-bit records (11-bit digits;
// records are distinct, so the K-th is unique and ties need no special case), candidates
// compacted into a per-block scratch buffer once they fit; then a bitonic sort of the K
// selected records.  Sources: a dense logits row [ks, ke) (mode 0) or two record lists
// (mode 1: seeds + compact records).  Outputs (each optional): ids int32 [rows, K] (−1
// pads), kth[row] = the K-th record (0 when fewer than K).
// ---------------------------------------------------------------------------------------
#define SEL_THREADS 512
#define SEL_KMAX 4096
#define NBIN 2048

struct SelSource {
  int mode;
  // mode 0
  const float* logits;
  long long ld;
  int ks, ke;
  // mode 1
  const unsigned long long* ra;
  long long na;
  const unsigned long long* rb;
  long long nb;
  __device__ __forceinline__ long long size() const { return mode == 0 ? (long long)(ke - ks) : na + nb; }
  __device__ __forceinline__ unsigned long long get(long long i) const {
    if (mode == 0) return make_record(logits[i + ks], (int)(ks + i));
    return i < na ? ra[i] : rb[i - na];
  }
};

extern "C" __global__ void __launch_bounds__(SEL_THREADS) select_kernel(
    int mode, int rows, int K, const float* __restrict__ logits, long long ld,
    const int* __restrict__ ks_, const int* __restrict__ ke_,
    const unsigned long long* __restrict__ recA, const unsigned int* __restrict__ cntA, long long capA,
    const unsigned long long* __restrict__ recB, const unsigned int* __restrict__ cntB, long long capB,
    unsigned long long* __restrict__ scratch, long long scap, int* __restrict__ ids_out,
    unsigned long long* __restrict__ kth_out) {
  __shared__ unsigned int hist[NBIN];
  __shared__ unsigned long long sel[SEL_KMAX];
  __shared__ unsigned int wsum[SEL_THREADS];
  __shared__ int s_bin, s_above, s_cnt, s_n;
  const int tid = threadIdx.x;
  unsigned long long* buf = scratch + (long long)blockIdx.x * scap;
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    SelSource src;
    src.mode = mode;
    if (mode == 0) {
      src.logits = logits + (long long)row * ld;
      src.ks = ks_[row];
      src.ke = ke_[row];
    } else {
      src.ra = recA + (long long)row * capA;
      src.na = min((long long)cntA[row], capA);
      src.rb = recB ? recB + (long long)row * capB : nullptr;
      src.nb = recB ? min((long long)cntB[row], capB) : 0;
    }
    const long long n = src.size();
    unsigned long long T = 0ull;  // select every record >= T
    if (n > K) {
      unsigned long long prefix = 0ull, mask = 0ull;
      int kk = K;
      bool in_buf = false;
      long long nbuf = 0;
      for (int d = 0; d < 6; ++d) {
        const int sh = d < 5 ? 53 - 11 * d : 0;
        const unsigned bm = d < 5 ? (NBIN - 1) : 511u;
        for (int i = tid; i < NBIN; i += SEL_THREADS) hist[i] = 0u;
        __syncthreads();
        if (in_buf) {
          for (long long i = tid; i < nbuf; i += SEL_THREADS) {
            const unsigned long long r = buf[i];
            if ((r & mask) == prefix) atomicAdd(&hist[(r >> sh) & bm], 1u);
          }
        } else {
          for (long long i = tid; i < n; i += SEL_THREADS) {
            const unsigned long long r = src.get(i);
            if ((r & mask) == prefix) atomicAdd(&hist[(r >> sh) & bm], 1u);
          }
        }
        __syncthreads();
        // bins from the top: thread tid owns bins 2047-4tid .. 2044-4tid
        unsigned loc = 0;
#pragma unroll
        for (int qd = 0; qd < 4; ++qd) loc += hist[NBIN - 1 - 4 * tid - qd];
        wsum[tid] = loc;
        __syncthreads();
        for (int o = 1; o < SEL_THREADS; o <<= 1) {  // inclusive scan (Hillis–Steele)
          const unsigned y = tid >= o ? wsum[tid - o] : 0u;
          __syncthreads();
          wsum[tid] += y;
          __syncthreads();
        }
        const unsigned incl = wsum[tid], excl = incl - loc;
        if (excl < (unsigned)kk && incl >= (unsigned)kk) {
          unsigned acc = excl;
#pragma unroll
          for (int qd = 0; qd < 4; ++qd) {
            const int b = NBIN - 1 - 4 * tid - qd;
            if (acc + hist[b] >= (unsigned)kk) {
              s_bin = b;
              s_above = (int)acc;
              s_cnt = (int)hist[b];
              break;
            }
            acc += hist[b];
          }
        }
        __syncthreads();
        kk -= s_above;
        prefix |= (unsigned long long)s_bin << sh;
        mask |= (unsigned long long)bm << sh;
        const int cnt = s_cnt;
        __syncthreads();
        if (cnt == kk) {
          T = prefix;
          break;
        }
        if (!in_buf && cnt <= scap) {
          if (tid == 0) s_n = 0;
          __syncthreads();
          for (long long i = tid; i < n; i += SEL_THREADS) {
            const unsigned long long r = src.get(i);
            if ((r & mask) == prefix) buf[atomicAdd(&s_n, 1)] = r;
          }
          __syncthreads();
          nbuf = s_n;
          in_buf = true;
          __syncthreads();
        }
      }
    }
    // collect every record >= T (exactly min(K, n) of them)
    if (tid == 0) s_n = 0;
    __syncthreads();
    for (long long i = tid; i < n; i += SEL_THREADS) {
      const unsigned long long r = src.get(i);
      if (r >= T) {
        const int p = atomicAdd(&s_n, 1);
        if (p < SEL_KMAX) sel[p] = r;
      }
    }
    __syncthreads();
    const int m = min(s_n, SEL_KMAX);
    int P2 = 1;
    while (P2 < m) P2 <<= 1;
    for (int i = m + tid; i < P2; i += SEL_THREADS) sel[i] = 0ull;
    __syncthreads();
    for (int k2 = 2; k2 <= P2; k2 <<= 1) {
      for (int j = k2 >> 1; j > 0; j >>= 1) {
        for (int i = tid; i < P2; i += SEL_THREADS) {
          const int ixj = i ^ j;
          if (ixj > i) {
            const unsigned long long a = sel[i], b = sel[ixj];
            const bool desc = (i & k2) == 0;
            if (desc ? (a < b) : (a > b)) {
              sel[i] = b;
              sel[ixj] = a;
            }
          }
        }
        __syncthreads();
      }
    }
    if (ids_out) {
      for (int i = tid; i < K; i += SEL_THREADS)
        ids_out[(long long)row * K + i] = i < m ? (int)(~(uint32_t)(sel[i] & 0xffffffffull)) : -1;
    }
    if (kth_out && tid == 0) kth_out[row] = (m >= K) ? sel[K - 1] : 0ull;
    __syncthreads();
  }
}

// τ from the K-th seed record (−inf when fewer than K seeds: nothing is pruned).
extern "C" __global__ void tau_from_kth(const unsigned long long* kth, int rows, float* tau) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= rows) return;
  const unsigned long long r = kth[t];
  tau[t] = r ? code_score((uint32_t)(r >> 32)) : NEG_INF;
}

#endif  // DOSA_SELECT_CU
