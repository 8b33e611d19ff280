// Scores of gathered keys on the native FP8 scorer (scorer_fp8.cuh; docs/error_model.md "A
// native FP8 scorer"): for query t and the ids of its row, out[t, m] = α_i · Σ_h w_h
// [q̄_h · k̄_i]_+ with i = ids[t, m] (−inf where i < 0) — the arithmetic of dense_fp8.cu's
// logits, bit for bit: the same fresh k32 steps in halves, the same head sum, a key's bits
// independent of its row in the tile (the probe's position checks) and of the MMA's column
// count (H = 32 runs m64n32k32 with one query, the dense logits m64n64k32 with two).  One
// warpgroup per block and 64 ids per tile; keys by 16-byte loads into the 128-byte-swizzled
// tile (a gather: the bulk tensor copy of Hopper reads boxes, not rows by id).
//
// The stages that score keys by id run on one building block, score_tile_emit: a tile of
// up to 64 key ids of one query → gathered, scored, multiplied by α and appended as records
// (record.cuh warp_emit, docs/method.md §9 "Compact writeback and selection").  The ids come
// from a functor; the kernels differ only in it:
//   refine_fp8_h{H}       the set bits of the query's survivor bitmask (refinement, §9)
//   seed_score_fp8_h{H}   a key range [lo, hi) of a key array, record id idmap[i] (seeds, §2)
//   seed_ids_fp8_h{H}     a table of explicit seed ids (seeds, §2)
// and score_fp8_ids_h{H} (scores into a dense [Qn, M] array) runs on the same gather and
// scorer (gather_keys, tile_dots, tile_sums): every kernel gives a key the dense logits' bits.
#include "scorer_fp8.cuh"
#include "record.cuh"  // warp_emit: one record format and one overflow rule for all stages

// Bitmask words per refine_fp8 block (the host launches ⌈NW / RWF⌉ blocks per query in y):
// 32,768 keys, so at the survival of a few percent a block scores a few dozen full tiles.
#define RWF 1024
// Words compacted per pass of a refine_fp8 block (one per thread): the shared id list holds
// one pass's ids (≤ 32·RPASS) after fewer than 64 carried over from the previous pass.
#define RPASS 128

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
  float x[2][H / 2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    pin(x[0]);
    pin(x[1]);
    fence();
    mma_e4m3<H>(x[0], da + 4 * half, db + 4 * half, 0);
    mma_e4m3<H>(x[1], da + 4 * half + 2, db + 4 * half + 2, 0);
    commit();
    wait<0>();
    add_half<H>(x, acc, half == 0);
  }
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

// The building block of the record stages: score the tile of key ids id_of(r) (r = 0..63;
// an index of kp / alpha, or −1: no key) of one query and append (s, rec_id(i)) with
// s = headsum × α_i for every key present — with THRESH only those with s ≥ tau (the test
// of stage.cuh score_ids_and_emit) — to rec[0 .. cap) through warp_emit (the counter counts
// every qualifying record, also past cap: an overflow is detected, never silent; docs/
// method.md §9 "Compact writeback and selection").  Lanes qd = 0 and 1 of a quad emit its
// two key rows, so each warp appends its 16 keys with one atomicAdd.  All 128 threads call
// it; it ends with a barrier, after which sk and the ids' source may be overwritten.
template <int H, bool THRESH, class IdOf, class RecId>
__device__ __forceinline__ void score_tile_emit(const uint8_t* __restrict__ kp,
                                                const float* __restrict__ alpha, uint8_t* sk,
                                                const uint8_t* sq, const float* sw,
                                                IdOf&& id_of, RecId&& rec_id, float tau,
                                                unsigned int* count, unsigned long long* rec,
                                                long long cap) {
  gather_keys(kp, sk, id_of);
  float acc[H / 2];
  tile_dots<H>(sk, sq, acc);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, qd = lane & 3;
  float s[1][2];
  tile_sums<H>(acc, sw, qd, s);
  const int h = qd & 1;  // the row of the quad this lane emits (lanes qd = 2, 3: none)
  const int i = qd < 2 ? id_of(16 * warp + g + 8 * h) : -1;
  float sc = 0.f;
  if (i >= 0) sc = (h ? s[0][1] : s[0][0]) * __ldg(alpha + i);
  const bool p = i >= 0 && (!THRESH || sc >= tau);
  warp_emit(p, sc, p ? rec_id(i) : -1, lane, count, rec, cap);
  __syncthreads();  // every warp past its wait<0> and its reads of the ids
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

// Refinement on the FP8 scorer (docs/method.md §9 "Refinement"): every set bit i of query
// t = qlist[x]'s survivor bitmask surv[t] (uint32 [Qn, NW], NW = ⌈N/32⌉) in the words
// [wlo + y·RWF, min(whi, wlo + (y+1)·RWF)) of its visible words [wlo, whi) = [ks >> 5,
// (ke + 31) >> 5) is scored, and (s, i) appended to rec[t, :cap] iff s ≥ τ_t; count[t]
// counts them all.  grid (|qlist|, ⌈NW / RWF⌉), 128 threads: the query index fastest, so
// concurrently resident blocks gather the same key chunk and L2 serves the keys that
// survive for several queries.  Survival is a few percent, so a block first tests its words
// and exits when none is set; otherwise it compacts the set bits of RPASS words per pass
// into a shared id list (a block scan of the words' popcounts) and scores it in full tiles
// of 64 ids, the fewer than 64 left over carried to the next pass, the last partial tile at
// the end.  Bits of the last word past N are ignored (no key there to gather).
template <int H>
__device__ __forceinline__ void refine(const uint8_t* __restrict__ q, const float* __restrict__ w,
                                       const uint8_t* __restrict__ kp,
                                       const float* __restrict__ alpha,
                                       const float* __restrict__ tau, const int* __restrict__ ks_,
                                       const int* __restrict__ ke_, const int* __restrict__ qlist,
                                       long long N, const uint32_t* __restrict__ surv,
                                       unsigned int* __restrict__ count,
                                       unsigned long long* __restrict__ rec, long long cap) {
  static_assert(H == 64 || H == 32, "H: 64 or 32 heads");
  __shared__ __align__(1024) uint8_t sk[64 * 128];
  __shared__ __align__(1024) uint8_t sq[H * 128];
  __shared__ __align__(16) float sw[H];
  __shared__ int sid[32 * RPASS + 64];  // ids of one pass after those carried over
  __shared__ int wsum[4];               // the warps' popcount totals of a pass
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int tq = qlist[blockIdx.x];
  const long long NW = (N + 31) >> 5;
  const long long wlo = (long long)ks_[tq] >> 5;
  const long long whi = min(NW, ((long long)ke_[tq] + 31) >> 5);
  const long long w0 = wlo + (long long)blockIdx.y * RWF;
  if (w0 >= whi) return;
  const long long w1 = min(whi, w0 + RWF);
  const uint32_t* srow = surv + (long long)tq * NW;
  bool any = false;
  for (long long wi = w0 + t; wi < w1; wi += 128) any |= srow[wi] != 0u;
  if (!__syncthreads_or(any)) return;  // no survivor in the block's words: the common case
  load_query<H>(q, w, tq, sq, sw);
  const float tt = tau[tq];
  unsigned int* cnt = count + tq;
  unsigned long long* rrow = rec + (long long)tq * cap;
  const uint32_t tail = (N & 31) ? (1u << (N & 31)) - 1u : 0xffffffffu;  // bits < N of word NW−1
  int have = 0;  // ids carried over in sid[0 .. have), < 64
  for (long long wb = w0; wb < w1; wb += RPASS) {
    const long long wi = wb + t;
    uint32_t m = wi < w1 ? srow[wi] : 0u;
    if (wi == NW - 1) m &= tail;
    const int n = __popc(m);
    int incl = n;  // inclusive scan of the popcounts over the warp, then over the warps
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    if (lane == 31) wsum[warp] = incl;
    __syncthreads();
    int before = 0, total = 0;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int v = wsum[u];
      before += u < warp ? v : 0;
      total += v;
    }
    int at = have + before + incl - n;
    while (m) {  // the word's set bits in key order
      sid[at++] = (int)(wi * 32 + (__ffs(m) - 1));
      m &= m - 1u;
    }
    __syncthreads();
    const int all = have + total;
    const int full = wb + RPASS >= w1 ? all : (all & ~63);  // the last pass: the partial tile too
    for (int j = 0; j < full; j += 64)
      score_tile_emit<H, true>(
          kp, alpha, sk, sq, sw, [&](int r) { return j + r < all ? sid[j + r] : -1; },
          [](int i) { return i; }, tt, cnt, rrow, cap);
    have = all - full;
    const int v = t < have ? sid[full + t] : 0;
    __syncthreads();  // every read of sid and wsum of this pass is done
    if (t < have) sid[t] = v;  // published by the next pass's barriers
  }
}

// Seed records from a key range (docs/method.md §2, the FP8 counterpart of seeds.cu
// seed_score_mt*): block (x, t) scores the keys i of [lo[t], hi[t]) (rows of kp / alpha,
// n_keys of them) in tiles of 64 from lo[t] + 64·x with stride 64·gridDim.x and appends
// (s, idmap[i]) — (s, i) without an idmap — for every key, no threshold.  grid (gx, Qn),
// 128 threads; the host sizes gx by the ranges' lengths (a longer range is still covered).
template <int H>
__device__ __forceinline__ void seed_score(const uint8_t* __restrict__ q,
                                           const float* __restrict__ w,
                                           const uint8_t* __restrict__ kp,
                                           const float* __restrict__ alpha, long long n_keys,
                                           const int* __restrict__ lo_, const int* __restrict__ hi_,
                                           const int* __restrict__ idmap, int Qn,
                                           unsigned int* __restrict__ count,
                                           unsigned long long* __restrict__ rec, long long cap) {
  static_assert(H == 64 || H == 32, "H: 64 or 32 heads");
  __shared__ __align__(1024) uint8_t sk[64 * 128];
  __shared__ __align__(1024) uint8_t sq[H * 128];
  __shared__ __align__(16) float sw[H];
  const int tq = blockIdx.y;
  if (tq >= Qn) return;
  const long long lo = max(0LL, (long long)lo_[tq]), hi = min(n_keys, (long long)hi_[tq]);
  long long n0 = lo + 64LL * blockIdx.x;
  if (n0 >= hi) return;
  load_query<H>(q, w, tq, sq, sw);
  unsigned int* cnt = count + tq;
  unsigned long long* rrow = rec + (long long)tq * cap;
  for (; n0 < hi; n0 += 64LL * gridDim.x)
    score_tile_emit<H, false>(
        kp, alpha, sk, sq, sw, [&](int r) { return n0 + r < hi ? (int)(n0 + r) : -1; },
        [&](int i) { return idmap ? __ldg(idmap + i) : i; }, 0.f, cnt, rrow, cap);
}

// Explicit seeds (docs/method.md §2, the FP8 counterpart of seed_ids.cu seed_ids_mt*):
// block (x, t) takes the entries ids[t, j] (int32 [Qn, S]) of the tiles of 64 from 64·x with
// stride 64·gridDim.x; an entry is a key iff ks[t] ≤ id < ke[t] (−1 padding and ids out of
// the visible range are skipped) and every key's record goes to rec[t, :S], no threshold
// (count[t] ≤ S: no overflow; like seed_score, a key is recorded whatever its score — the
// f16 seed_ids_mt* tests s ≥ −inf, which differs only for a NaN).  A tile of padding only
// (rows are padded at the end) is skipped, and the query is loaded at the block's first
// tile with a key.  grid (gx, Qn), 128 threads.
template <int H>
__device__ __forceinline__ void seed_ids(const uint8_t* __restrict__ q, const float* __restrict__ w,
                                         const uint8_t* __restrict__ kp,
                                         const float* __restrict__ alpha,
                                         const int* __restrict__ ks_, const int* __restrict__ ke_,
                                         const int* __restrict__ ids, long long S,
                                         unsigned int* __restrict__ count,
                                         unsigned long long* __restrict__ rec) {
  static_assert(H == 64 || H == 32, "H: 64 or 32 heads");
  __shared__ __align__(1024) uint8_t sk[64 * 128];
  __shared__ __align__(1024) uint8_t sq[H * 128];
  __shared__ __align__(16) float sw[H];
  const int t = threadIdx.x, tq = blockIdx.y;
  const int ks = ks_[tq], ke = ke_[tq];
  const int* row = ids + (long long)tq * S;
  unsigned int* cnt = count + tq;
  unsigned long long* rrow = rec + (long long)tq * S;
  bool loaded = false;
  for (long long j0 = 64LL * blockIdx.x; j0 < S; j0 += 64LL * gridDim.x) {
    auto id_of = [&](int r) {
      const int v = j0 + r < S ? __ldg(row + j0 + r) : -1;
      return v >= ks && v < ke ? v : -1;
    };
    if (!__syncthreads_or(t < 64 && id_of(t) >= 0)) continue;  // block-uniform
    if (!loaded) load_query<H>(q, w, tq, sq, sw);
    loaded = true;
    score_tile_emit<H, false>(kp, alpha, sk, sq, sw, id_of, [](int i) { return i; }, 0.f, cnt,
                              rrow, S);
  }
}

}  // namespace fp8
}  // namespace dosa
#endif

// The kernels: H ∈ {64, 32}, 128 threads (one warpgroup), static shared memory only.  The
// sm_90a code only for the sm_90a target (__CUDA_ARCH_FEAT_SM90_ALL); other targets compile
// empty bodies, so the sm_90 build of CI parses the same parameter lists.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DOSA_FP8_BODY(call) call;
#else
#define DOSA_FP8_BODY(call)
#endif

#define SCORE_FP8_INST(H)                                                                       \
  extern "C" __global__ void __launch_bounds__(128) score_fp8_ids_h##H(                         \
      const uint8_t* __restrict__ q, const float* __restrict__ w, const uint8_t* __restrict__ kp, \
      const float* __restrict__ alpha, const int* __restrict__ ids, int M,                      \
      float* __restrict__ out) {                                                                \
    DOSA_FP8_BODY(dosa::fp8::score_ids<H>(q, w, kp, alpha, ids, M, out))                        \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(128) refine_fp8_h##H(                            \
      const uint8_t* q, const float* w, const uint8_t* kp, const float* alpha, const float* tau, \
      const int* ks, const int* ke, const int* qlist, long long N, const uint32_t* surv,       \
      unsigned int* count, unsigned long long* rec, long long cap) {                           \
    DOSA_FP8_BODY(dosa::fp8::refine<H>(q, w, kp, alpha, tau, ks, ke, qlist, N, surv, count,   \
                                       rec, cap))                                              \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(128) seed_score_fp8_h##H(                        \
      const uint8_t* q, const float* w, const uint8_t* kp, const float* alpha, long long n_keys, \
      const int* lo, const int* hi, const int* idmap, int Qn, unsigned int* count,             \
      unsigned long long* rec, long long cap) {                                                \
    DOSA_FP8_BODY(dosa::fp8::seed_score<H>(q, w, kp, alpha, n_keys, lo, hi, idmap, Qn, count, \
                                           rec, cap))                                          \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(128) seed_ids_fp8_h##H(                          \
      const uint8_t* q, const float* w, const uint8_t* kp, const float* alpha, const int* ks,  \
      const int* ke, const int* ids, long long S, unsigned int* count,                         \
      unsigned long long* rec) {                                                               \
    DOSA_FP8_BODY(dosa::fp8::seed_ids<H>(q, w, kp, alpha, ks, ke, ids, S, count, rec))        \
  }
SCORE_FP8_INST(64)
SCORE_FP8_INST(32)
