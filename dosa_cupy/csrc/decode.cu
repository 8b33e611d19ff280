// DoSA decode kernels (docs/method.md §10) over a paged FP8 KV cache (the layout of DeepGEMM's
// fp8_paged_mqa_logits): payload e4m3 [num_blocks, 64, 128], scale fp32 [num_blocks, 64],
// block table int32 [B, max_blocks], a visible end ke[r] per query row r = b·next_n + j
// (query j of request b sees logical keys [0, ke[r]); dosa_cupy.decode computes ke).
//
// Every score is dosa::score_batch (scorer.cuh) on keys gathered into registers (KeysReg,
// the same fragments the prefill refinement uses) times the key's fp32 scale: one
// arithmetic for the dense decode route, the witness scoring and the fused DoSA scan, and
// the same arithmetic as the prefill dense route (a key's score depends only on that key).
//
// Kernels (MT = head tiles of 16; heads padded to 16·MT with zero payload and weight):
//   decode_logits_mt{MT}   dense paged logits out[r, i] (−inf where i ≥ ke[r])
//   decode_fused_mt{MT}    score every visible key, compact the records at or above the
//                          row's threshold record thr[r]
//   decode_witness_mt{MT}  score the (distinct) witnesses of each row, records of the
//                          visible ones (thr is then their K-th record, select_kernel)
// Built by CuPy (RawModule, NVRTC, plain sm_90, -ftz=true) from dosa_cupy/decode.py and
// in CI by nvcc -arch=sm_90 (tests/test_cuda_build.py).
#include "common.cuh"

#define DEC_NEG_INF __int_as_float(0xff800000)
#define DEC_PAGE 64         // tokens per KV block (DeepGEMM paged layout)
#define DEC_WIT_KEYS 64     // witness entries per warp per row (2 batches: many warps per row)

using namespace dosa;

// Physical row (block·64 + offset) of logical token `i` of a request (bt_row = its block
// table row).  Also the index of the token's fp32 scale.
__device__ __forceinline__ long long dec_phys(const int* __restrict__ bt_row, int i) {
  return (long long)__ldg(bt_row + (i >> 6)) * DEC_PAGE + (i & (DEC_PAGE - 1));
}

// Key fragments of 32 logical keys through the block table: lane (g, c) loads bytes
// [32c, 32c+32) of key my[u] of group u (my[u] < 0: zero payload, an exact +0 column).
// Same register layout as common.cuh gather_keys (candidate for common.cuh, with the
// address computation as a parameter).
__device__ __forceinline__ void dec_gather(const uint8_t* __restrict__ kv, const int* __restrict__ bt_row,
                                           const int (&my)[4], int lane, KeysReg& K) {
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    K.v[u][0] = make_uint4(0u, 0u, 0u, 0u);
    K.v[u][1] = K.v[u][0];
    if (my[u] >= 0) {
      const uint4* p = reinterpret_cast<const uint4*>(kv + dec_phys(bt_row, my[u]) * DOSA_D + 32 * (lane & 3));
      K.v[u][0] = __ldg(p);
      K.v[u][1] = __ldg(p + 1);
    }
  }
}

// ---------------------------------------------------------------------------------------
// Scan of every visible key (docs/method.md §10 "The scan at the memory floor").
//
// Work items are (request b, tile t) pairs, tile = DEC_TILE logical keys (DEC_TILE / 64
// pages), item i = b·T + t with T = ceil(ld / DEC_TILE).  The grid is persistent: block x takes the
// contiguous items [x·per, (x+1)·per).  The block streams each item's payload and scales into
// shared memory with cp.async through a ring of DEC_STAGES stages, so up to DEC_STAGES − 1
// tiles are in flight while the warps score the current one; the bytes in flight, not the
// registers, hide the HBM latency.  A tile is loaded once for all next_n query rows of its
// request: warp w scores row j = w % n, batches (w / n)·n .. +n of the tile (8 / n warps per
// row, n batches of 32 keys each).  Keys at or past the request's last row's visible end are
// not loaded; their columns are never used.
//
// The arithmetic is score_batch on the same KeysReg fragments as before (lane (g, c) holds
// bytes [32c, 32c+32) of key g of each group), only read from shared memory: a key's score
// is unchanged.  Shared layout per stage: key k's 16-byte chunk c16 at k·128 + (c16 ^ (k&7))·16
// (the XOR swizzle makes a quarter warp's two LDS.128 conflict-free: lanes g = 2p, 2p+1 of a
// quarter read chunks 2c ^ g, which cover 8 distinct bank groups), then DEC_TILE fp32 scales.
// FUSED = false: dense logits, out[r·ld + i] for i < ld (−inf where i ≥ ke[r]).
// FUSED = true: records (code << 32 | ~id) at or above the row's threshold record thr[r] (the
// K-th witness record; 0 = every key) to rec[r·cap + ·].  Comparing records, not scores,
// keeps the rule exact for any score bits, NaN included (docs/method.md §10).
// ---------------------------------------------------------------------------------------
#ifndef DEC_TILE
#define DEC_TILE 512  // a multiple of 256 (8 warps × 32 keys); 512: docs/records/notes.md
#endif
#ifndef DEC_STAGES
#define DEC_STAGES 2
#endif
#define DEC_TILE_BYTES (DEC_TILE * DOSA_D)
#define DEC_STAGE_BYTES (DEC_TILE_BYTES + DEC_TILE * 4)
#define DEC_WARP_BATCHES (DEC_TILE / 256)  // batches of 32 keys per warp per tile and row

__device__ __forceinline__ void dec_cp16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void dec_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void dec_wait_ring() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(DEC_STAGES - 2));
}

// One (request, tile) work item's copies into a stage; always commits one group (possibly
// empty), so the ring's group count stays in step with the items.  Thread t copies chunk
// c16 = t & 7 of keys k = (t >> 3) + 32m: c16 and the swizzle are fixed per thread, and the
// page of k changes every second m (pages are 64 keys), so the block table is read once per
// two copies and the offsets stay 32-bit inside a page.
struct DecItem {
  int b, t;  // request, tile
  __device__ __forceinline__ void next(int T) {
    if (++t == T) { t = 0; ++b; }
  }
};

__device__ __forceinline__ void dec_issue(bool live, DecItem it, uint32_t dst,
                                          const uint8_t* __restrict__ kv,
                                          const float* __restrict__ ksc,
                                          const int* __restrict__ bt, int max_blocks,
                                          const int* __restrict__ ke_, int next_n) {
  if (live) {
    const int base = it.t * DEC_TILE;
    const int kmax = __ldg(ke_ + (long long)it.b * next_n + next_n - 1) - base;  // keys to load
    const int* pages = bt + (long long)it.b * max_blocks + (base >> 6);
    const int k0 = threadIdx.x >> 3, c16 = threadIdx.x & 7;
    const uint32_t d0 = dst + k0 * DOSA_D + ((c16 ^ (k0 & 7)) << 4);
#pragma unroll
    for (int m = 0; m < DEC_TILE / 32; m += 2) {
      if (32 * m + k0 >= kmax) break;  // keys are loaded in order: the rest is not visible
      const uint8_t* page = kv + (long long)__ldg(pages + (m >> 1)) * (DEC_PAGE * DOSA_D) + c16 * 16;
      dec_cp16(d0 + 32 * m * DOSA_D, page + k0 * DOSA_D);
      if (32 * m + 32 + k0 < kmax) dec_cp16(d0 + (32 * m + 32) * DOSA_D, page + (k0 + 32) * DOSA_D);
    }
    // scales: 4 per copy (16 per page), thread t < DEC_TILE / 4 copies keys 4t .. 4t + 3
    if (threadIdx.x < DEC_TILE / 4 && 4 * (int)threadIdx.x < kmax) {
      const int k = 4 * threadIdx.x;
      dec_cp16(dst + DEC_TILE_BYTES + 4 * k,
               ksc + (long long)__ldg(pages + (k >> 6)) * DEC_PAGE + (k & (DEC_PAGE - 1)));
    }
  }
  dec_commit();
}

template <int MT, bool FUSED>
__device__ void dec_scan_impl(const uint8_t* __restrict__ q, const float* __restrict__ w,
                              const uint8_t* __restrict__ kv, const float* __restrict__ ksc,
                              const int* __restrict__ bt, int max_blocks, const int* __restrict__ ke_,
                              int next_n, long long ld, int nreq, long long per,
                              float* __restrict__ out, const unsigned long long* __restrict__ thr,
                              unsigned int* __restrict__ count, unsigned long long* __restrict__ rec,
                              long long cap) {
  extern __shared__ __align__(128) uint8_t dec_smem[];
  const int T = (int)((ld + DEC_TILE - 1) / DEC_TILE);
  const long long it0 = (long long)blockIdx.x * per;
  const long long it1 = min(it0 + per, (long long)nreq * T);
  if (it0 >= it1) return;
  const int items = (int)(it1 - it0);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3, pos = batch_pos(lane);
  // warp w: row j = w % n, batches (w / n)·NB .. +NB of the tile, NB = DEC_WARP_BATCHES · n
  const int n = next_n, j = warp % n, nbw = DEC_WARP_BATCHES * n, bi0 = (warp / n) * nbw;
  const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(dec_smem);
  DecItem cur{(int)(it0 / T), (int)(it0 % T)}, iss = cur;
#pragma unroll 1
  for (int s = 0; s < DEC_STAGES - 1; ++s) {
    dec_issue(s < items, iss, sbase + s * DEC_STAGE_BYTES, kv, ksc, bt, max_blocks, ke_, n);
    iss.next(T);
  }
  Scorer::Rows<MT> A;
  float wlo[MT], whi[MT];
  int cur_b = -1, hi = 0;
  long long r = 0;
  unsigned long long tq = 0ull;
#pragma unroll 1
  for (int x0 = 0; x0 < items; ++x0, cur.next(T)) {
    const int st = x0 % DEC_STAGES;
    dec_wait_ring();
    __syncthreads();  // item x0's copies are visible; every warp is done with stage x0 − 1
    dec_issue(x0 + DEC_STAGES - 1 < items, iss,
              sbase + ((x0 + DEC_STAGES - 1) % DEC_STAGES) * DEC_STAGE_BYTES, kv, ksc, bt,
              max_blocks, ke_, n);
    iss.next(T);
    if (cur.b != cur_b) {  // warp-uniform: a new request's query row
      cur_b = cur.b;
      r = (long long)cur.b * n + j;
      A.load(q + r * (MT * 16) * DOSA_D, lane);
      load_weights<MT>(w + r * (MT * 16), wlo, whi, lane);
      hi = __ldg(ke_ + r);
      if (FUSED) tq = thr[r];
    }
    const uint8_t* sk = dec_smem + st * DEC_STAGE_BYTES;
    const float* ssc = reinterpret_cast<const float*>(sk + DEC_TILE_BYTES);
#pragma unroll 1
    for (int x = 0; x < nbw; ++x) {
      const int bi = bi0 + x;
      const int i0 = cur.t * DEC_TILE + bi * 32;
      if (i0 >= ld) continue;  // ld is a multiple of 64: the whole batch is past the row
      const int id = i0 + pos;
      if (i0 >= hi) {  // warp-uniform: nothing of the batch is visible to row r
        if (!FUSED) out[r * ld + id] = DEC_NEG_INF;
        continue;
      }
      KeysReg Kr;
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const uint8_t* row = sk + (bi * 32 + u * 8 + g) * DOSA_D;  // key index ≡ g (mod 8)
        Kr.v[u][0] = *reinterpret_cast<const uint4*>(row + (((2 * c) ^ g) << 4));
        Kr.v[u][1] = *reinterpret_cast<const uint4*>(row + (((2 * c + 1) ^ g) << 4));
      }
      const float sc = Scorer::score<MT>(A, Kr, wlo, whi, lane);
      const bool vis = id < hi;
      const float s = vis ? sc * ssc[bi * 32 + pos] : DEC_NEG_INF;
      if constexpr (FUSED) {
        warp_emit(vis && make_record(s, id) >= tq, s, id, lane, count + r, rec + r * cap, cap);
      } else {
        out[r * ld + id] = s;
      }
    }
  }
  asm volatile("cp.async.wait_all;\n" ::);
}

// ---------------------------------------------------------------------------------------
// Witness scoring.  wit [B, Wc] int32: per request the distinct witness ids (−1 = empty
// slot).  For row r = (b, j): every witness id in [0, ke[r]) is scored (same arithmetic
// as the scan) and its record appended to rec[r·Wc + ·] (count[r]; cap Wc: never full).
// grid (ceil(Wc / (warps·DEC_WIT_KEYS)), rows).
// ---------------------------------------------------------------------------------------
template <int MT>
__device__ void dec_witness_impl(const uint8_t* __restrict__ q, const float* __restrict__ w,
                                 const uint8_t* __restrict__ kv, const float* __restrict__ ksc,
                                 const int* __restrict__ bt, int max_blocks, const int* __restrict__ ke_,
                                 int next_n, const int* __restrict__ wit, int Wc,
                                 unsigned int* __restrict__ count, unsigned long long* __restrict__ rec) {
  const int r = blockIdx.y;
  const int b = r / next_n;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const long long j0 = ((long long)blockIdx.x * nw + warp) * DEC_WIT_KEYS;
  const long long j1 = min(j0 + DEC_WIT_KEYS, (long long)Wc);
  if (j0 >= j1) return;
  const int ke = ke_[r];
  const int* wrow = wit + (long long)b * Wc;
  // Skip the warp when none of its witnesses is visible (e.g. the empty first step).
  bool any = false;
  for (long long x = j0 + lane; x < j1; x += 32) {
    const int id = wrow[x];
    any |= id >= 0 && id < ke;
  }
  if (!__any_sync(0xffffffffu, any)) return;
  const int* bt_row = bt + (long long)b * max_blocks;
  Scorer::Rows<MT> A;
  float wlo[MT], whi[MT];
  A.load(q + (long long)r * (MT * 16) * DOSA_D, lane);
  load_weights<MT>(w + (long long)r * (MT * 16), wlo, whi, lane);
  const int g = lane >> 2, pos = batch_pos(lane);
  for (long long x0 = j0; x0 < j1; x0 += 32) {
    int my[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const long long x = x0 + 8 * u + g;
      const int id = x < j1 ? wrow[x] : -1;
      my[u] = (id >= 0 && id < ke) ? id : -1;
    }
    const long long xp = x0 + pos;
    int id = xp < j1 ? wrow[xp] : -1;
    if (id >= ke) id = -1;
    if (!__any_sync(0xffffffffu, id >= 0)) continue;  // warp-uniform
    KeysReg Kr;
    dec_gather(kv, bt_row, my, lane, Kr);
    const float sc = Scorer::score<MT>(A, Kr, wlo, whi, lane);
    const float s = id >= 0 ? sc * __ldg(ksc + dec_phys(bt_row, id)) : 0.f;
    warp_emit(id >= 0, s, id, lane, count + r, rec + (long long)r * Wc, (long long)Wc);
  }
}

#define DEC_INST(MT)                                                                            \
  extern "C" __global__ void __launch_bounds__(256, 1) decode_logits_mt##MT(                       \
      const uint8_t* q, const float* w, const uint8_t* kv, const float* ksc, const int* bt,    \
      int max_blocks, const int* ke, int next_n, long long ld, int nreq, long long per,        \
      float* out) {                                                                             \
    dec_scan_impl<MT, false>(q, w, kv, ksc, bt, max_blocks, ke, next_n, ld, nreq, per, out,    \
                             nullptr, nullptr, nullptr, 0);                                     \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(256, 1) decode_fused_mt##MT(                        \
      const uint8_t* q, const float* w, const uint8_t* kv, const float* ksc, const int* bt,    \
      int max_blocks, const int* ke, int next_n, long long ld, int nreq, long long per,        \
      const unsigned long long* thr, unsigned int* count, unsigned long long* rec, long long cap) {\
    dec_scan_impl<MT, true>(q, w, kv, ksc, bt, max_blocks, ke, next_n, ld, nreq, per, nullptr, \
                            thr, count, rec, cap);                                              \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(256) decode_witness_mt##MT(                      \
      const uint8_t* q, const float* w, const uint8_t* kv, const float* ksc, const int* bt,    \
      int max_blocks, const int* ke, int next_n, const int* wit, int Wc, unsigned int* count,  \
      unsigned long long* rec) {                                                                \
    dec_witness_impl<MT>(q, w, kv, ksc, bt, max_blocks, ke, next_n, wit, Wc, count, rec);      \
  }
DEC_INST(1)
DEC_INST(2)
DEC_INST(3)
DEC_INST(4)

// ---------------------------------------------------------------------------------------
// Per-step bookkeeping on the device (docs/method.md §10 "No per-step host work"): one launch
// each instead of a chain of array operations.
// ---------------------------------------------------------------------------------------

// Visible ends ke[b·n + j] = max(0, lengths[b] − n + j + 1) (dosa_cupy.decode.visible_ends),
// and the layout check: bad[0] = the least b with lengths[b] outside [0, max_blocks·64],
// bad[1] = the least b·max_blocks + i with block i used by request b (i < ceil(lengths[b]/64))
// and block_table[b, i] outside [0, num_blocks).  bad[] starts at INT_MAX (no violation).
// grid (ceil(max_blocks / 256), B), 256 threads.
extern "C" __global__ void decode_layout(const int* __restrict__ lengths,
                                         const int* __restrict__ bt, int max_blocks,
                                         int num_blocks, int next_n, int check,
                                         int* __restrict__ ke, int* __restrict__ bad) {
  const int b = blockIdx.y;
  const int L = lengths[b];
  const long long Lmax = (long long)max_blocks * DEC_PAGE;
  if (blockIdx.x == 0 && threadIdx.x < next_n) {
    const int j = threadIdx.x;
    ke[b * next_n + j] = max(0, L - next_n + j + 1);
    if (check && j == 0 && (L < 0 || (long long)L > Lmax)) atomicMin(bad, b);
  }
  if (!check) return;
  const int used = (int)((min(max((long long)L, 0ll), Lmax) + DEC_PAGE - 1) / DEC_PAGE);
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < used) {
    const int e = bt[(long long)b * max_blocks + i];
    if (e < 0 || e >= num_blocks) atomicMin(bad + 1, b * max_blocks + i);
  }
}

// Distinct witnesses per request (dosa_cupy.decode.witness_table): every id of row b of src
// [B, Wc] int32 (−1 = empty) is inserted into an open-addressing hash set in shared memory
// (P2 slots, a power of two ≥ 2·Wc: load factor ≤ ½; atomicCAS, linear probing); the copy
// whose insertion succeeds is written to dst at its own position, every other copy and every
// empty slot as −1.  Which copy survives may vary between runs; the set of ids in the row does
// not, and that set is all the threshold depends on (its K-th record).  dst may be src: a
// thread reads its entry before writing it.  One block of DEC_DEDUP_THREADS per row; dynamic
// shared memory 4·P2 bytes.
//
// kZeroCounts (decode_witness_dedup_zero, docs/method.md §10 "No per-step host work"): block b
// also zeroes its request's next_n entries of each of the step's two counters, counts[0, ·]
// (the witness records) and counts[1, ·] (the scan's records), counts uint32 [2, R] with
// R = B·next_n — the two memsets of the step, in the launch that precedes both readers — and,
// where ke is not null, writes its rows' visible ends ke[b·n + j] = max(0, lengths[b] − n +
// j + 1) as decode_layout does without its check.
#define DEC_DEDUP_THREADS 1024
template <bool kZeroCounts>
__device__ __forceinline__ void dec_dedup(const int* src, int* dst, int Wc, int P2,
                                          unsigned* counts, int next_n, const int* lengths,
                                          int* ke) {
  extern __shared__ int dd[];
  const int* in = src + (long long)blockIdx.x * Wc;
  int* row = dst + (long long)blockIdx.x * Wc;
  if (kZeroCounts && threadIdx.x < 2 * next_n) {
    const int R = gridDim.x * next_n, c = threadIdx.x / next_n, j = threadIdx.x % next_n;
    counts[(long long)c * R + (long long)blockIdx.x * next_n + j] = 0u;
    if (ke != nullptr && c == 0)
      ke[blockIdx.x * next_n + j] = max(0, lengths[blockIdx.x] - next_n + j + 1);
  }
  for (int i = threadIdx.x; i < P2; i += blockDim.x) dd[i] = -1;
  __syncthreads();
  for (int i = threadIdx.x; i < Wc; i += blockDim.x) {
    const int v = in[i];
    int keep = -1;
    if (v >= 0) {
      unsigned h = ((unsigned)v * 2654435761u) & (unsigned)(P2 - 1);
      while (true) {
        const int old = atomicCAS(dd + h, -1, v);
        if (old == -1) {  // inserted: this copy is the row's witness v
          keep = v;
          break;
        }
        if (old == v) break;  // another copy of v is in
        h = (h + 1u) & (unsigned)(P2 - 1);
      }
    }
    row[i] = keep;
  }
}

extern "C" __global__ void __launch_bounds__(DEC_DEDUP_THREADS) decode_witness_dedup(
    const int* src, int* dst, int Wc, int P2) {
  dec_dedup<false>(src, dst, Wc, P2, nullptr, 0, nullptr, nullptr);
}

extern "C" __global__ void __launch_bounds__(DEC_DEDUP_THREADS) decode_witness_dedup_zero(
    const int* src, int* dst, int Wc, int P2, unsigned int* counts, int next_n,
    const int* lengths, int* ke) {
  dec_dedup<true>(src, dst, Wc, P2, counts, next_n, lengths, ke);
}

// The witness ring (dosa_cupy/decode_ops.py): ring [B, h·nK] int32, slot s = ctr % h holds a
// step's selection ids [B, nK].  decode_ring_push writes the step's ids into the slot;
// decode_ring_advance moves the counter in a launch of its own, after every block of the
// push has read it.
extern "C" __global__ void decode_ring_push(const int* __restrict__ ids, int* __restrict__ ring,
                                            const int* __restrict__ ctr, int B, int nK, int h) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (long long)B * nK) return;
  const long long b = i / nK, x = i % nK;
  const unsigned slot = (unsigned)ctr[0] % (unsigned)h;
  ring[b * h * nK + (long long)slot * nK + x] = ids[i];
}

extern "C" __global__ void decode_ring_advance(int* ctr) {
  if (threadIdx.x == 0 && blockIdx.x == 0) ctr[0] = (int)((unsigned)ctr[0] + 1u);
}

// A step's last launch (docs/method.md §10 "No per-step host work"): the selection's ids
// [B·nK] int32 into out (int64 [B·nK]; null: none) and into ring slot ctr % h (ring null: no
// history); the block that finishes last moves ctr and re-arms done (uint32, 0 between
// launches) — the push, the counter's advance and the ids' int64 copy in one graph node.
// Every block reads ctr before its thread 0 counts the block done, so the counter moves
// after the last read of it.  grid ceil(B·nK / 256), 256 threads.
extern "C" __global__ void decode_step_finish(const int* __restrict__ ids,
                                              long long* __restrict__ out, int* __restrict__ ring,
                                              int* ctr, unsigned int* done, int B, int nK,
                                              int h) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned c = ring != nullptr ? (unsigned)*(volatile int*)ctr : 0u;
  const unsigned slot = ring != nullptr ? c % (unsigned)h : 0u;
  if (i < (long long)B * nK) {
    const int v = ids[i];
    if (out != nullptr) out[i] = v;
    if (ring != nullptr) ring[(i / nK) * h * nK + (long long)slot * nK + i % nK] = v;
  }
  if (ring == nullptr) return;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(done, 1u) == gridDim.x - 1) {
      *ctr = (int)(c + 1u);
      *done = 0u;
    }
  }
}
