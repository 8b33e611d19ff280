// Scores of gathered keys on the native FP8 scorer (scorer_fp8.cuh; docs/error_model.md "A
// native FP8 scorer"): for query t and the ids of its row, out[t, m] = α_i · Σ_h w_h
// [q̄_h · k̄_i]_+ with i = ids[t, m] (−inf where i < 0) — the arithmetic of dense_fp8.cu's
// logits, bit for bit: the same fresh k32 steps in halves, the same head sum, a key's bits
// independent of its row in the tile (the probe's position checks) and of the MMA's column
// count (H = 32 runs m64n32k32 with one query, the dense logits m64n64k32 with two).  One
// warpgroup per block and 64 ids per tile; keys gathered by 16-byte copies into the
// 128-byte-swizzled tile (a gather: the bulk tensor copy of Hopper reads boxes, not rows by id).
//
// score_fp8_ids_h{H} (scores into a dense [Qn, M] array; bench/fp8_dense) gathers one tile
// with ordinary loads and stores (gather_keys, tile_dots, tile_sums).  The record stages
// (docs/method.md §9 "Compact writeback and selection") stream their tiles through a ring of
// kKeyStages key stages filled by cp.async (stream_tiles): while a tile is scored, the
// gathers of the next kKeyStages − 1 are in flight, one barrier per tile; each lane's α (and
// record id) of the next tile is loaded during this tile's MMA, and a warp's atomicAdd that
// reserves its records is consumed one tile later (Pend) — every global latency of a tile
// overlaps other work instead of adding to it.  The scores are those of tile_dots and
// tile_sums (dots below: the same MMAs, the same adds in the same order):
//   refine_fp8_h{H}       the set bits of the query's survivor bitmask (refinement, §9)
//   refine_fp8_spill_h{H} the same, a row's records past its cap appended to the spill
//   seed_score_fp8_h{H}   key ranges [lo, hi) of a key array, record id idmap[i] (seeds, §2);
//                         128 / H consecutive queries per block share each gathered key tile
//   seed_ids_fp8_h{H}     a table of explicit seed ids (seeds, §2)
#include "scorer_fp8.cuh"
#include "record.cuh"  // make_record: one record format for all stages
#include "epilogue.cuh"  // guard_bound_ru32: the screens' fp32 guard, written once
#include "select_block.cuh"  // block_kth_record: the witnesses' K-th in their kernel

// Bitmask words per refine_fp8 block (the host launches ⌈NW / RWF⌉ blocks per query in y,
// dosa_cupy/refine.py RWF): 65,536 keys, so at a survival of 0.5–2 % a block scores 5–20
// tiles through its key ring (the ring's fill and drain and the block's fixed costs — its
// query tile, its bitmask scan — are paid once per block).
#define RWF 2048
// Survivor ids per refine_fp8 pass (a multiple of 64): the block compacts the ids of its
// words once (one scan of the threads' popcounts) and scores them in windows of RCAP; at the
// survival of the calibrated regime every block needs one window.
#define RCAP 2048

// Sizes every target sees (the kernels' launch bounds; the sm_90 build parses the same
// parameter lists with empty bodies).
namespace dosa {
namespace fp8 {
constexpr int kTileBytes = 64 * 128;       // a tile: 64 keys × 128 bytes
constexpr int kCwg = 3;                    // decode_scan_tma: consumer warpgroups
constexpr int kTmaSlots = 3;               // slots per consumer warpgroup
constexpr int kTmaRing = kCwg * kTmaSlots;  // slots of the block
constexpr int kTmaThreads = 128 * (1 + kCwg);  // the producer and the consumers
// dynamic shared memory of decode_scan_tma (NC columns): the alignment slack, the key slots,
// the query tile, the slots' α, the mbarriers
__host__ __device__ constexpr int decode_tma_smem(int NC) {
  return 1024 + kTmaRing * kTileBytes + NC * 128 + kTmaRing * 64 * 4 + 2 * kTmaRing * 8;
}
}  // namespace fp8
}  // namespace dosa

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace dosa {
namespace fp8 {

// The query's H e4m3 rows into the 128-byte-swizzled B tile and its H weights (once per
// block; the first tile_dots' barrier publishes them).
template <int H>
__device__ __forceinline__ void load_query(const uint8_t* __restrict__ q,
                                           const float* __restrict__ w, int tq, uint8_t* sq,
                                           float* sw) {
  const int t = threadIdx.x;
  for (int it = t; it < H * 8; it += 128) {
    const int r = it >> 3, j = it & 7;
    *reinterpret_cast<uint4*>(sq + sw128_offset(r, j)) =
        __ldg(reinterpret_cast<const uint4*>(q + ((long long)tq * H + r) * 128 + 16 * j));
  }
  if (t < H) sw[t] = w[(long long)tq * H + t];
}

// The 64 key rows id_of(r) (r = 0..63; an index of kp, or −1: a zero row) into the swizzled
// A tile: 64 rows × 8 chunks of 16 bytes, 4 per thread (ordinary stores: tile_dots
// fences them for the tensor cores).
template <class IdOf>
__device__ __forceinline__ void gather_keys(const uint8_t* __restrict__ kp, uint8_t* sk,
                                            IdOf&& id_of) {
  const int t = threadIdx.x;
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // 64 keys × 8 chunks of 16 bytes
    const int it = t + 128 * i, r = it >> 3, j = it & 7;
    const int id = id_of(r);
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (id >= 0) v = __ldg(reinterpret_cast<const uint4*>(kp + (long long)id * 128 + 16 * j));
    *reinterpret_cast<uint4*>(sk + sw128_offset(r, j)) = v;
  }
}

// The fresh k32 steps of a tile in two halves, each half's two steps added in k order
// (add_half) into acc; hook() runs while the first half's MMAs are in flight (a kernel's
// next gather, or nothing).
template <int H, class Hook>
__device__ __forceinline__ void fresh_halves(uint64_t da, uint64_t db, float (&acc)[H / 2],
                                             Hook&& hook) {
  float x[2][H / 2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    pin(x[0]);
    pin(x[1]);
    fence();
    mma_e4m3<H>(x[0], da + 4 * half, db + 4 * half, 0);
    mma_e4m3<H>(x[1], da + 4 * half + 2, db + 4 * half + 2, 0);
    commit();
    if (half == 0) hook();
    wait<0>();
    add_half<H>(x, acc, half == 0);
  }
}

// The FP8 scorer on the gathered tile (docs/error_model.md "A native FP8 scorer"), in two
// parts.  tile_dots: the fresh k32 steps in two halves, each half's two steps added in k
// order (add_half) into acc; it starts with the proxy fence and barrier that make the
// tiles' ordinary stores visible to the wgmma and ends with every warp past wait<0> (the
// tensor cores have read sk: after one more barrier the tile may be overwritten).
template <int H>
__device__ __forceinline__ void tile_dots(const uint8_t* sk, const uint8_t* sq,
                                          float (&acc)[H / 2]) {
  // shared memory written by ordinary stores and read by the tensor cores (async proxy)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  const uint64_t da = desc_sw128((uint32_t)__cvta_generic_to_shared(sk));
  const uint64_t db = desc_sw128((uint32_t)__cvta_generic_to_shared(sq));
  fresh_halves<H>(da, db, acc, [] {});
}

// tile_sums: the fixed head-sum tree of the lane's weights (qd = lane % 4): s[0][h] is the
// head sum of key row 16·warp + g + 8h (g = lane / 4) in every lane of the quad, before α.
template <int H>
__device__ __forceinline__ void tile_sums(const float (&acc)[H / 2], const float* sw, int qd,
                                          float (&s)[1][2]) {
  float2 wv[H / 8];
  lane_weights<H>(sw, qd, wv);
  head_sums<H, H>(acc, wv, s);
}

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
  gather_keys(kp, sk, [&](int r) { return m0 + r < M ? row_ids[m0 + r] : -1; });
  load_query<H>(q, w, tq, sq, sw);
  float acc[H / 2];
  tile_dots<H>(sk, sq, acc);
  const int warp = t >> 5, lane = t & 31, g = lane >> 2, qd = lane & 3;
  float s[1][2];
  tile_sums<H>(acc, sw, qd, s);
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // lane qd = h writes key row 16·warp + g + 8h
    if (qd != h) continue;
    const int m = m0 + 16 * warp + g + 8 * h;
    if (m >= M) continue;
    const int id = row_ids[m];
    out[(long long)tq * M + m] = id >= 0 ? s[0][h] * __ldg(alpha + id) : neg_inf();
  }
}

// ---- The record stages: a ring of gathered key tiles ----

// Key stages of the ring (tiles of 64 keys × 128 bytes): the gathers of kKeyStages − 1 tiles
// are in flight while one is scored.
constexpr int kKeyStages = 3;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}
// cp.async (PTX ISA, "cp.async"): 16 bytes global → shared (dst: a shared-window address,
// smem_u32) without a register round trip; src-size 0 writes 16 zero bytes and reads nothing (a missing key: a zero row, as
// gather_keys stores).  .ca: cached in L1 like gather_keys' __ldg (blocks of one SM refine
// the same key chunk for different queries, whose survivors overlap).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool present) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(present ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_u32(dst)), "l"(src)
               : "memory");
}
__device__ __forceinline__ void cp_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// The rows of QB consecutive queries t0 .. t0 + QB − 1 (the first nq of them exist; the
// others' rows are zero-filled and never used) into QB swizzled B tiles of H rows (query u
// at sq + u·H·128) and their weights into sw[u·H ..]: one cp.async group, the first of the
// block (so the first stream_tiles wait completes it).
template <int H, int QB>
__device__ __forceinline__ void load_queries_async(const uint8_t* __restrict__ q,
                                                   const float* __restrict__ w, int t0, int nq,
                                                   uint8_t* sq, float* sw) {
  static_assert(QB * H <= 128, "one weight per thread");
  const int t = threadIdx.x;
#pragma unroll
  for (int i = 0; i < QB * H * 8 / 128; ++i) {
    const int it = t + 128 * i, r = it >> 3, j = it & 7;  // row r (query r / H), chunk j
    const bool ok = r < nq * H;
    // rows of consecutive queries are consecutive: one 128-row swizzled layout (H % 8 == 0)
    cp_async16(smem_u32(sq + sw128_offset(r, j)), ok ? q + ((long long)t0 * H + r) * 128 + 16 * j : q,
               ok);
  }
  if (t < nq * H) cp_async4(sw + t, w + (long long)t0 * H + t);
  cp_commit();
}

// The 64 key rows id_of(r) (r = 0..63; an index of kp, or −1: a zero row) into the swizzled
// tile sk by cp.async (the layout of gather_keys: thread t copies chunk j = t & 7 of rows
// r0 + 16i, r0 = t >> 3).  The rows r0 + 16i agree with r0 mod 8, so their swizzled
// destinations are sw128_offset(r0, j) + 16i·128 and their sources kp + 16j + 128·id: one
// destination and one source base per thread, not four (the tile loops of the record stages
// are instruction-bound: docs/records/notes.md "Session 23").  No commit: stream_tiles
// commits one group per tile.
template <class IdOf>
__device__ __forceinline__ void gather_async(const uint8_t* __restrict__ kp, uint8_t* sk,
                                             IdOf&& id_of) {
  const int t = threadIdx.x, r0 = t >> 3, j = t & 7;
  const uint32_t d0 = smem_u32(sk) + (uint32_t)sw128_offset(r0, j);
  const uint8_t* src0 = kp + 16 * j;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int id = id_of(r0 + 16 * i);  // −1: reads nothing (src-size 0) at kp's first row
    cp_async16(d0 + 2048u * i, src0 + (long long)max(id, 0) * 128, id >= 0);
  }
}

// The fresh k32 steps of one tile (da: the keys, db: the query's H heads) summed into acc in
// tile_dots' order, ((x0 + x1) + x2) + x3 (add_half), so with its bits; without its fence and
// barrier (stream_tiles does them once per tile) and with a hook run while the first two
// steps are in flight: the next tile's gather and loads are issued in the shadow of this
// tile's MMA.  H = 32: tile_dots' schedule (two halves of two steps: three buffers of 16
// registers).  H = 64: steps 0 and 1 into acc and x, then 2 and 3 one at a time into x
// (dense_fp8.cu FRESH = 2) — two buffers of 32 registers instead of three, so the record
// kernels fit 128 registers (four blocks per SM) at the cost of one more wait.
template <int H, class Hook>
__device__ __forceinline__ void dots(uint64_t da, uint64_t db, float (&acc)[H / 2], Hook&& hook) {
  if constexpr (H == 64) {
    float x[H / 2];
    fresh_steps<H>(acc, x, da, db, hook);
  } else {
    fresh_halves<H>(da, db, acc, hook);
  }
}

// The lane's emitted value of tile_sums' head sums: lanes qd = 0 and 1 of a quad emit its
// key rows 16·warp + g and + 8 (h = qd & 1); lanes 2 and 3 none.
__device__ __forceinline__ int emit_row(int warp, int lane) {
  return 16 * warp + (lane >> 2) + 8 * (lane & 1);
}

// atomicAdd's relaxed device-scope add (PTX ISA "atom"; SASS ATOMG.E.ADD.STRONG.GPU either
// way) whose result is read one tile later.  ptxas aggregates an atom whose address it
// proves warp-uniform — a vote, the atom by one lane, and a SHFL of its result right after
// it, which waits for the round trip to L2 that emit_flush means to defer (this holds for
// atomicAdd and for inline PTX alike, checked in the SASS).  Offsetting the counter by
// threadIdx.x >> 10 (zero: a block has at most 1,024 threads) leaves an address ptxas does
// not prove uniform, so it keeps the atom as written and the SHFL where emit_flush puts it.
__device__ __forceinline__ unsigned reserve(unsigned int* count, unsigned n) {
  unsigned old;
  asm volatile("atom.global.add.u32 %0, [%1], %2;\n"
               : "=r"(old)
               : "l"((unsigned long long)__cvta_generic_to_global(count + (threadIdx.x >> 10))),
                 "r"(n)
               : "memory");
  return old;
}
// A warp's records of one tile, reserved but not yet written: record.cuh warp_emit in two
// halves.  emit_issue ballots the lanes that append and lane 0 reserves their slots by one
// atomicAdd (the counter counts every qualifying record, also past cap: an overflow is
// detected, never silent; docs/method.md §9); emit_flush, called one tile later, reads the
// atomic's result and writes the records — so the atomic's round trip to L2 overlaps the next
// tile instead of stalling this one.  The records and the count are warp_emit's.
struct Pend {
  unsigned m, base;  // the ballot of appending lanes; lane 0: the reserved first slot
  float sc;
  int id;
};
__device__ __forceinline__ void emit_issue(Pend& e, bool p, float sc, int id, int lane,
                                           unsigned int* count) {
  e.m = __ballot_sync(0xffffffffu, p);
  e.sc = sc;
  e.id = id;
  e.base = 0u;
  if (lane == 0 && e.m != 0u) e.base = reserve(count, (unsigned)__popc(e.m));
}
__device__ __forceinline__ void emit_flush(const Pend& e, int lane, unsigned long long* rec,
                                           long long cap) {
  if (e.m == 0u) return;  // warp-uniform
  const unsigned base = __shfl_sync(0xffffffffu, e.base, 0);
  if ((e.m >> lane) & 1u) {
    const unsigned at = base + __popc(e.m & ((1u << lane) - 1u));
    if ((long long)at < cap) rec[at] = make_record(e.sc, e.id);
  }
}

// The spill of refinement's first pass (docs/method.md §7 C.3 "The spill"): the records of a
// row past its cap, appended with their row to one pool that every row of the launch shares
// (rec[:cap], row[:cap]).  count counts every spilled record, also past cap, so a full pool
// is detected: the extension then scores the overflowed rows again.  It is 64-bit: a chunk
// of Qn rows of N keys can spill up to Qn · N records, past 2^32 at Qn · N = 4,096 · 1M,
// and a 32-bit count that wrapped would read as a pool that held them all.  With the pool, an
// overflowed row's records s ≥ τ are all kept (its cap and its spilled ones), and its
// extension selects among them instead of scoring its survivors a second time.
struct Spill {
  unsigned long long* count;
  unsigned long long* rec;
  int* row;
  long long cap;
};
struct NoSpill {};  // records past cap are counted only (the rows scored again on overflow)

__device__ __forceinline__ void emit_flush(const Pend& e, int lane, unsigned long long* rec,
                                           long long cap, NoSpill, int) {
  emit_flush(e, lane, rec, cap);
}
// emit_flush, and the warp's records past cap appended to the spill (one atomicAdd per warp;
// a row overflows rarely, so the test is the only cost of the common case).
__device__ __forceinline__ void emit_flush(const Pend& e, int lane, unsigned long long* rec,
                                           long long cap, const Spill& sp, int row) {
  emit_flush(e, lane, rec, cap);
  if (e.m == 0u) return;  // warp-uniform
  const unsigned base = __shfl_sync(0xffffffffu, e.base, 0);
  if ((long long)base + __popc(e.m) <= cap) return;  // warp-uniform: nothing past cap
  const unsigned at = base + __popc(e.m & ((1u << lane) - 1u));
  const unsigned m = __ballot_sync(0xffffffffu, ((e.m >> lane) & 1u) && (long long)at >= cap);
  unsigned long long first = 0ull;
  if (lane == 0) first = atomicAdd(sp.count, (unsigned long long)__popc(m));
  first = __shfl_sync(0xffffffffu, first, 0);
  if ((m >> lane) & 1u) {
    const unsigned long long k = first + __popc(m & ((1u << lane) - 1u));
    if (k < (unsigned long long)sp.cap) {
      sp.rec[k] = make_record(e.sc, e.id);
      sp.row[k] = row;
    }
  }
}

// The ring (the multistage cp.async pipeline of the CUDA C++ Programming Guide, "Asynchronous
// Data Copies"): the tiles j, next(j), next(next(j)), … below nt (block-uniform); tile k of
// the sequence uses stage k mod KST.  Ring::issue gathers the next tile not yet gathered
// (gather(j, stage)) and commits one cp.async group — an empty one past the end, so the
// group count stays in step with the tiles.  stream_tiles issues the first KST − 1 tiles,
// then for each tile waits for its copies (wait_group: all but the KST − 2 newest groups
// complete), fences them for the tensor cores' async proxy (the fence the ordinary stores of
// tile_dots need too: PTX ISA "Proxies") and meets the block at one barrier, after which
// body(j, jn, stage) scores tile j (jn: the tile after it) and calls Ring::issue exactly
// once, once its own MMA is in flight: the tile KST − 1 ahead goes into the stage of tile
// j − 1, which every warp has finished reading (its wait<0> precedes the barrier).
template <int KST>
struct Ring {
  int jg, sg;  // the next tile to gather and its stage
  template <class Next, class Gather>
  __device__ __forceinline__ void issue(int nt, Next&& next, Gather&& gather) {
    if (jg < nt) {
      gather(jg, sg);
      jg = next(jg);
    }
    cp_commit();
    sg = sg + 1 == KST ? 0 : sg + 1;
  }
};
template <int KST, class Next, class Issue, class Body>
__device__ __forceinline__ void stream_tiles(int j, int nt, Next&& next, Issue&& issue,
                                             Body&& body) {
#pragma unroll
  for (int s = 0; s < KST - 1; ++s) issue();
  int sb = 0;  // the stage of tile j
#pragma unroll 1
  while (j < nt) {
    cp_wait<KST - 2>();  // tile j's copies (and the query's, in an older group) are complete
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const int jn = next(j);
    body(j, jn, sb);
    j = jn;
    sb = sb + 1 == KST ? 0 : sb + 1;
  }
}

// Refinement on the FP8 scorer (docs/method.md §9 "Refinement"): every set bit i of query
// t = qlist[x]'s survivor bitmask surv[t] (uint32 [Qn, NW], NW = ⌈N/32⌉) in the words
// [wlo + y·RWF, min(whi, wlo + (y+1)·RWF)) of its visible words [wlo, whi) = [ks >> 5,
// (ke + 31) >> 5) is scored, and (s, i) appended to rec[t, :cap] iff s ≥ τ_t; count[t]
// counts them all.  grid (|qlist|, ⌈NW / RWF⌉), 128 threads: the query index fastest, so
// concurrently resident blocks gather the same key chunk and L2 serves the keys that
// survive for several queries.  Thread t owns the block's words t + 128k (k < RWF / 128,
// coalesced loads): one block scan of the threads' popcounts places every set bit, and a
// block without one exits (survival is a few percent: the common case).  The ids of
// positions [p0, p0 + RCAP) are written to the shared list (usually one window holds them
// all) and streamed through the key ring in tiles of 64, the last one partial.  Bits of the
// last word past N are ignored (no key there to gather).  SP: NoSpill, or Spill (records
// past cap appended to the spill, refine_fp8_spill_h{H}).
template <int H, class SP = NoSpill>
__device__ __forceinline__ void refine(const uint8_t* __restrict__ q, const float* __restrict__ w,
                                       const uint8_t* __restrict__ kp,
                                       const float* __restrict__ alpha,
                                       const float* __restrict__ tau, const int* __restrict__ ks_,
                                       const int* __restrict__ ke_, const int* __restrict__ qlist,
                                       long long N, const uint32_t* __restrict__ surv,
                                       unsigned int* __restrict__ count,
                                       unsigned long long* __restrict__ rec, long long cap,
                                       SP spill = SP{}) {
  static_assert(H == 64 || H == 32, "H: 64 or 32 heads");
  static_assert(RWF % 128 == 0 && RCAP % 64 == 0, "RWF: words of 128 threads; RCAP: tiles");
  __shared__ __align__(1024) uint8_t sk[kKeyStages * kTileBytes];
  __shared__ __align__(1024) uint8_t sq[H * 128];
  __shared__ __align__(16) float sw[H];
  __shared__ int sid[RCAP];  // the ids of one window
  __shared__ int wsum[4];    // the warps' popcount totals
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, qd = lane & 3;
  const int tq = qlist[blockIdx.x];
  const long long NW = (N + 31) >> 5;
  const long long wlo = (long long)ks_[tq] >> 5;
  const long long whi = min(NW, ((long long)ke_[tq] + 31) >> 5);
  const long long w0 = wlo + (long long)blockIdx.y * RWF;
  if (w0 >= whi) return;
  const int nw = (int)min(whi - w0, (long long)RWF);  // the block's words w0 + [0, nw)
  const uint32_t* srow = surv + (long long)tq * NW + w0;
  const long long last = NW - 1 - w0;  // the block's index of word NW − 1 (bits < N only)
  const uint32_t tail = (N & 31) ? (1u << (N & 31)) - 1u : 0xffffffffu;
  auto word = [&](int k) {  // the thread's word k: block word t + 128k, masked
    const int wi = t + 128 * k;
    const uint32_t m = wi < nw ? __ldg(srow + wi) : 0u;
    return wi == last ? m & tail : m;
  };
  int n = 0;
#pragma unroll
  for (int k = 0; k < RWF / 128; ++k) n += __popc(word(k));
  // inclusive scan of the popcounts over the warp, then over the warps
  const int incl = warp_inclusive_sum(n, lane);
  if (lane == 31) wsum[warp] = incl;
  __syncthreads();
  int before = 0, total = 0;
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int v = wsum[u];
    before += u < warp ? v : 0;
    total += v;
  }
  if (total == 0) return;  // no survivor in the block's words: the common case
  load_queries_async<H, 1>(q, w, tq, 1, sq, sw);
  const int first = before + incl - n;  // the position of the thread's first id
  const float tt = tau[tq];
  unsigned int* cnt = count + tq;
  unsigned long long* rrow = rec + (long long)tq * cap;
  const int row = emit_row(warp, lane);
  const uint64_t db = desc_sw128(smem_u32(sq));
  Pend pend;
  pend.m = 0u;
#pragma unroll 1
  for (int p0 = 0; p0 < total; p0 += RCAP) {
    const int np = min(RCAP, total - p0);  // the window's ids: positions p0 + [0, np)
    int at = first - p0;
    uint32_t words[RWF / 128];  // all loads first (L1 hits: the scan read them)
#pragma unroll
    for (int k = 0; k < RWF / 128; ++k) words[k] = word(k);
#pragma unroll
    for (int k = 0; k < RWF / 128; ++k) {  // the thread's words' set bits, in its order
      uint32_t m = words[k];
      const int nk = __popc(m);
      if (at < np && at + nk > 0) {
        const int base = (int)((w0 + t + 128 * k) * 32);  // key ids are int (record.cuh)
        while (m) {
          if ((unsigned)at < (unsigned)np) sid[at] = base + __ffs(m) - 1;
          m &= m - 1u;
          ++at;
        }
      } else {
        at += nk;
      }
    }
    const int nt = (np + 63) >> 6;
    // the last tile's missing rows: −1 (a zero row, no record), so a tile reads its 64 ids
    // without a bound test (RCAP is a multiple of 64)
    if (np + t < 64 * nt) sid[np + t] = -1;
    __syncthreads();  // the window's ids are published
    auto id_at = [&](int e) { return sid[e]; };  // e < 64·nt
    int i_nx = qd < 2 ? id_at(row) : -1;  // the lane's key of the next tile and its α
    float a_nx = i_nx >= 0 ? __ldg(alpha + i_nx) : 0.f;
    auto next = [](int j) { return j + 1; };
    auto gather = [&](int j, int s) {
      gather_async(kp, sk + s * kTileBytes, [&](int r) { return id_at(64 * j + r); });
    };
    Ring<kKeyStages> ring{0, 0};
    auto issue = [&] { ring.issue(nt, next, gather); };
    stream_tiles<kKeyStages>(
        0, nt, next, issue,
        [&](int j, int jn, int s) {
          const int i = i_nx;
          const float a = a_nx;
          float acc[H / 2];
          dots<H>(desc_sw128(smem_u32(sk + s * kTileBytes)), db, acc, [&] {
            issue();
            i_nx = qd < 2 && jn < nt ? id_at(64 * jn + row) : -1;
            a_nx = i_nx >= 0 ? __ldg(alpha + i_nx) : 0.f;
          });
          float sv[1][2];
          tile_sums<H>(acc, sw, qd, sv);
          const float sc = ((qd & 1) ? sv[0][1] : sv[0][0]) * a;
          emit_flush(pend, lane, rrow, cap, spill, tq);
          emit_issue(pend, i >= 0 && sc >= tt, sc, i, lane, cnt);
        });
    __syncthreads();  // every read of sid and of the key stages of this window is done
  }
  emit_flush(pend, lane, rrow, cap, spill, tq);
}

// Where a stage's keys live: a key id's row of kp and alpha — the key array itself
// (prefill), or a request's pages through its block-table row (decode: DeepGEMM's paged
// layout, 64 tokens per cache block; docs/method.md §10).  A key's score depends on its
// payload and α only, so a key has the same bits whichever way it is reached.
struct FlatKeys {
  __device__ __forceinline__ long long row(long long i) const { return i; }
};
struct PagedKeys {
  const int* __restrict__ bt;  // the request's block-table row
  __device__ __forceinline__ long long row(long long i) const {
    return (long long)__ldg(bt + (i >> 6)) * 64 + (i & 63);
  }
};

// Which keys of a query's range a record stage keeps (per query u of the block): every one
// (seeds), those whose record is at or above the record thr[u] (the decode scan's threshold,
// docs/method.md §10), or those outside the anchor pool with s ≥ τ_u (the fused route,
// docs/method.md §7: the sinks and the local window are outside its range already).
struct KeepAll {
  __device__ __forceinline__ bool operator()(int, float, int, long long) const { return true; }
};
template <int QB>
struct KeepRecord {
  unsigned long long thr[QB];
  __device__ __forceinline__ bool operator()(int u, float sc, int rid, long long) const {
    return make_record(sc, rid) >= thr[u];
  }
};
template <int QB>
struct KeepFused {
  const uint32_t* __restrict__ poolmask;
  float tau[QB];
  __device__ __forceinline__ bool operator()(int u, float sc, int, long long i) const {
    return !((__ldg(poolmask + (i >> 5)) >> (i & 31)) & 1u) && sc >= tau[u];
  }
};

// What a range stage writes for query u = t0 + u of its block, per key row of a tile
// (lanes qd < 2 hold one row each, `emits`): the records of the keys in the query's range
// that `keep` keeps, by emit_issue's deferred appends to rec[t0 + u, :cap] (count[t0 + u]
// counts them all).
template <int QB, class Keep>
struct RecordOut {
  unsigned int* __restrict__ count;
  unsigned long long* __restrict__ rec;
  long long cap;
  int t0;
  Keep keep;
  Pend pend[QB];
  __device__ __forceinline__ void start() {
#pragma unroll
    for (int u = 0; u < QB; ++u) pend[u].m = 0u;
  }
  __device__ __forceinline__ void put(int u, bool in_range, bool emits, float sc, int rid,
                                      long long i, int lane) {
    const bool p = emits && in_range && keep(u, sc, rid, i);
    unsigned long long* rrow = rec + (long long)(t0 + u) * cap;
    emit_flush(pend[u], lane, rrow, cap);
    emit_issue(pend[u], p, sc, rid, lane, count + t0 + u);
  }
  __device__ __forceinline__ void finish(int lane) {
#pragma unroll
    for (int u = 0; u < QB; ++u) emit_flush(pend[u], lane, rec + (long long)(t0 + u) * cap, cap);
  }
};
// Dense logits: out[(t0 + u)·ld + i] = the score where key i is in query u's range, −inf
// elsewhere, for the tiles the stage scores (the caller fills the rest with −inf).
struct LogitOut {
  float* __restrict__ out;
  long long ld;
  int t0;
  __device__ __forceinline__ void start() {}
  __device__ __forceinline__ void put(int u, bool in_range, bool emits, float sc, int,
                                      long long i, int) {
    if (emits && i < ld) out[(long long)(t0 + u) * ld + i] = in_range ? sc : neg_inf();
  }
  __device__ __forceinline__ void finish(int) {}
};

// The scores of key ranges (docs/method.md §2 seeds, §7 the fused route, §10 the decode
// scan): the keys i of [lo_u, hi_u) ∩ [0, n_keys) (range(u) = the raw (lo_u, hi_u)) are
// scored for the block's queries t0 .. t0 + nq − 1 (nq ≤ QB ≤ 128 / H: B tiles of at most
// 128 rows, 16 KB), whose ranges' keys are gathered once for all of them — the ranges of
// consecutive causal queries, or of one request's next_n rows, nearly coincide — and
// written by `out` with record id idmap[i] (i without an idmap), the key's payload and α at
// keys.row(i).  The span [L, E) of the non-empty ranges is cut in tiles of 64 keys from L;
// the block takes tiles x, x + gx, … (the host sizes gx; every span is covered) that meet
// some query's range, and scores each against the queries whose range it meets, one N = H
// MMA per query on the shared key tile (query u's B tile and weights of its own): each
// key's bits are those of a query alone (tile_dots, tile_sums).
template <int H, int QB, class Keys, class Range, class Out>
__device__ __forceinline__ void range_scores(const uint8_t* __restrict__ q,
                                             const float* __restrict__ w,
                                             const uint8_t* __restrict__ kp,
                                             const float* __restrict__ alpha, long long n_keys,
                                             int t0, int nq, Range&& range,
                                             const int* __restrict__ idmap, Keys keys, Out& out) {
  static_assert(H == 64 || H == 32, "H: 64 or 32 heads");
  static_assert(QB * H <= 128, "QB: at most 128 B-tile rows");
  __shared__ __align__(1024) uint8_t sk[kKeyStages * kTileBytes];
  __shared__ __align__(1024) uint8_t sq[QB * H * 128];
  __shared__ __align__(16) float sw[QB * H];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, qd = lane & 3;
  long long lo[QB], hi[QB];  // the queries' ranges within [0, n_keys); empty: [0, 0)
  long long L = n_keys, E = 0;
#pragma unroll
  for (int u = 0; u < QB; ++u) {
    long long a = 0, z = 0;
    if (u < nq) range(u, a, z);
    lo[u] = u < nq ? max(0LL, a) : 0;
    hi[u] = u < nq ? min(n_keys, z) : 0;
    if (hi[u] <= lo[u]) {
      lo[u] = hi[u] = 0;  // meets no tile (every tile starts at ≥ 0)
    } else {
      L = min(L, lo[u]);
      E = max(E, hi[u]);
    }
  }
  if (E <= L) return;  // every range empty
  const int nt = (int)((E - L + 63) >> 6);
  auto meets = [&](int j, int u) {  // tile j meets query u's range
    const long long a = L + 64LL * j;
    return a < hi[u] && a + 64 > lo[u];
  };
  auto needed = [&](int j) {
    bool m = false;
#pragma unroll
    for (int u = 0; u < QB; ++u) m |= meets(j, u);
    return m;
  };
  const int gx = gridDim.x;
  auto next = [&](int j) {
    do j += gx;
    while (j < nt && !needed(j));
    return j;
  };
  int j0 = blockIdx.x;
  while (j0 < nt && !needed(j0)) j0 += gx;
  if (j0 >= nt) return;
  load_queries_async<H, QB>(q, w, t0, nq, sq, sw);
  const int row = emit_row(warp, lane);
  float a_nx;  // the lane's key's α and record id in the next tile
  int r_nx;
  auto prefetch = [&](int j) {
    const long long i = L + 64LL * j + row;
    const bool ok = qd < 2 && j < nt && i < E;
    a_nx = ok ? __ldg(alpha + keys.row(i)) : 0.f;
    r_nx = ok ? (idmap ? __ldg(idmap + i) : (int)i) : -1;
  };
  prefetch(j0);
  out.start();
  auto gather = [&](int j, int s) {
    const long long a = L + 64LL * j;
    gather_async(kp, sk + s * kTileBytes,
                 [&](int r) { return a + r < E ? (int)keys.row(a + r) : -1; });
  };
  Ring<kKeyStages> ring{j0, 0};
  auto issue = [&] { ring.issue(nt, next, gather); };
  stream_tiles<kKeyStages>(
      j0, nt, next, issue,
      [&](int j, int jn, int s) {
        const long long i = L + 64LL * j + row;
        const float a = a_nx;
        const int rid = r_nx;
        const uint64_t da = desc_sw128(smem_u32(sk + s * kTileBytes));
        if (!meets(j, 0)) {  // the hook of query 0's MMA does not run
          issue();
          prefetch(jn);
        }
#pragma unroll
        for (int u = 0; u < QB; ++u) {
          if (!meets(j, u)) continue;  // block-uniform
          float acc[H / 2];
          dots<H>(da, desc_sw128(smem_u32(sq + u * H * 128)), acc, [&] {
            if (u == 0) {
              issue();
              prefetch(jn);
            }
          });
          float sv[1][2];
          tile_sums<H>(acc, sw + u * H, qd, sv);
          const float sc = ((qd & 1) ? sv[0][1] : sv[0][0]) * a;
          out.put(u, i >= lo[u] && i < hi[u], qd < 2, sc, rid, i, lane);
        }
      });
  out.finish(lane);
}

// Seed records from key ranges (docs/method.md §2, the FP8 counterpart of seeds.cu
// seed_score_mt*): range_scores over the keys of [lo[t], hi[t]) (rows of kp / alpha, n_keys
// of them) with (s, idmap[i]) — (s, i) without an idmap — appended for every key, no
// threshold.  grid (gx, ⌈Qn / QB⌉), 128 threads, QB = 128 / H: block (x, y) takes the queries
// t0 = QB·y .. t0 + QB − 1 (< Qn).
template <int H>
__device__ __forceinline__ void seed_score(const uint8_t* __restrict__ q,
                                           const float* __restrict__ w,
                                           const uint8_t* __restrict__ kp,
                                           const float* __restrict__ alpha, long long n_keys,
                                           const int* __restrict__ lo_, const int* __restrict__ hi_,
                                           const int* __restrict__ idmap, int Qn,
                                           unsigned int* __restrict__ count,
                                           unsigned long long* __restrict__ rec, long long cap) {
  constexpr int QB = 128 / H;  // queries per block: 128 B-tile rows (16 KB) at either H
  const int t0 = blockIdx.y * QB;
  if (t0 >= Qn) return;
  RecordOut<QB, KeepAll> out{count, rec, cap, t0, KeepAll{}};
  range_scores<H, QB>(
      q, w, kp, alpha, n_keys, t0, min(QB, Qn - t0),
      [&](int u, long long& a, long long& z) { a = lo_[t0 + u], z = hi_[t0 + u]; }, idmap,
      FlatKeys{}, out);
}

// The fused route on the FP8 scorer (docs/method.md §7, the FP8 counterpart of fused.cu
// fused_mt*): every visible key of query t that is not a default seed — past the sinks,
// before the local window (range_scores' range [ks + min(sinks, ke − ks), max(that, ke −
// window))), outside the anchor pool (poolmask) — is scored and (s, i) appended to rec[t,
// :cap] iff s ≥ τ_t; count[t] counts them all.  grid (gx, ⌈Qn / QB⌉), 128 threads.
template <int H>
__device__ __forceinline__ void fused(const uint8_t* __restrict__ q, const float* __restrict__ w,
                                      const uint8_t* __restrict__ kp,
                                      const float* __restrict__ alpha, long long N,
                                      const float* __restrict__ tau, const int* __restrict__ ks_,
                                      const int* __restrict__ ke_, int sinks, int window,
                                      const uint32_t* __restrict__ poolmask, int Qn,
                                      unsigned int* __restrict__ count,
                                      unsigned long long* __restrict__ rec, long long cap) {
  constexpr int QB = 128 / H;
  const int t0 = blockIdx.y * QB;
  if (t0 >= Qn) return;
  const int nq = min(QB, Qn - t0);
  RecordOut<QB, KeepFused<QB>> out{count, rec, cap, t0, KeepFused<QB>{poolmask, {}}};
#pragma unroll
  for (int u = 0; u < QB; ++u) out.keep.tau[u] = u < nq ? tau[t0 + u] : 0.f;
  range_scores<H, QB>(
      q, w, kp, alpha, N, t0, nq,
      [&](int u, long long& a, long long& z) {  // fused.cu's non-seed span of the range
        const int ks = ks_[t0 + u], ke = ke_[t0 + u];
        const long long s_hi = (long long)ks + min(sinks, ke - ks);
        a = s_hi, z = max(s_hi, (long long)ke - window);
      },
      nullptr, FlatKeys{}, out);
}

// Dense logits of key ranges (the anchors' Top-K, docs/method.md §2): range_scores over the
// keys of [lo[t], hi[t]) ∩ [0, n_keys) with out[t, i] = the score where key i is in query t's
// range, −inf elsewhere on the tiles scored (the host fills out [Qn, n_keys] with −inf first)
// — the FP8 dense route's logits bit for bit, with every block of the grid on a few queries'
// keys (the dense kernel runs one block per 8–16 queries).  grid (gx, ⌈Qn / QB⌉), 128 threads.
template <int H>
__device__ __forceinline__ void seed_logits(const uint8_t* __restrict__ q,
                                            const float* __restrict__ w,
                                            const uint8_t* __restrict__ kp,
                                            const float* __restrict__ alpha, long long n_keys,
                                            const int* __restrict__ lo_, const int* __restrict__ hi_,
                                            int Qn, float* __restrict__ out) {
  constexpr int QB = 128 / H;
  const int t0 = blockIdx.y * QB;
  if (t0 >= Qn) return;
  LogitOut o{out, n_keys, t0};
  range_scores<H, QB>(
      q, w, kp, alpha, n_keys, t0, min(QB, Qn - t0),
      [&](int u, long long& a, long long& z) { a = lo_[t0 + u], z = hi_[t0 + u]; }, nullptr,
      FlatKeys{}, o);
}

// The decode scan on the FP8 scorer (docs/method.md §10; the FP8 counterpart of decode.cu
// dec_scan_impl): request b = blockIdx.y, its n = next_n query rows r = b·n + u (q [R, H, 128],
// w [R, H], R = B·n) against its logical keys [0, ke[r]) through its block-table row bt[b]
// (max_blocks entries; kv [num_blocks·64, 128], ksc [num_blocks·64]), L = max_blocks·64
// logical positions.  FUSED: the records (s, i) at or above the row's threshold record thr[r]
// (0: every key) to rec[r, :cap], count[r] counting them all; else the dense logits out[r, i]
// (the host fills out with −inf first; the scan writes the tiles it scores).  grid (gx, B),
// 128 threads.
template <int H, bool FUSED>
__device__ __forceinline__ void decode_scan(const uint8_t* __restrict__ q,
                                            const float* __restrict__ w,
                                            const uint8_t* __restrict__ kv,
                                            const float* __restrict__ ksc,
                                            const int* __restrict__ bt, int max_blocks,
                                            const int* __restrict__ ke, int n, float* __restrict__ lg,
                                            const unsigned long long* __restrict__ thr,
                                            unsigned int* __restrict__ count,
                                            unsigned long long* __restrict__ rec, long long cap) {
  constexpr int QB = 2;  // next_n ≤ 2 rows per request (decode.validate_shapes)
  const int b = blockIdx.y, t0 = b * n;
  const long long L = (long long)max_blocks * 64;
  auto range = [&](int u, long long& a, long long& z) { a = 0, z = ke[t0 + u]; };
  const PagedKeys keys{bt + (long long)b * max_blocks};
  if constexpr (FUSED) {
    RecordOut<QB, KeepRecord<QB>> out{count, rec, cap, t0, KeepRecord<QB>{}};
#pragma unroll
    for (int u = 0; u < QB; ++u) out.keep.thr[u] = u < n ? thr[t0 + u] : 0ull;
    range_scores<H, QB>(q, w, kv, ksc, L, t0, n, range, nullptr, keys, out);
  } else {
    LogitOut out{lg, L, t0};
    range_scores<H, QB>(q, w, kv, ksc, L, t0, n, range, nullptr, keys, out);
  }
}

// The frame of the decode kernels fed by the bulk tensor copy engine (decode_scan_tma,
// decode_screen_tma): request b = blockIdx.y's first `pages` logical pages, block x taking
// pages x, x + gx, …; the B tile is the NC rows src[b·NC .. b·NC + NC) of 128 e4m3 bytes
// (the request's query heads, or its rows' plan rows) with their NC weights wsrc[b·NC ..].
// Warpgroup 0 is the producer: a thread reads each page's cache block from the block-table
// row (AHEAD: below) and copies its 64 key rows by one bulk tensor copy (the map over kv
// [num_blocks·64, 128], 128-byte swizzle) and its 64 α by one bulk copy into a slot.  kCwg
// consumer warpgroups take the pages in turn (page k to warpgroup k mod kCwg), each through its
// own ring of kTmaSlots slots with a full and an empty mbarrier, so a consumer waits on its own
// slots in order (never a phase ahead).  The consumers call start(sw, warp, lane) once, then
// page(p, da, db, sa, sk, done) for each of their pages p (da, db: the slot's key tile and
// the B tile as descriptors; sa: the slot's 64 α; sk: its key bytes; done: the slot's empty
// mbarrier, on which every consumer thread arrives once it has read the slot), then
// finish(lane).
// AHEAD (docs/method.md §10 "The scan fed by TMA"): the producer warp's lanes read the
// block-table entries of the next 32 pages while lane 0 issues the current copies; else one
// thread reads each entry when its page is due.  The copies are the same either way.
// Dynamic shared memory decode_tma_smem(NC).
template <int NC, bool AHEAD, class Start, class Page, class Finish>
__device__ __forceinline__ void tma_pages(const TensorMap& kvmap, const uint8_t* __restrict__ src,
                                          const float* __restrict__ wsrc,
                                          const float* __restrict__ ksc,
                                          const int* __restrict__ bt, int max_blocks, int pages,
                                          Start&& start, Page&& page, Finish&& finish) {
  // setmaxnreg within the block's pool (dense_fp8_lean's rule): the producer keeps 32
  constexpr int kLaunchRegs = (65536 / kTmaThreads) / 8 * 8;
  constexpr int kProducerRegs = 32;
  constexpr int kConsumerRegs = (kLaunchRegs + (kLaunchRegs - kProducerRegs) / kCwg) / 8 * 8;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* base =
      reinterpret_cast<uint8_t*>((reinterpret_cast<unsigned long long>(smem_raw) + 1023) & ~1023ull);
  uint8_t* sk = base;
  uint8_t* sq = sk + kTmaRing * kTileBytes;
  float* sa = reinterpret_cast<float*>(sq + NC * 128);
  uint64_t* full = reinterpret_cast<uint64_t*>(sa + kTmaRing * 64);
  uint64_t* empty = full + kTmaRing;
  __shared__ __align__(16) float sw[NC];

  const int t = threadIdx.x, b = blockIdx.y, x0 = blockIdx.x, gx = gridDim.x;
  const int np = pages > x0 ? (pages - x0 + gx - 1) / gx : 0;  // the block's pages
  if (np == 0) return;  // block-uniform, before any barrier
  for (int it = t; it < NC * 8; it += kTmaThreads) {  // the rows (consecutive per request)
    const int r = it >> 3, j = it & 7;
    *reinterpret_cast<uint4*>(sq + sw128_offset(r, j)) =
        __ldg(reinterpret_cast<const uint4*>(src + ((long long)b * NC + r) * 128 + 16 * j));
  }
  for (int i = t; i < NC; i += kTmaThreads) sw[i] = wsrc[(long long)b * NC + i];
  if (t == 0) {
    for (int s = 0; s < kTmaRing; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 128);
    }
    fence_barrier_init();
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();

  const int wg = t >> 7;
  const int* btrow = bt + (long long)b * max_blocks;
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs) : "memory");
    // one page's copies into its consumer's next slot, once that slot is empty
    auto issue = [&](int k, int page) {
      const int c = k % kCwg, j = k / kCwg, slot = c * kTmaSlots + j % kTmaSlots;
      if (j >= kTmaSlots) mbar_wait(&empty[slot], ((j / kTmaSlots) - 1) & 1);
      mbar_expect_tx(&full[slot], kTileBytes + 64 * 4);
      tma_load_2d(sk + slot * kTileBytes, &kvmap, &full[slot], 0, page * 64);
      bulk_load(sa + slot * 64, ksc + (long long)page * 64, 64 * 4, &full[slot]);
    };
    if (AHEAD && t < 32) {
      const int lane = t;
      auto entry = [&](int k) { return k < np ? __ldg(btrow + x0 + gx * k) : 0; };
      int cur = entry(lane);
#pragma unroll 1
      for (int k0 = 0; k0 < np; k0 += 32) {
        const int next = entry(k0 + 32 + lane);
        const int m = min(32, np - k0);  // warp-uniform
#pragma unroll 1
        for (int i = 0; i < m; ++i) {
          const int page = __shfl_sync(0xffffffffu, cur, i);
          if (lane == 0) issue(k0 + i, page);
        }
        cur = next;
      }
    } else if (!AHEAD && t == 0) {
#pragma unroll 1
      for (int k = 0; k < np; ++k) issue(k, __ldg(btrow + x0 + gx * k));
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs) : "memory");
  const int c = __shfl_sync(0xffffffffu, wg - 1, 0);  // uniform: descriptors in uniform registers
  const int warp = __shfl_sync(0xffffffffu, (t >> 5) & 3, 0);
  const int lane = t & 31;
  const uint64_t db = desc_sw128((uint32_t)__cvta_generic_to_shared(sq));
  const uint64_t da0 = desc_sw128((uint32_t)__cvta_generic_to_shared(sk));
  start(sw, warp, lane);
#pragma unroll 1
  for (int j = 0, k = c; k < np; ++j, k += kCwg) {
    const int slot = c * kTmaSlots + j % kTmaSlots;
    mbar_wait(&full[slot], (j / kTmaSlots) & 1);
    const uint64_t da = da0 + (uint64_t)((slot * kTileBytes) >> 4);
    page(x0 + gx * k, da, db, sa + slot * 64, sk + slot * kTileBytes, &empty[slot]);
  }
  finish(lane);
}

// The decode scan fed by the bulk tensor copy engine (issue 31; docs/method.md §10): the
// contract of decode_scan — request b = blockIdx.y's n = NC / H rows r = b·n + u against its
// logical keys [0, ke[r]) through its block-table row, FUSED: the records at or above thr[r]
// to rec[r, :cap] (count[r] counts them all), else the logits out[r, i] (the host fills −inf
// first) — with the same bits (the same fresh k32 steps added in k order, lane_partials and
// quad_scatter: head_sums' tree, × α; a key's bits depend neither on the MMA's column count
// nor on how its tile reached shared memory).  Instead of each block gathering its tiles with
// cp.async and meeting at a barrier per tile, the pages below ⌈max_u ke[r] / 64⌉ (a page is
// a tile: 64 tokens) come through tma_pages' ring, so a consumer's epilogue runs while the
// others' MMAs and the next copies are in flight.  Both rows of a request in one MMA (NC =
// n·H columns).  grid (gx, B), block 128·(1 + kCwg), dynamic shared memory
// decode_tma_smem(NC) (decode_ops.fp8_tma_smem).
template <int H, int NC, bool FUSED, bool AHEAD>
__device__ __forceinline__ void decode_scan_tma(const TensorMap& kvmap, const uint8_t* __restrict__ q,
                                                const float* __restrict__ w,
                                                const float* __restrict__ ksc,
                                                const int* __restrict__ bt, int max_blocks,
                                                const int* __restrict__ ke, int n,
                                                float* __restrict__ lg,
                                                const unsigned long long* __restrict__ thr,
                                                unsigned int* __restrict__ count,
                                                unsigned long long* __restrict__ rec,
                                                long long cap) {
  static_assert(H == 64 || H == 32, "H: 64 or 32 heads");
  constexpr int QPT = NC / H;  // the request's rows in the MMA (next_n)
  static_assert(QPT == 1 || QPT == 2, "next_n: 1 or 2 rows per request");
  constexpr int NA = NC / 2;
  uint32_t dyn;  // the launch must give tma_pages' layout
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
  if (dyn < (uint32_t)decode_tma_smem(NC) || n != QPT || blockDim.x != kTmaThreads) __trap();
  const int t0 = blockIdx.y * QPT;
  // the rows' visible ends within the request's logical keys (decode_scan's min(n_keys, ke):
  // a layout the caller did not check must not read past its block-table row)
  int kev[QPT], kmax = 0;
#pragma unroll
  for (int u = 0; u < QPT; ++u) {
    kev[u] = min(ke[t0 + u], max_blocks * 64);
    kmax = max(kmax, kev[u]);
  }
  const long long L = (long long)max_blocks * 64;
  RecordOut<QPT, KeepRecord<QPT>> rout{count, rec, cap, t0, KeepRecord<QPT>{}};
  LogitOut lout{lg, L, t0};
  const float* sw = nullptr;
  int qd = 0, my_u = 0, row = 0;
  bool lane_emits = false;
  tma_pages<NC, AHEAD>(
      kvmap, q, w, ksc, bt, max_blocks, (kmax + 63) >> 6,
      [&](const float* sw_, int warp, int lane) {
        sw = sw_;
        qd = lane & 3;
        // the lane's value after quad_scatter: row u = qd >> 1 (two rows) or the one row, key
        // row h = qd & 1 of its pair (16·warp + g + 8h); at one row lanes 2 and 3 repeat 0, 1
        my_u = QPT > 1 ? qd >> 1 : 0;
        row = 16 * warp + (lane >> 2) + 8 * (qd & 1);
        lane_emits = QPT > 1 || qd < 2;
        if constexpr (FUSED) {
#pragma unroll
          for (int u = 0; u < QPT; ++u) rout.keep.thr[u] = thr[t0 + u];
          rout.start();
        }
      },
      [&](int p, uint64_t da, uint64_t db, const float* sa, const uint8_t*, uint64_t* done) {
        const int lane = threadIdx.x & 31;
        float acc[NA], x[NA];
        fresh_steps<NC>(acc, x, da, db, [] {});
        const float a = sa[row];
        mbar_arrive(done);  // this thread has read the slot (its MMAs completed above)
        float2 wv[NC / 8];
        lane_weights<NC>(sw, qd, wv);
        float qv[QPT][2];
        lane_partials<H, NC>(acc, wv, qv);
        float r[1];
        quad_scatter<QPT>(qv, qd, r);
        const float sc = r[0] * a;
        const long long i = 64LL * p + row;  // the key's logical id
#pragma unroll
        for (int u = 0; u < QPT; ++u) {
          const bool emits = lane_emits && my_u == u;
          if constexpr (FUSED)
            rout.put(u, i < kev[u], emits, sc, (int)i, i, lane);
          else
            lout.put(u, i < kev[u], emits, sc, (int)i, i, lane);
        }
      },
      [&](int lane) {
        if constexpr (FUSED) rout.finish(lane);
      });
}

// ---- The decode screen (docs/method.md §10 "The certificate in decode") ----

// e4m3 pairs as f16 pairs (exact: every e4m3 value is an f16 value), and the f16 arithmetic of
// key_rho_bound in PTX (f16 has no flush to zero: its subnormals are kept).
__device__ __forceinline__ uint32_t f16x2_of_e4m3x2(unsigned short v) {
  uint32_t r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(v));
  return r;
}
__device__ __forceinline__ uint32_t hmul2_rn(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ uint32_t hfma2_rn(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t r;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}
// the two halves of an f16 pair as fp32 (exact), summed rounded up
__device__ __forceinline__ float f16x2_sum_ru(uint32_t v) {
  float lo, hi;
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;\n}"
      : "=f"(lo), "=f"(hi)
      : "r"(v));
  return add_ru_keep_subnormal(lo, hi);
}
__device__ __forceinline__ float sqrt_ru_keep_subnormal(float x) {
  float r;
  asm("sqrt.rp.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
// RU32(1 / (2·(1 − 2^-11)^7)): key_rho_bound's lift of its half-sum (docs/error_model.md
// "The decode screen's ρ"; proofs/decode_rho.py checks the constant and the bound).
constexpr float kRhoLift = 0x1.00e072p-1f;

// An upper bound on the RMS of key row r's 128 e4m3 values in the 128-byte-swizzled tile sk,
// ρ ≥ ‖k̄‖ / √128 (docs/error_model.md "The decode screen's ρ"), by two lanes of a warp: lane
// half = lane & 1 takes the row's chunks 4·half .. 4·half + 3 (64 codes), the pair's lanes are
// adjacent, and both return the same ρ.  Each code pair is an exact f16 pair x; t = x · 2^-3 is
// exact and t² a multiple of 2^-24 at most 56² (an f16 value); four f16 chains of eight fused
// steps acc ← fma(t, t, acc) (one rounding each, to nearest; at most 8 · 3136 < 65504, no
// overflow; below 2^-14 the sums are exact multiples of 2^-24) hold the lane's squares / 64
// within a factor (1 − 2^-11)^7 below; their halves are summed in fp32 rounded up, the pair's
// two sums added rounded up (T ≥ (1 − 2^-11)^7 ‖k̄‖² / 64), and ρ = RU(√RU(T · kRhoLift)) ≥
// √(‖k̄‖² / 128).  A NaN code makes ρ NaN, so U^num is NaN and the key is kept.
__device__ __forceinline__ float key_rho_bound(const uint8_t* sk, int r, int half) {
  constexpr uint32_t kEighth = 0x30003000u;  // (2^-3, 2^-3) in f16
  uint32_t acc[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint4 v = *reinterpret_cast<const uint4*>(sk + sw128_offset(r, 4 * half + i));
    const uint32_t wd[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int m = 0; m < 4; ++m) {
#pragma unroll
      for (int p = 0; p < 2; ++p) {
        const uint32_t x = f16x2_of_e4m3x2((unsigned short)(wd[m] >> (16 * p)));
        const uint32_t t = hmul2_rn(x, kEighth);
        acc[m] = hfma2_rn(t, t, acc[m]);
      }
    }
  }
  float sum = add_ru_keep_subnormal(add_ru_keep_subnormal(f16x2_sum_ru(acc[0]), f16x2_sum_ru(acc[1])),
                                    add_ru_keep_subnormal(f16x2_sum_ru(acc[2]), f16x2_sum_ru(acc[3])));
  sum = add_ru_keep_subnormal(sum, __shfl_xor_sync(0xffffffffu, sum, 1));
  return sqrt_ru_keep_subnormal(mul_ru_keep_subnormal(sum, kRhoLift));
}

// A warp's survivor ids of one page (every lane calls it): lanes with p append id to ids[0 ..
// cap) through one atomicAdd per warp; count counts every survivor, also past cap.
__device__ __forceinline__ void emit_ids(bool p, int id, int lane, unsigned int* count, int* ids,
                                         long long cap) {
  const unsigned m = __ballot_sync(0xffffffffu, p);
  if (m == 0u) return;  // warp-uniform
  unsigned base = 0u;
  if (lane == 0) base = atomicAdd(count, (unsigned)__popc(m));
  base = __shfl_sync(0xffffffffu, base, 0);
  if (p) {
    const unsigned at = base + __popc(m & ((1u << lane) - 1u));
    if ((long long)at < cap) ids[at] = id;
  }
}

// The decode screen over pages fed by the bulk tensor copy engine (issue 31; docs/method.md
// §10 "The certificate in decode"): request b = blockIdx.y's QPT rows r = b·QPT + u, each with
// a plan of RQ = 16·mts e4m3 rows (plan.build_plans_fused with screen "fp8_fresh": retained
// heads, the aux rows RQ − 9 and RQ − 1, zero rows, ω, σ, C, ε_raw, valid), against the
// request's pages below ⌈max_u ke[r] / 64⌉ through tma_pages' ring (the B tile: the QPT rows'
// plans, NC = QPT·RQ columns; plans [B·QPT, RQ, 128] are consecutive per request).  Per page:
// the plans' dots by fresh_steps (the FP8 screen's dot arithmetic, its allowance in the plan);
// each key's ρ (key_rho_bound) while the MMAs run; per lane and row one chain over the lane's
// plan rows in column order — a product, then fmaf, the aux rows' weight being 0 — ending with
// fmaf(−σ, [x_aux0 + x_aux1]_+, ·) in lane qd = 3 (+0 elsewhere), and quad_scatter's two
// butterfly adds: Û in the order proofs/gpu_screen_epilogue.py eval_dec checks (depth ≤ 2·mts
// + 6, within the plan's g_scr); U^num = guard_bound_ru32(Û, ρ, α, C, ε_raw, ε_out) (≥ the
// key's canonical score, docs/method.md §8).  A visible key (id < ke[r]) is kept for row r
// unless U^num < τ_r, τ_r the score of the row's threshold record thr[r] (−inf where thr[r]
// is 0 — fewer than K witnesses —, NaN, or the plan is not valid: every key kept); a key kept
// by some row of the request is appended once to sids[b·scap ..] (scount[b] counts them all).
// A key whose record is at or above thr[r] has s ≥ τ_r, so U^num ≥ τ_r: it is kept.  grid (gx,
// B), block 128·(1 + kCwg), dynamic shared memory decode_tma_smem(QPT·RQ).
template <int RQ, int QPT>
__device__ __forceinline__ void decode_screen_tma(
    const TensorMap& kvmap, const uint8_t* __restrict__ rows, const float* __restrict__ om,
    const float* __restrict__ sig, const double* __restrict__ Cq,
    const double* __restrict__ eps_raw, double eps_out, const uint8_t* __restrict__ valid,
    const float* __restrict__ ksc, const int* __restrict__ bt, int max_blocks,
    const int* __restrict__ ke, int n, const unsigned long long* __restrict__ thr,
    unsigned int* __restrict__ scount, int* __restrict__ sids, long long scap) {
  static_assert(RQ == 16 || RQ == 32, "RQ: the 16·mts rows of a plan");
  static_assert(QPT == 1 || QPT == 2, "next_n: 1 or 2 rows per request");
  constexpr int NC = QPT * RQ, NA = NC / 2, NB = RQ / 8;  // NB: a row's column blocks
  uint32_t dyn;  // the launch must give tma_pages' layout
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
  if (dyn < (uint32_t)decode_tma_smem(NC) || n != QPT || blockDim.x != kTmaThreads) __trap();
  const int b = blockIdx.y, t0 = b * QPT;
  int kev[QPT], kmax = 0;
#pragma unroll
  for (int u = 0; u < QPT; ++u) {
    kev[u] = min(ke[t0 + u], max_blocks * 64);
    kmax = max(kmax, kev[u]);
  }
  int* srow = sids + (long long)b * scap;
  float tau[QPT], c32[QPT], er32[QPT], sneg[QPT];
  const float eo32 = f32_ru_keep_subnormal(eps_out);
  const float* sw = nullptr;
  int qd = 0, row = 0, my_u = 0, src = 0;
  tma_pages<NC, false>(
      kvmap, rows, om, ksc, bt, max_blocks, (kmax + 63) >> 6,
      [&](const float* sw_, int warp, int lane) {
        sw = sw_;
        qd = lane & 3;
        row = 16 * warp + (lane >> 2) + 8 * (qd & 1);  // quad_scatter's key row
        my_u = QPT > 1 ? qd >> 1 : 0;
        src = 2 * ((lane >> 2) + 8 * (qd & 1));  // the lane pair that computed its ρ
#pragma unroll
        for (int u = 0; u < QPT; ++u) {
          const unsigned long long th = thr[t0 + u];
          const float ts = code_score((uint32_t)(th >> 32));
          tau[u] = (th == 0ull || valid[t0 + u] == 0 || ts != ts) ? neg_inf() : ts;
          c32[u] = f32_ru_keep_subnormal(Cq[t0 + u]);
          er32[u] = f32_ru_keep_subnormal(eps_raw[t0 + u]);
          sneg[u] = qd == 3 ? -sig[t0 + u] : 0.f;
        }
      },
      [&](int p, uint64_t da, uint64_t db, const float* sa, const uint8_t* sk, uint64_t* done) {
        const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
        float acc[NA], x[NA];
        float rho_pair = 0.f;  // ρ of key 16·warp + lane / 2 (this lane and its neighbour)
        fresh_steps<NC>(acc, x, da, db,
                        [&] { rho_pair = key_rho_bound(sk, 16 * warp + (lane >> 1), lane & 1); });
        const float a = sa[row];
        mbar_arrive(done);  // this thread has read the slot (its MMAs completed above)
        const float rho = __shfl_sync(0xffffffffu, rho_pair, src);
        float2 wv[NC / 8];
        lane_weights<NC>(sw, qd, wv);
        float q[QPT][2];
#pragma unroll
        for (int u = 0; u < QPT; ++u)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float c = 0.f;
#pragma unroll
            for (int jb = 0; jb < NB; ++jb) {
              const int j = NB * u + jb;
              const float y0 = acc[4 * j + 2 * h], y1 = acc[4 * j + 2 * h + 1];
              c = jb == 0 ? wv[j].x * relu(y0) : fmaf(wv[j].x, relu(y0), c);
              c = fmaf(wv[j].y, relu(y1), c);
            }
            const float ya = acc[4 * (NB * u + NB - 2) + 2 * h + 1];
            const float yb = acc[4 * (NB * u + NB - 1) + 2 * h + 1];
            q[u][h] = fmaf(sneg[u], relu(ya + yb), c);
          }
        float uh[1];
        quad_scatter<QPT>(q, qd, uh);
        const long long i = 64LL * p + row;  // the key's logical id
        // the lane's row's constants by selects (an index by my_u would put the arrays in
        // local memory)
        const bool u1 = QPT > 1 && my_u == 1;
        const float U = guard_bound_ru32(uh[0], rho, a, u1 ? c32[QPT - 1] : c32[0],
                                         u1 ? er32[QPT - 1] : er32[0], eo32);
        bool keep = i < (u1 ? kev[QPT - 1] : kev[0]) &&
                    !less_keep_subnormal(U, u1 ? tau[QPT - 1] : tau[0]);
        if constexpr (QPT == 2) keep |= __shfl_xor_sync(0xffffffffu, keep, 2);  // either row
        emit_ids(qd < 2 && keep, (int)i, lane, scount + b, srow, scap);
      },
      [](int) {});
}

// Explicit ids (docs/method.md §2, the FP8 counterpart of seed_ids.cu seed_ids_mt*; and the
// decode witnesses, §10): block (x, ·) takes the entries row_ids[j] (S of them) of the tiles
// of 64 from 64·x with stride 64·gridDim.x for query tq; an entry is a key iff ks ≤ id < ke
// (−1 padding and ids out of the visible range are skipped) and every key's record (s, id),
// its payload and α at keys.row(id), goes to rrow[:S], no threshold (*cnt ≤ S: no overflow;
// like seed_score, a key is recorded whatever its score — the f16 seed_ids_mt* tests
// s ≥ −inf, which differs only for a NaN).  THR (the decode screen's survivors): only the
// records at or above thr go to rrow[:cap], *cnt counting them all (past cap: an overflow).  A block whose tiles hold padding only (rows are
// padded at the end) exits before loading its query; within the ring a tile of padding only
// is not scored (its warps' ballots at the gather, read after the next barrier).  128
// threads.  QB > 1 (the decode witnesses of a request's rows): the QB consecutive queries
// tq .. tq + QB − 1 share the entries and each key tile, query u scoring it by its own N = H
// MMA (range_scores' way: a key's bits are those of the query alone), its keys those below
// ke_rows[u] (ke: the largest of them), its records to rrow + u·S and its count to cnt + u.
template <int H, class Keys, bool THR = false, int QB = 1>
__device__ __forceinline__ void id_scores(const uint8_t* __restrict__ q, const float* __restrict__ w,
                                          const uint8_t* __restrict__ kp,
                                          const float* __restrict__ alpha, int tq, int ks, int ke,
                                          const int* __restrict__ row_ids, long long S, Keys keys,
                                          unsigned int* __restrict__ cnt,
                                          unsigned long long* __restrict__ rrow,
                                          unsigned long long thr = 0ull, long long cap = 0,
                                          const int* __restrict__ ke_rows = nullptr) {
  static_assert(H == 64 || H == 32, "H: 64 or 32 heads");
  static_assert(QB == 1 || (QB * H <= 128 && !THR), "QB: the witnesses' rows, 128 B-tile rows");
  __shared__ __align__(1024) uint8_t sk[kKeyStages * kTileBytes];
  __shared__ __align__(1024) uint8_t sq[QB * H * 128];
  __shared__ __align__(16) float sw[QB * H];
  __shared__ int sany[kKeyStages][4];  // per stage and warp: a key among the warp's rows
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, qd = lane & 3;
  const int nt = (int)((S + 63) >> 6), gx = gridDim.x;
  auto id_of = [&](int j, int r) {
    const long long e = 64LL * j + r;
    const int v = e < S ? __ldg(row_ids + e) : -1;
    return v >= ks && v < ke ? v : -1;
  };
  bool any = false;
  for (int j = blockIdx.x; j < nt; j += gx) any |= t < 64 && id_of(j, t) >= 0;
  if (!__syncthreads_or(any)) return;  // block-uniform
  load_queries_async<H, QB>(q, w, tq, QB, sq, sw);
  const int row = emit_row(warp, lane);
  int ke_u[QB];  // each query's visible end (QB = 1: ke, the entries' test)
#pragma unroll
  for (int u = 0; u < QB; ++u) ke_u[u] = QB == 1 ? ke : __ldg(ke_rows + u);
  int i_nx;  // the lane's key of the next tile and its α
  float a_nx;
  auto prefetch = [&](int j) {
    i_nx = qd < 2 && j < nt ? id_of(j, row) : -1;
    a_nx = i_nx >= 0 ? __ldg(alpha + keys.row(i_nx)) : 0.f;
  };
  prefetch(blockIdx.x);
  Pend pend[QB];
#pragma unroll
  for (int u = 0; u < QB; ++u) pend[u].m = 0u;
  auto next = [&](int j) { return j + gx; };
  auto gather = [&](int j, int s) {
    bool key = false;
    gather_async(kp, sk + s * kTileBytes, [&](int r) {
      const int v = id_of(j, r);
      key |= v >= 0;
      return v >= 0 ? (int)keys.row(v) : v;  // −1: no key
    });
    const unsigned b = __ballot_sync(0xffffffffu, key);
    if (lane == 0) sany[s][warp] = b != 0u;
  };
  Ring<kKeyStages> ring{(int)blockIdx.x, 0};
  auto issue = [&] { ring.issue(nt, next, gather); };
  stream_tiles<kKeyStages>(
      blockIdx.x, nt, next, issue,
      [&](int j, int jn, int s) {
        const int i = i_nx;
        const float a = a_nx;
        if (!(sany[s][0] | sany[s][1] | sany[s][2] | sany[s][3])) {  // padding only
          issue();
          prefetch(jn);
          return;
        }
        const uint64_t da = desc_sw128(smem_u32(sk + s * kTileBytes));
#pragma unroll
        for (int u = 0; u < QB; ++u) {
          float acc[H / 2];
          dots<H>(da, desc_sw128(smem_u32(sq + u * H * 128)), acc, [&] {
            if (u == 0) {
              issue();
              prefetch(jn);
            }
          });
          float sv[1][2];
          tile_sums<H>(acc, sw + u * H, qd, sv);
          const float sc = ((qd & 1) ? sv[0][1] : sv[0][0]) * a;
          const bool key = i >= 0 && (QB == 1 || i < ke_u[u]);
          emit_flush(pend[u], lane, rrow + u * S, THR ? cap : S);
          emit_issue(pend[u], key && (!THR || make_record(sc, i) >= thr), sc, i, lane, cnt + u);
        }
      });
#pragma unroll
  for (int u = 0; u < QB; ++u) emit_flush(pend[u], lane, rrow + u * S, THR ? cap : S);
}

// Explicit seeds: query tq = blockIdx.y, the entries ids[tq, :S] (int32 [Qn, S]) visible in
// [ks[tq], ke[tq]), records to rec[tq, :S].  grid (gx, Qn), 128 threads.
template <int H>
__device__ __forceinline__ void seed_ids(const uint8_t* __restrict__ q, const float* __restrict__ w,
                                         const uint8_t* __restrict__ kp,
                                         const float* __restrict__ alpha,
                                         const int* __restrict__ ks_, const int* __restrict__ ke_,
                                         const int* __restrict__ ids, long long S,
                                         unsigned int* __restrict__ count,
                                         unsigned long long* __restrict__ rec) {
  const int tq = blockIdx.y;
  id_scores<H>(q, w, kp, alpha, tq, ks_[tq], ke_[tq], ids + (long long)tq * S, S, FlatKeys{},
               count + tq, rec + (long long)tq * S);
}

// The decode witnesses (docs/method.md §10; decode.cu dec_witness_impl): row r = blockIdx.y
// of request b = r / n scores the distinct witness ids wit[b, :Wc] (−1: empty) visible to it,
// [0, ke[r]), through the request's block-table row; records to rec[r, :Wc] (count[r]).
// grid (gx, B·n), 128 threads.  QB = n > 1 (decode_witness_fp8_h{H}_n2): block (x, b) takes
// the n rows of request b, r = b·n .., on each gathered tile (id_scores' QB) — the same
// records, the request's witnesses gathered once instead of n times; grid (gx, B).
template <int H, int QB = 1>
__device__ __forceinline__ void decode_witness(const uint8_t* __restrict__ q,
                                               const float* __restrict__ w,
                                               const uint8_t* __restrict__ kv,
                                               const float* __restrict__ ksc,
                                               const int* __restrict__ bt, int max_blocks,
                                               const int* __restrict__ ke, int n,
                                               const int* __restrict__ wit, int Wc,
                                               unsigned int* __restrict__ count,
                                               unsigned long long* __restrict__ rec) {
  if constexpr (QB == 1) {
    const int r = blockIdx.y, b = r / n;
    id_scores<H>(q, w, kv, ksc, r, 0, ke[r], wit + (long long)b * Wc, Wc,
                 PagedKeys{bt + (long long)b * max_blocks}, count + r, rec + (long long)r * Wc);
  } else {  // n == QB; a request's visible ends are nondecreasing along its rows
    const int b = blockIdx.y, r = b * QB;
    id_scores<H, PagedKeys, false, QB>(q, w, kv, ksc, r, 0, ke[r + QB - 1],
                                       wit + (long long)b * Wc, Wc,
                                       PagedKeys{bt + (long long)b * max_blocks}, count + r,
                                       rec + (long long)r * Wc, 0ull, 0, ke + r);
  }
}

// The witnesses' threshold record in their own kernel (docs/method.md §10 "The witnesses' K-th
// in their kernel"): after decode_witness, the last block of row r to finish (a ticket per row,
// ticket[r] = 0 at rest and again after) selects the K-th of the row's count[r] records by
// block_kth_record and writes it to thr[r] — 0 where the row has fewer than K — which is the
// record select_kernel / select_rank write as the K-th, so the step's selection launch of the
// witnesses goes.  Every block takes a ticket, also one that found no visible witness.
template <int H>
__device__ __forceinline__ void decode_witness_kth(const uint8_t* __restrict__ q,
                                                   const float* __restrict__ w,
                                                   const uint8_t* __restrict__ kv,
                                                   const float* __restrict__ ksc,
                                                   const int* __restrict__ bt, int max_blocks,
                                                   const int* __restrict__ ke, int n,
                                                   const int* __restrict__ wit, int Wc,
                                                   unsigned int* __restrict__ count,
                                                   unsigned long long* __restrict__ rec, int K,
                                                   unsigned int* __restrict__ ticket,
                                                   unsigned long long* __restrict__ thr) {
  __shared__ KthShared ksh;
  __shared__ unsigned last;
  decode_witness<H>(q, w, kv, ksc, bt, max_blocks, ke, n, wit, Wc, count, rec);
  const int r = blockIdx.y;
  __threadfence();  // this block's records and count before its ticket
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(ticket + r, 1u) == gridDim.x - 1u;
  __syncthreads();
  if (!last) return;  // block-uniform
  __threadfence();  // every block's records, seen after the last ticket
  const long long m = min((long long)atomicAdd(count + r, 0u), (long long)Wc);
  const unsigned long long v =
      m >= K ? block_kth_record<128>(rec + (long long)r * Wc, m, (unsigned)K, ksh) : 0ull;
  if (threadIdx.x == 0) {
    thr[r] = v;
    ticket[r] = 0u;  // for the next step (a graph replays the same buffers)
  }
}

// The decode screen's survivors (decode_screen_tma): row r = blockIdx.y of request b = r / n
// scores the first min(scount[b], scap) ids of sids[b·scap ..] (distinct: each key is appended
// once) visible to it, [0, ke[r]), on the canonical scorer, and appends the records at or above
// its threshold record thr[r] to rec[r, :cap] (count[r] counts them all).  grid (gx, B·n),
// 128 threads.
template <int H>
__device__ __forceinline__ void decode_survivors(const uint8_t* __restrict__ q,
                                                 const float* __restrict__ w,
                                                 const uint8_t* __restrict__ kv,
                                                 const float* __restrict__ ksc,
                                                 const int* __restrict__ bt, int max_blocks,
                                                 const int* __restrict__ ke, int n,
                                                 const unsigned int* __restrict__ scount,
                                                 const int* __restrict__ sids, long long scap,
                                                 const unsigned long long* __restrict__ thr,
                                                 unsigned int* __restrict__ count,
                                                 unsigned long long* __restrict__ rec,
                                                 long long cap) {
  const int r = blockIdx.y, b = r / n;
  const long long S = min((long long)scount[b], scap);
  id_scores<H, PagedKeys, true>(q, w, kv, ksc, r, 0, ke[r], sids + (long long)b * scap, S,
                                PagedKeys{bt + (long long)b * max_blocks}, count + r,
                                rec + (long long)r * cap, thr[r], cap);
}

}  // namespace fp8
}  // namespace dosa
#endif

// The kernels: H ∈ {64, 32}, 128 threads (one warpgroup), static shared memory only.  The
// sm_90a code only for the sm_90a target (__CUDA_ARCH_FEAT_SM90_ALL); other targets compile
// empty bodies, so the sm_90 build of CI parses the same parameter lists.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DOSA_FP8_BODY(...) __VA_ARGS__;
#else
#define DOSA_FP8_BODY(...)
#endif

// Blocks per SM each record kernel is built for (__launch_bounds__' second argument: ptxas
// keeps the registers within 65,536 / (128 · B)): as many as its static shared memory admits
// on an SM of 228 KB where that compiles without spills — refine 5 (41 / 37 KB; 6 at H = 32
// spills), seed_score 4 at H = 64 (5 spills) and 5 at H = 32, seed_ids 5 at H = 64 (6
// spills and serialises the wgmma) and 7 at H = 32.  score_fp8_ids keeps its build.
#define REFINE_BLOCKS(H) 5
#define SEED_SCORE_BLOCKS(H) ((H) == 64 ? 4 : 5)
#define SEED_IDS_BLOCKS(H) ((H) == 64 ? 5 : 7)
// The decode scan (range_scores with two rows and a threshold): 3 at H = 64 (4 spills its
// records' state), 5 at H = 32; its witnesses as seed_ids.
#define DECODE_BLOCKS(H) ((H) == 64 ? 3 : 5)
// The witnesses of a request's two rows (decode_witness<H, 2>): 4 at either H (its static
// shared memory, 41 / 33 KB, and its registers).
#define WITNESS_ROWS_BLOCKS(H) 4
// The witnesses with their K-th (decode_witness_kth): 4 at H = 64 (5 spills), 5 at H = 32
// (its static shared memory, 38 KB, admits no more).
#define WITNESS_KTH_BLOCKS(H) ((H) == 64 ? 4 : 5)
// The fused route (range_scores with the anchor-pool test and τ): 4 at either H (5 spills
// at H = 32).
#define FUSED_BLOCKS(H) 4
#define SCORE_FP8_INST(H)                                                                       \
  extern "C" __global__ void __launch_bounds__(128) score_fp8_ids_h##H(                         \
      const uint8_t* __restrict__ q, const float* __restrict__ w, const uint8_t* __restrict__ kp, \
      const float* __restrict__ alpha, const int* __restrict__ ids, int M,                      \
      float* __restrict__ out) {                                                                \
    DOSA_FP8_BODY(dosa::fp8::score_ids<H>(q, w, kp, alpha, ids, M, out))                        \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(128, REFINE_BLOCKS(H)) refine_fp8_h##H(                            \
      const uint8_t* q, const float* w, const uint8_t* kp, const float* alpha, const float* tau, \
      const int* ks, const int* ke, const int* qlist, long long N, const uint32_t* surv,       \
      unsigned int* count, unsigned long long* rec, long long cap) {                           \
    DOSA_FP8_BODY(dosa::fp8::refine<H>(q, w, kp, alpha, tau, ks, ke, qlist, N, surv, count,   \
                                       rec, cap))                                              \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(128, REFINE_BLOCKS(H)) refine_fp8_spill_h##H(   \
      const uint8_t* q, const float* w, const uint8_t* kp, const float* alpha, const float* tau, \
      const int* ks, const int* ke, const int* qlist, long long N, const uint32_t* surv,       \
      unsigned int* count, unsigned long long* rec, long long cap,                             \
      unsigned long long* spill_count,                                                         \
      unsigned long long* spill_rec, int* spill_row, long long spill_cap) {                    \
    DOSA_FP8_BODY(dosa::fp8::refine<H>(                                                        \
        q, w, kp, alpha, tau, ks, ke, qlist, N, surv, count, rec, cap,                         \
        dosa::fp8::Spill{spill_count, spill_rec, spill_row, spill_cap}))                       \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(128, SEED_SCORE_BLOCKS(H)) seed_score_fp8_h##H(                        \
      const uint8_t* q, const float* w, const uint8_t* kp, const float* alpha, long long n_keys, \
      const int* lo, const int* hi, const int* idmap, int Qn, unsigned int* count,             \
      unsigned long long* rec, long long cap) {                                                \
    DOSA_FP8_BODY(dosa::fp8::seed_score<H>(q, w, kp, alpha, n_keys, lo, hi, idmap, Qn, count, \
                                           rec, cap))                                          \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(128, SEED_IDS_BLOCKS(H)) seed_ids_fp8_h##H(                          \
      const uint8_t* q, const float* w, const uint8_t* kp, const float* alpha, const int* ks,  \
      const int* ke, const int* ids, long long S, unsigned int* count,                         \
      unsigned long long* rec) {                                                               \
    DOSA_FP8_BODY(dosa::fp8::seed_ids<H>(q, w, kp, alpha, ks, ke, ids, S, count, rec))        \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(128, FUSED_BLOCKS(H)) fused_fp8_h##H(           \
      const uint8_t* q, const float* w, const uint8_t* kp, const float* alpha, long long N,     \
      const float* tau, const int* ks, const int* ke, int sinks, int window,                   \
      const uint32_t* poolmask, int Qn, unsigned int* count, unsigned long long* rec,          \
      long long cap) {                                                                          \
    DOSA_FP8_BODY(dosa::fp8::fused<H>(q, w, kp, alpha, N, tau, ks, ke, sinks, window, poolmask, \
                                      Qn, count, rec, cap))                                    \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(128, SEED_SCORE_BLOCKS(H)) seed_logits_fp8_h##H( \
      const uint8_t* q, const float* w, const uint8_t* kp, const float* alpha, long long n_keys, \
      const int* lo, const int* hi, int Qn, float* out) {                                      \
    DOSA_FP8_BODY(dosa::fp8::seed_logits<H>(q, w, kp, alpha, n_keys, lo, hi, Qn, out))        \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(128, DECODE_BLOCKS(H)) decode_logits_fp8_h##H( \
      const uint8_t* q, const float* w, const uint8_t* kv, const float* ksc, const int* bt,    \
      int max_blocks, const int* ke, int next_n, float* out) {                                 \
    DOSA_FP8_BODY(dosa::fp8::decode_scan<H, false>(q, w, kv, ksc, bt, max_blocks, ke, next_n,  \
                                                   out, nullptr, nullptr, nullptr, 0))         \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(128, DECODE_BLOCKS(H)) decode_fused_fp8_h##H( \
      const uint8_t* q, const float* w, const uint8_t* kv, const float* ksc, const int* bt,    \
      int max_blocks, const int* ke, int next_n, const unsigned long long* thr,                \
      unsigned int* count, unsigned long long* rec, long long cap) {                           \
    DOSA_FP8_BODY(dosa::fp8::decode_scan<H, true>(q, w, kv, ksc, bt, max_blocks, ke, next_n,   \
                                                  nullptr, thr, count, rec, cap))              \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(128, SEED_IDS_BLOCKS(H)) decode_witness_fp8_h##H( \
      const uint8_t* q, const float* w, const uint8_t* kv, const float* ksc, const int* bt,    \
      int max_blocks, const int* ke, int next_n, const int* wit, int Wc, unsigned int* count,  \
      unsigned long long* rec) {                                                               \
    DOSA_FP8_BODY(dosa::fp8::decode_witness<H>(q, w, kv, ksc, bt, max_blocks, ke, next_n, wit, \
                                               Wc, count, rec))                                \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(128, WITNESS_KTH_BLOCKS(H)) decode_witness_kth_fp8_h##H( \
      const uint8_t* q, const float* w, const uint8_t* kv, const float* ksc, const int* bt,    \
      int max_blocks, const int* ke, int next_n, const int* wit, int Wc, unsigned int* count,  \
      unsigned long long* rec, int K, unsigned int* ticket, unsigned long long* thr) {         \
    DOSA_FP8_BODY(dosa::fp8::decode_witness_kth<H>(q, w, kv, ksc, bt, max_blocks, ke, next_n,  \
                                                   wit, Wc, count, rec, K, ticket, thr))       \
  }
SCORE_FP8_INST(64)
SCORE_FP8_INST(32)

// The decode witnesses of a request's two rows in one block (decode_witness's QB = 2).
#define DECODE_WITNESS_ROWS_INST(H)                                                             \
  extern "C" __global__ void __launch_bounds__(128, WITNESS_ROWS_BLOCKS(H)) decode_witness_fp8_h##H##_n2( \
      const uint8_t* q, const float* w, const uint8_t* kv, const float* ksc, const int* bt,    \
      int max_blocks, const int* ke, int next_n, const int* wit, int Wc, unsigned int* count,  \
      unsigned long long* rec) {                                                               \
    DOSA_FP8_BODY(dosa::fp8::decode_witness<H, 2>(q, w, kv, ksc, bt, max_blocks, ke, next_n,   \
                                                  wit, Wc, count, rec))                        \
  }
DECODE_WITNESS_ROWS_INST(64)
DECODE_WITNESS_ROWS_INST(32)

// The decode screen's survivors (decode_survivors): seed_ids' build.
#define DECODE_SURVIVORS_INST(H)                                                                \
  extern "C" __global__ void __launch_bounds__(128, SEED_IDS_BLOCKS(H)) decode_survivors_fp8_h##H( \
      const uint8_t* q, const float* w, const uint8_t* kv, const float* ksc, const int* bt,    \
      int max_blocks, const int* ke, int next_n, const unsigned int* scount, const int* sids,  \
      long long scap, const unsigned long long* thr, unsigned int* count,                      \
      unsigned long long* rec, long long cap) {                                                \
    DOSA_FP8_BODY(dosa::fp8::decode_survivors<H>(q, w, kv, ksc, bt, max_blocks, ke, next_n,    \
                                                 scount, sids, scap, thr, count, rec, cap))    \
  }
DECODE_SURVIVORS_INST(64)
DECODE_SURVIVORS_INST(32)

// The decode scan by TMA (decode_scan_tma): H ∈ {64, 32} heads, N ∈ {1, 2} rows per request;
// the tensor map first (a 64-byte-aligned parameter, dosa_cupy/tma.py), then decode_scan's
// parameters without kv (the map reads it).  128·(1 + kCwg) threads, one block per SM.  The
// names ending in _ahead read the block table ahead (tma_pages' AHEAD; decode_ops.TMA_AHEAD).
#define DECODE_TMA_INST(H, N, AHEAD, SFX)                                                       \
  extern "C" __global__ void __launch_bounds__(dosa::fp8::kTmaThreads, 1)                      \
      decode_logits_tma_fp8_h##H##_n##N##SFX(                                                   \
          const __grid_constant__ dosa::TensorMap kvmap, const uint8_t* q, const float* w,      \
          const float* ksc, const int* bt, int max_blocks, const int* ke, int next_n,           \
          float* out) {                                                                         \
    DOSA_FP8_BODY(dosa::fp8::decode_scan_tma<H, (N) * (H), false, AHEAD>(                       \
        kvmap, q, w, ksc, bt, max_blocks, ke, next_n, out, nullptr, nullptr, nullptr, 0))       \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(dosa::fp8::kTmaThreads, 1)                      \
      decode_fused_tma_fp8_h##H##_n##N##SFX(                                                    \
          const __grid_constant__ dosa::TensorMap kvmap, const uint8_t* q, const float* w,      \
          const float* ksc, const int* bt, int max_blocks, const int* ke, int next_n,           \
          const unsigned long long* thr, unsigned int* count, unsigned long long* rec,          \
          long long cap) {                                                                      \
    DOSA_FP8_BODY(dosa::fp8::decode_scan_tma<H, (N) * (H), true, AHEAD>(                        \
        kvmap, q, w, ksc, bt, max_blocks, ke, next_n, nullptr, thr, count, rec, cap))           \
  }
DECODE_TMA_INST(64, 1, false, )
DECODE_TMA_INST(64, 2, false, )
DECODE_TMA_INST(32, 1, false, )
DECODE_TMA_INST(32, 2, false, )
DECODE_TMA_INST(64, 1, true, _ahead)
DECODE_TMA_INST(64, 2, true, _ahead)
DECODE_TMA_INST(32, 1, true, _ahead)
DECODE_TMA_INST(32, 2, true, _ahead)

// The decode screen (decode_screen_tma): RQ ∈ {16, 32} plan rows (mts 1, 2), N ∈ {1, 2} rows
// per request; the tensor map first, then the plans, the cache's scales and layout, the rows'
// thresholds and the survivor list.  128·(1 + kCwg) threads, one block per SM.
#define DECODE_SCREEN_INST(RQ, N)                                                               \
  extern "C" __global__ void __launch_bounds__(dosa::fp8::kTmaThreads, 1)                      \
      decode_screen_tma_r##RQ##_n##N(                                                           \
          const __grid_constant__ dosa::TensorMap kvmap, const uint8_t* rows, const float* om,  \
          const float* sig, const double* Cq, const double* eps_raw, double eps_out,            \
          const uint8_t* valid, const float* ksc, const int* bt, int max_blocks, const int* ke, \
          int next_n, const unsigned long long* thr, unsigned int* scount, int* sids,           \
          long long scap) {                                                                     \
    DOSA_FP8_BODY(dosa::fp8::decode_screen_tma<RQ, N>(kvmap, rows, om, sig, Cq, eps_raw,        \
                                                      eps_out, valid, ksc, bt, max_blocks, ke,  \
                                                      next_n, thr, scount, sids, scap))         \
  }
DECODE_SCREEN_INST(16, 1)
DECODE_SCREEN_INST(16, 2)
DECODE_SCREEN_INST(32, 1)
DECODE_SCREEN_INST(32, 2)
