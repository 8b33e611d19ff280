#ifndef DOSA_SELECT_CU
#define DOSA_SELECT_CU
#include "stage.cuh"

// ---------------------------------------------------------------------------------------
// Exact selection (docs/method.md §7, §9): the K largest records (code << 32 | ~id) of a row —
// i.e. order score desc, id asc — by radix select over the 64-bit records (11-bit digits;
// records are distinct, so the K-th is unique and ties need no special case), candidates
// compacted into a per-block scratch buffer once they fit; then a bitonic sort of the K
// selected records — or, without ids, only their least (the K-th record: τ of the seeds).
// Sources: a dense logits row [ks, ke) (mode 0), two record lists (mode 1: seeds + compact
// records), or per row either of them (mode 2: the wide selection's records of recA when
// cntA[row] <= capA, else the logits row).  Outputs (each optional): ids int32 [rows, K]
// (−1 pads), kth[row] = the K-th record (0 when fewer than K).
// ---------------------------------------------------------------------------------------
#define SEL_THREADS 512
#define SEL_KMAX 4096
#define NBIN 2048

// One row's source.  SRC is a template argument so that the passes over a long logits row
// carry no per-element branch on the source kind: with the kind read per row (mode 2) the
// compiler kept that branch in the hot loop, and the dense route's selection ran 40 % slower
// (docs/records/notes.md "The selection's source kind").
template <int SRC>
struct SelSource {
  // SRC 0: a logits row [ks, ke)
  const float* logits;
  int ks, ke;
  // SRC 1: two record lists
  const unsigned long long* ra;
  long long na;
  const unsigned long long* rb;
  long long nb;
  __device__ __forceinline__ long long size() const {
    return SRC == 0 ? (long long)(ke - ks) : na + nb;
  }
  __device__ __forceinline__ unsigned long long get(long long i) const {
    if (SRC == 0) return make_record(logits[i + ks], (int)(ks + i));
    return i < na ? ra[i] : rb[i - na];
  }
};

// Shared memory of one select_kernel block.
struct SelShared {
  unsigned int hist[NBIN];
  unsigned long long sel[SEL_KMAX];
  unsigned int wsum[SEL_THREADS];
  int bin, above, cnt, n;
};

// f(get(i)) for i = tid, tid + SEL_THREADS, … < n, ILP records loaded before any is used,
// so that ILP loads of each thread are in flight at once (docs/method.md §9 "The selection's
// loads": the passes wait on their loads, long-scoreboard stalls first); the same records
// reach f, in another order.  select_row's ILP = 1 build keeps its plain loops: through this
// helper (or its lambdas in those loops) ptxas allocates the GPU-tested select_kernel
// differently (60 registers, not 56; cuobjdump), so it keeps them instruction for instruction.
template <int ILP, class Get, class F>
__device__ __forceinline__ void each_record(long long n, Get get, F f) {
  long long i = threadIdx.x;
  for (; i + (ILP - 1) * (long long)SEL_THREADS < n; i += ILP * (long long)SEL_THREADS) {
    unsigned long long r[ILP];
#pragma unroll
    for (int u = 0; u < ILP; ++u) r[u] = get(i + u * (long long)SEL_THREADS);
#pragma unroll
    for (int u = 0; u < ILP; ++u) f(r[u]);
  }
  for (; i < n; i += SEL_THREADS) f(get(i));
}

// Exact Top-K of one row's records into ids_row (K ids, −1 pads) and *kth (either may be
// null); buf: the block's candidate scratch of scap records.  ILP: each_record's loads in
// flight per thread (1: select_kernel, 4: select_kernel_ilp; the same selection).  ABOVE
// (select_kernel_buf; docs/method.md §9 "The selection's passes"): where the K − kk records
// above the bin fit the scratch beside the bin's, the compaction keeps them too (every record
// at or above the bin's lower edge), and the final pass (collect, or the K-th alone) reads
// the scratch, not the row: one pass over the row fewer, the same records ≥ T; the same
// passes as ILP's otherwise.
template <int SRC, int ILP, bool ABOVE = false>
__device__ __forceinline__ void select_row(const SelSource<SRC>& src, int K, SelShared& sh,
                                           unsigned long long* __restrict__ buf, long long scap,
                                           int* __restrict__ ids_row,
                                           unsigned long long* __restrict__ kth) {
  const int tid = threadIdx.x;
  const long long n = src.size();
  unsigned long long T = 0ull;  // select every record >= T
  [[maybe_unused]] bool from_buf = false;  // ABOVE: every record >= T is in buf[0 .. nfrom)
  [[maybe_unused]] long long nfrom = 0;
  if (n > K) {
    unsigned long long prefix = 0ull, mask = 0ull;
    int kk = K;
    bool in_buf = false;
    long long nbuf = 0;
    for (int d = 0; d < 6; ++d) {
      const int shf = d < 5 ? 53 - 11 * d : 0;
      const unsigned bm = d < 5 ? (NBIN - 1) : 511u;
      for (int i = tid; i < NBIN; i += SEL_THREADS) sh.hist[i] = 0u;
      __syncthreads();
      const auto count = [&](unsigned long long r) {
        if ((r & mask) == prefix) atomicAdd(&sh.hist[(r >> shf) & bm], 1u);
      };
      if constexpr (ILP > 1) {
        if (in_buf) each_record<ILP>(nbuf, [&](long long i) { return buf[i]; }, count);
        else each_record<ILP>(n, [&](long long i) { return src.get(i); }, count);
      } else if (in_buf) {
        for (long long i = tid; i < nbuf; i += SEL_THREADS) {
          const unsigned long long r = buf[i];
          if ((r & mask) == prefix) atomicAdd(&sh.hist[(r >> shf) & bm], 1u);
        }
      } else {
        for (long long i = tid; i < n; i += SEL_THREADS) {
          const unsigned long long r = src.get(i);
          if ((r & mask) == prefix) atomicAdd(&sh.hist[(r >> shf) & bm], 1u);
        }
      }
      __syncthreads();
      // bins from the top: thread tid owns bins 2047-4tid .. 2044-4tid
      unsigned loc = 0;
#pragma unroll
      for (int qd = 0; qd < 4; ++qd) loc += sh.hist[NBIN - 1 - 4 * tid - qd];
      sh.wsum[tid] = loc;
      __syncthreads();
      for (int o = 1; o < SEL_THREADS; o <<= 1) {  // inclusive scan (Hillis–Steele)
        const unsigned y = tid >= o ? sh.wsum[tid - o] : 0u;
        __syncthreads();
        sh.wsum[tid] += y;
        __syncthreads();
      }
      const unsigned incl = sh.wsum[tid], excl = incl - loc;
      if (excl < (unsigned)kk && incl >= (unsigned)kk) {
        unsigned acc = excl;
#pragma unroll
        for (int qd = 0; qd < 4; ++qd) {
          const int b = NBIN - 1 - 4 * tid - qd;
          if (acc + sh.hist[b] >= (unsigned)kk) {
            sh.bin = b;
            sh.above = (int)acc;
            sh.cnt = (int)sh.hist[b];
            break;
          }
          acc += sh.hist[b];
        }
      }
      __syncthreads();
      kk -= sh.above;
      prefix |= (unsigned long long)sh.bin << shf;
      mask |= (unsigned long long)bm << shf;
      const int cnt = sh.cnt;
      __syncthreads();
      if (cnt == kk) {
        T = prefix;
        break;
      }
      if (!in_buf && cnt <= scap) {
        // ABOVE: the K − kk records above the bin kept too where they fit — prefix has zeros
        // below the digits fixed so far, so r >= prefix is "in the bin or above"
        const bool all = ABOVE && cnt + (long long)(K - kk) <= scap;
        if (tid == 0) sh.n = 0;
        __syncthreads();
        const auto keep = [&](unsigned long long r) {
          if constexpr (ABOVE) {
            if (all ? r >= prefix : (r & mask) == prefix) buf[atomicAdd(&sh.n, 1)] = r;
          } else if ((r & mask) == prefix) {
            buf[atomicAdd(&sh.n, 1)] = r;
          }
        };
        if constexpr (ILP > 1) {
          each_record<ILP>(n, [&](long long i) { return src.get(i); }, keep);
        } else {
          for (long long i = tid; i < n; i += SEL_THREADS) {
            const unsigned long long r = src.get(i);
            if ((r & mask) == prefix) buf[atomicAdd(&sh.n, 1)] = r;
          }
        }
        __syncthreads();
        nbuf = sh.n;
        in_buf = true;
        if constexpr (ABOVE) from_buf = all;
        __syncthreads();
      }
    }
    if constexpr (ABOVE) nfrom = nbuf;
  }
  if (!ids_row) {
    // only the K-th record (τ of the seeds): the least record >= T, no sort
    if (tid == 0) sh.sel[0] = ~0ull;
    __syncthreads();
    unsigned long long mn = ~0ull;
    if constexpr (ABOVE) {
      const auto least = [&](unsigned long long r) {
        if (r >= T && r < mn) mn = r;
      };
      if (from_buf) each_record<ILP>(nfrom, [&](long long i) { return buf[i]; }, least);
      else each_record<ILP>(n, [&](long long i) { return src.get(i); }, least);
    } else if constexpr (ILP > 1) {
      each_record<ILP>(n, [&](long long i) { return src.get(i); }, [&](unsigned long long r) {
        if (r >= T && r < mn) mn = r;
      });
    } else {
      for (long long i = tid; i < n; i += SEL_THREADS) {
        const unsigned long long r = src.get(i);
        if (r >= T && r < mn) mn = r;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const unsigned long long y = __shfl_xor_sync(0xffffffffu, mn, o);
      mn = y < mn ? y : mn;
    }
    if ((tid & 31) == 0) atomicMin(&sh.sel[0], mn);
    __syncthreads();
    if (kth && tid == 0) *kth = (n >= K) ? sh.sel[0] : 0ull;
    __syncthreads();
    return;
  }
  // collect every record >= T (exactly min(K, n) of them)
  if (tid == 0) sh.n = 0;
  __syncthreads();
  const auto collect = [&](unsigned long long r) {
    if (r >= T) {
      const int p = atomicAdd(&sh.n, 1);
      if (p < SEL_KMAX) sh.sel[p] = r;
    }
  };
  if constexpr (ABOVE) {
    if (from_buf) each_record<ILP>(nfrom, [&](long long i) { return buf[i]; }, collect);
    else each_record<ILP>(n, [&](long long i) { return src.get(i); }, collect);
  } else if constexpr (ILP > 1) {
    each_record<ILP>(n, [&](long long i) { return src.get(i); }, collect);
  } else {
    for (long long i = tid; i < n; i += SEL_THREADS) {
      const unsigned long long r = src.get(i);
      if (r >= T) {
        const int p = atomicAdd(&sh.n, 1);
        if (p < SEL_KMAX) sh.sel[p] = r;
      }
    }
  }
  __syncthreads();
  const int m = min(sh.n, SEL_KMAX);
  int P2 = 1;
  while (P2 < m) P2 <<= 1;
  for (int i = m + tid; i < P2; i += SEL_THREADS) sh.sel[i] = 0ull;
  __syncthreads();
  for (int k2 = 2; k2 <= P2; k2 <<= 1) {
    for (int j = k2 >> 1; j > 0; j >>= 1) {
      for (int i = tid; i < P2; i += SEL_THREADS) {
        const int ixj = i ^ j;
        if (ixj > i) {
          const unsigned long long a = sh.sel[i], b = sh.sel[ixj];
          const bool desc = (i & k2) == 0;
          if (desc ? (a < b) : (a > b)) {
            sh.sel[i] = b;
            sh.sel[ixj] = a;
          }
        }
      }
      __syncthreads();
    }
  }
  if (ids_row) {
    for (int i = tid; i < K; i += SEL_THREADS)
      ids_row[i] = i < m ? (int)(~(uint32_t)(sh.sel[i] & 0xffffffffull)) : -1;
  }
  if (kth && tid == 0) *kth = (m >= K) ? sh.sel[K - 1] : 0ull;
  __syncthreads();
}

// The parameter list of select_kernel and its builds, and the arguments that hand it on.
#define DOSA_SELECT_PARAMS                                                                         \
  int mode, int rows, int K, const float* __restrict__ logits, long long ld,                       \
      const int* __restrict__ ks_, const int* __restrict__ ke_,                                    \
      const unsigned long long* __restrict__ recA, const unsigned int* __restrict__ cntA,          \
      long long capA, const unsigned long long* __restrict__ recB,                                 \
      const unsigned int* __restrict__ cntB, long long capB,                                       \
      unsigned long long* __restrict__ scratch, long long scap, int* __restrict__ ids_out,         \
      unsigned long long* __restrict__ kth_out
#define DOSA_SELECT_ARGS                                                                           \
  mode, rows, K, logits, ld, ks_, ke_, recA, cntA, capA, recB, cntB, capB, scratch, scap,          \
      ids_out, kth_out

// The rows of select_kernel (ILP 1), select_kernel_ilp (ILP 4; dense.SELECT_ILP) and
// select_kernel_buf (ILP 4, ABOVE; dense.SELECT_BUF).
template <int ILP, bool ABOVE = false>
__device__ __forceinline__ void select_rows_impl(DOSA_SELECT_PARAMS) {
  __shared__ SelShared sh;
  unsigned long long* buf = scratch + (long long)blockIdx.x * scap;
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    int* ids_row = ids_out ? ids_out + (long long)row * K : nullptr;
    unsigned long long* kth = kth_out ? kth_out + row : nullptr;
    // mode 2 (wide selection, below): the row's compacted records when they all fit, else
    // the logits row itself — exact either way, decided per row on the device
    const int src_mode = mode == 2 ? (cntA[row] <= capA ? 1 : 0) : mode;
    if (src_mode == 0) {
      SelSource<0> src;
      src.logits = logits + (long long)row * ld;
      src.ks = ks_[row];
      src.ke = ke_[row];
      select_row<0, ILP, ABOVE>(src, K, sh, buf, scap, ids_row, kth);
    } else {
      SelSource<1> src;
      src.ra = recA + (long long)row * capA;
      src.na = min((long long)cntA[row], capA);
      src.rb = recB ? recB + (long long)row * capB : nullptr;
      src.nb = recB ? min((long long)cntB[row], capB) : 0;
      select_row<1, ILP, ABOVE>(src, K, sh, buf, scap, ids_row, kth);
    }
  }
}

extern "C" __global__ void __launch_bounds__(SEL_THREADS) select_kernel(DOSA_SELECT_PARAMS) {
  select_rows_impl<1>(DOSA_SELECT_ARGS);
}

// Two blocks of 512 per SM, as select_kernel's 56 registers give (dense.SEL_BLOCKS).
extern "C" __global__ void __launch_bounds__(SEL_THREADS, 2)
    select_kernel_ilp(DOSA_SELECT_PARAMS) {
  select_rows_impl<4>(DOSA_SELECT_ARGS);
}

extern "C" __global__ void __launch_bounds__(SEL_THREADS, 2)
    select_kernel_buf(DOSA_SELECT_PARAMS) {
  select_rows_impl<4, true>(DOSA_SELECT_ARGS);
}

// ---------------------------------------------------------------------------------------
// Few rows of few records, by rank (docs/method.md §9 "Few rows of few records"): a decode
// step of one or two query rows selects from a few thousand records (its witnesses' K-th,
// then the records its scan kept), where select_kernel's one block per row spends its time
// in the passes' barriers and the sort with the rest of the GPU idle.  Records are distinct,
// so record i's rank #{j : rec[j] > rec[i]} is its place in the order (score desc, id asc):
// the ranks below K are the selection, rank K − 1 its K-th record.  Grid (gx, rows): block x
// ranks records [64x, 64x + 64) of its row, its 512 threads 64 records × 8 slices of each
// tile of SEL_KMAX records staged in shared memory (a warp's lanes read one record at a
// time: a broadcast).  A row of more than rank_max records is selected by block 0 alone as
// select_kernel_buf selects it (scratch: scap records per row).  Outputs as select_kernel's.
// ---------------------------------------------------------------------------------------
#define RANK_PER_BLOCK 64
#define RANK_SLICES (SEL_THREADS / RANK_PER_BLOCK)

extern "C" __global__ void __launch_bounds__(SEL_THREADS, 2)
    select_rank(int K, const unsigned long long* __restrict__ rec,
                const unsigned int* __restrict__ cnt, long long cap, long long rank_max,
                unsigned long long* __restrict__ scratch, long long scap,
                int* __restrict__ ids_out, unsigned long long* __restrict__ kth_out) {
  __shared__ SelShared sh;
  const int row = blockIdx.y, tid = threadIdx.x;
  const long long n = min((long long)cnt[row], cap);
  const unsigned long long* __restrict__ r_row = rec + (long long)row * cap;
  int* ids_row = ids_out ? ids_out + (long long)row * K : nullptr;
  unsigned long long* kth = kth_out ? kth_out + row : nullptr;
  if (n > rank_max) {  // row-uniform: the one-block selection
    if (blockIdx.x == 0) {
      SelSource<1> src;
      src.ra = r_row;
      src.na = n;
      src.rb = nullptr;
      src.nb = 0;
      select_row<1, 4, true>(src, K, sh, scratch + (long long)row * scap, scap, ids_row, kth);
    }
    return;
  }
  if (blockIdx.x == 0) {  // the padding of a row of fewer than K records
    if (ids_row)
      for (long long p = n + tid; p < K; p += SEL_THREADS) ids_row[p] = -1;
    if (kth && tid == 0 && n < K) *kth = 0ull;
  }
  const long long i0 = (long long)blockIdx.x * RANK_PER_BLOCK;
  if (i0 >= n) return;  // block-uniform
  const int il = tid % RANK_PER_BLOCK, slice = tid / RANK_PER_BLOCK;
  const long long i = i0 + il;
  const unsigned long long mine = i < n ? r_row[i] : ~0ull;
  if (tid < RANK_PER_BLOCK) sh.hist[tid] = 0u;
  unsigned rank = 0u;
  for (long long s = 0; s < n; s += SEL_KMAX) {
    const int m = (int)min(n - s, (long long)SEL_KMAX);
    __syncthreads();  // the previous tile read (and, first, the counters zeroed)
    for (int j = tid; j < m; j += SEL_THREADS) sh.sel[j] = r_row[s + j];
    __syncthreads();
#pragma unroll 8
    for (int j = slice; j < m; j += RANK_SLICES) rank += sh.sel[j] > mine ? 1u : 0u;
  }
  atomicAdd(&sh.hist[il], rank);
  __syncthreads();
  if (slice == 0 && i < n) {
    const unsigned rk = sh.hist[il];
    if (rk < (unsigned)K) {
      if (ids_row) ids_row[rk] = (int)(~(uint32_t)(mine & 0xffffffffull));
      if (kth && rk == (unsigned)K - 1u) *kth = mine;
    }
  }
}

// ---------------------------------------------------------------------------------------
// Wide selection of few long logits rows (docs/method.md §9 "Few long rows").  One block per
// row (select_kernel alone) leaves most SMs idle when rows are few, so the threshold is found
// by many blocks per row first:
//   select_wide_hist(level 0): histogram of the top 11 bits of the score code (d1 = code >> 21);
//   select_wide_cut(level 0):  d1* = the largest d1 with #(d1 >= d1*) >= K (all-in when the
//                              row has at most K keys), above = #(d1 > d1*) < K;
//   select_wide_hist(level 1): histogram of the next 11 bits (code >> 10 & 2047) of d1 == d1*;
//   select_wide_cut(level 1):  d2* the same way for K − above; T = d1* << 21 | d2* << 10;
//   select_wide_compact:       records of every key with code >= T (warp-aggregated, counted
//                              past cap);
//   select_kernel(mode 2):     exact Top-K of those records, or of the logits row when they
//                              did not fit.
// Every key of the Top-K has code >= T (at least K keys do, and they outrank every code < T),
// so selecting from the compacted records is exact; #records < K + the size of one 22-bit
// code bucket.  state[row] = {d1*, above, T, done} (done: the row has at most K keys).
// ---------------------------------------------------------------------------------------
#define WSEL_THREADS 256
#define WCUT_THREADS 1024

// One score code into the block's histogram h of its level (the top 11 bits; at level 1 the
// next 11 of the codes in bin d1), and the block's histogram added to the row's in global
// memory: the logits rows' (select_wide_hist) and the captured floor's (floor_wide_hist).
__device__ __forceinline__ void wsel_count_code(int level, uint32_t d1, uint32_t c, unsigned* h) {
  if (level == 0) atomicAdd(&h[c >> 21], 1u);
  else if ((c >> 21) == d1) atomicAdd(&h[(c >> 10) & (NBIN - 1)], 1u);
}

__device__ __forceinline__ void wsel_count(int level, uint32_t d1, float v, unsigned* h) {
  wsel_count_code(level, d1, score_code(v), h);
}

// The block's histogram h zeroed at the start of a level; false (the block returns) where the
// row is done — level 1 of a row that level 0 took whole.
__device__ __forceinline__ bool wsel_begin(int level, const unsigned* __restrict__ state, int row,
                                           unsigned* h) {
  if (level == 1 && state[4 * row + 3]) return false;
  for (int i = threadIdx.x; i < NBIN; i += WSEL_THREADS) h[i] = 0u;
  __syncthreads();
  return true;
}

__device__ __forceinline__ void wsel_flush(const unsigned* h, unsigned* __restrict__ hist_row) {
  for (int i = threadIdx.x; i < NBIN; i += WSEL_THREADS)
    if (h[i]) atomicAdd(&hist_row[i], h[i]);
}

extern "C" __global__ void __launch_bounds__(WSEL_THREADS) select_wide_hist(
    int level, const float* __restrict__ logits, long long ld, const int* __restrict__ ks_,
    const int* __restrict__ ke_, const unsigned* __restrict__ state, unsigned* __restrict__ hist) {
  __shared__ unsigned h[NBIN];
  const int row = blockIdx.y, tid = threadIdx.x;
  if (!wsel_begin(level, state, row, h)) return;
  const long long a = ks_[row], e = ke_[row];
  const float* lr = logits + (long long)row * ld;
  const uint32_t d1 = level ? state[4 * row] : 0u;
  const long long stride = (long long)gridDim.x * WSEL_THREADS;
  if ((ld & 3) == 0 && (reinterpret_cast<unsigned long long>(logits) & 15ull) == 0) {
    // float4 loads over the 16-byte words that meet [a, e)
    const float4* l4 = reinterpret_cast<const float4*>(lr);
    for (long long v = (a >> 2) + (long long)blockIdx.x * WSEL_THREADS + tid; 4 * v < e; v += stride) {
      const float4 x = __ldg(l4 + v);
      const long long i = 4 * v;
      if (i >= a) wsel_count(level, d1, x.x, h);
      if (i + 1 >= a && i + 1 < e) wsel_count(level, d1, x.y, h);
      if (i + 2 >= a && i + 2 < e) wsel_count(level, d1, x.z, h);
      if (i + 3 >= a && i + 3 < e) wsel_count(level, d1, x.w, h);
    }
  } else {
    for (long long i = a + (long long)blockIdx.x * WSEL_THREADS + tid; i < e; i += stride)
      wsel_count(level, d1, __ldg(lr + i), h);
  }
  __syncthreads();
  wsel_flush(h, hist + (long long)row * NBIN);
}

extern "C" __global__ void __launch_bounds__(WCUT_THREADS) select_wide_cut(
    int level, int K, const int* __restrict__ ks_, const int* __restrict__ ke_,
    const unsigned* __restrict__ hist, unsigned* __restrict__ state, unsigned* __restrict__ cnt) {
  __shared__ unsigned wsum[WCUT_THREADS / 32];
  const int row = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  unsigned* st = state + 4 * row;
  if (level == 0 && tid == 0) cnt[row] = 0u;
  if (level == 0 && (long long)ke_[row] - ks_[row] <= K) {  // every key is selected
    if (tid == 0) { st[0] = 0u; st[1] = 0u; st[2] = 0u; st[3] = 1u; }
    return;
  }
  if (level == 1 && st[3]) return;
  const unsigned kk = level ? (unsigned)K - st[1] : (unsigned)K;
  const unsigned* hr = hist + (long long)row * NBIN;
  // thread t owns bins 2047 − 2t and 2046 − 2t (from the top); inclusive scan of their sums
  const unsigned b0 = hr[NBIN - 1 - 2 * tid], b1 = hr[NBIN - 2 - 2 * tid];
  const unsigned loc = b0 + b1;
  unsigned incl = warp_inclusive_sum(loc, lane);
  if (lane == 31) wsum[warp] = incl;
  __syncthreads();
  if (warp == 0) wsum[lane] = warp_inclusive_sum(wsum[lane], lane);
  __syncthreads();
  incl += warp ? wsum[warp - 1] : 0u;
  const unsigned excl = incl - loc;
  if (excl < kk && incl >= kk) {  // exactly one thread: the K-th from the top is in its bins
    const bool first = excl + b0 >= kk;
    const unsigned d = first ? NBIN - 1 - 2 * tid : NBIN - 2 - 2 * tid;
    const unsigned above = first ? excl : excl + b0;
    if (level == 0) {
      st[0] = d; st[1] = above; st[3] = 0u;
    } else {
      st[2] = (st[0] << 21) | (d << 10);
    }
  }
}

extern "C" __global__ void __launch_bounds__(WSEL_THREADS) select_wide_compact(
    const float* __restrict__ logits, long long ld, const int* __restrict__ ks_,
    const int* __restrict__ ke_, const unsigned* __restrict__ state, long long cap,
    unsigned int* __restrict__ cnt, unsigned long long* __restrict__ rec) {
  const int row = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long a = ks_[row], e = ke_[row];
  const unsigned* st = state + 4 * row;
  const uint32_t T = st[3] ? 0u : st[2];
  const float* lr = logits + (long long)row * ld;
  const long long stride = (long long)gridDim.x * WSEL_THREADS;
  for (long long i0 = a + (long long)blockIdx.x * WSEL_THREADS + 32 * warp; i0 < e; i0 += stride) {
    const long long i = i0 + lane;  // i0 is warp-uniform: every lane reaches warp_emit
    const float v = i < e ? __ldg(lr + i) : 0.f;
    warp_emit(i < e && score_code(v) >= T, v, (int)i, lane, cnt + row,
              rec + (long long)row * cap, cap);
  }
}

// The captured floor by many blocks per row (docs/method.md §7 C.3; select.FLOOR_WIDE): for
// the overflowed rows oq[j] (j < n), select_wide_hist's two levels over the score codes of the
// cap records the first pass kept (rec[oq[j], :cap], all of them: the row overflowed), then
// select_wide_cut on the ranges [0, cap) finds T, the lower edge of the 22-bit code bucket of
// the row's K-th kept record; floor_of_cut turns it into a score.  code_score(T) ≤ that
// record's score (codes are monotone), so it is a floor: ≤ the row's K-th score (Prop. 4).
extern "C" __global__ void __launch_bounds__(WSEL_THREADS) floor_wide_hist(
    int level, const unsigned long long* __restrict__ rec, long long cap,
    const int* __restrict__ oq, const unsigned* __restrict__ state, unsigned* __restrict__ hist) {
  __shared__ unsigned h[NBIN];
  const int j = blockIdx.y, tid = threadIdx.x;
  if (!wsel_begin(level, state, j, h)) return;
  const unsigned long long* r = rec + (long long)oq[j] * cap;
  const uint32_t d1 = level ? state[4 * j] : 0u;
  const long long stride = (long long)gridDim.x * WSEL_THREADS;
  for (long long i = (long long)blockIdx.x * WSEL_THREADS + tid; i < cap; i += stride)
    wsel_count_code(level, d1, (uint32_t)(__ldg(r + i) >> 32), h);
  __syncthreads();
  wsel_flush(h, hist + (long long)j * NBIN);
}

// floor[j] = code_score(T) of select_wide_cut's state, −inf where the row holds at most K
// records (done) or where T is below every finite score's code (a NaN's code).
extern "C" __global__ void floor_of_cut(const unsigned* __restrict__ state, int n,
                                        float* __restrict__ floor) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= n) return;
  const float f = code_score(state[4 * j + 2]);
  floor[j] = (state[4 * j + 3] || f != f) ? NEG_INF : f;
}

// τ from the K-th seed record (−inf when fewer than K seeds: nothing is pruned) and, where
// ids is not null, the record's id j (select.kth_ids: ~ of the low word, NO_KTH_ID for the
// empty record 0) — one launch for the pair the seed stage reads (select.tau_of_seeds).
extern "C" __global__ void tau_from_kth(const unsigned long long* kth, int rows, float* tau,
                                        int* ids) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= rows) return;
  const unsigned long long r = kth[t];
  tau[t] = r ? code_score((uint32_t)(r >> 32)) : NEG_INF;
  if (ids) ids[t] = r ? (int)~(uint32_t)r : dosa::kNoKthId;
}

// The overflow extension from the spill (docs/method.md §7 C.3 "The spill"): for the
// overflowed rows oq[j] (j < n), the records s ≥ floor[j] among those the first pass kept
// (rec[oq[j], :cap], all cap of them: the row overflowed) and those it spilled (srec[k] with
// slot[srow[k]] = j, k < ns) are appended to rec2[j, :cap2], cnt2[j] counting them — the
// records a second refinement of the rows against floor would write, in another order.
// s ≥ floor is tested on the record's score, which code_score returns as the scorer computed
// it (−0 as +0, equal under ≥), so the test is the refine kernel's own.  One thread per
// record, a grid-stride loop over the kept records, then the spilled ones.
extern "C" __global__ void extend_from_spill(const unsigned long long* __restrict__ rec,
                                             long long cap, const int* __restrict__ oq, int n,
                                             const int* __restrict__ slot,
                                             const unsigned long long* __restrict__ srec,
                                             const int* __restrict__ srow, long long ns,
                                             const float* __restrict__ floor,
                                             unsigned int* __restrict__ cnt2,
                                             unsigned long long* __restrict__ rec2,
                                             long long cap2) {
  const long long kept = (long long)n * cap;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < kept + ns;
       i += (long long)gridDim.x * blockDim.x) {
    int j;
    unsigned long long r;
    if (i < kept) {
      j = (int)(i / cap);
      r = rec[(long long)oq[j] * cap + i % cap];
    } else {
      j = slot[srow[i - kept]];
      r = srec[i - kept];
    }
    if (j >= 0 && code_score((uint32_t)(r >> 32)) >= floor[j]) {
      const unsigned at = atomicAdd(cnt2 + j, 1u);
      if ((long long)at < cap2) rec2[(long long)j * cap2 + at] = r;
    }
  }
}

#endif  // DOSA_SELECT_CU
