// Dense logits on the native FP8 tensor cores (sm_90a; docs/numerics.md "The e4m3 wgmma
// accumulator"): out[t, i] = α_i · Σ_h w_h [q̄_h · k̄_i]_+ for i ∈ [ks[t], ke[t]), −inf
// elsewhere — the arithmetic of a candidate FP8 canonical scorer, measured against DeepGEMM
// before any route adopts it (dosa_cupy/bench/fp8_dense.py).
//
// Keys are wgmma's M operand (64 keys per warpgroup MMA), the heads of a query tile of NC
// rows its N operand (NC = 128: two queries of 64 heads or four of 32; NC = 64: one or two).
// Each k32 step of a dot runs from a fresh accumulator (scale-d = 0): its truncation window
// is then set by the step's own operands, not by the running sum (docs/numerics.md), and the
// four step results are added on the CUDA cores in k order: x = ((x_0 + x_1) + x_2) + x_3.
// Head sum per key: scorer_fp8.cuh head_sums (the same tree for every key whatever its tile
// position and whatever NC), then × α_i.
//
// One block: warpgroup 0 is the producer (one thread issues the bulk tensor copies of
// 64·CWG-key stages into a ring of kStages 128-byte-swizzled slots; its other warps write
// −inf outside the block's key span), CWG consumer warpgroups take 64 keys of each stage each.
#include "scorer_fp8.cuh"

namespace dosa {
namespace fp8 {
// threads of a block with CWG consumer warpgroups beside the producer warpgroup
template <int CWG>
__host__ __device__ constexpr int threads() { return 128 * (1 + CWG); }
}  // namespace fp8
}  // namespace dosa

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace dosa {
namespace fp8 {
using namespace dosa::wg;
constexpr int kStages = 4;

// f(i) for i = I .. N − 1 in order, each call inlined with i a constant: an unrolled loop
// where NVVM declines to unroll one (a large body), so that nothing in flight crosses a
// back edge
template <int I, int N, class F>
__device__ __forceinline__ void static_for(F&& f) {
  if constexpr (I < N) {
    f(I);
    static_for<I + 1, N>(f);
  }
}

// The block's QT query tiles (rows q0·H .. of the [Qn·H, 128] e4m3 payload, zero past the
// last query) into 128-byte-swizzled shared memory, NC rows of 128 bytes per tile.
template <int H, int NC, int QT, int kThreads>
__device__ __forceinline__ void load_query_tiles(const uint8_t* __restrict__ q, int Qn, int q0,
                                                 uint8_t* sq) {
  for (int it = threadIdx.x; it < QT * NC * 8; it += kThreads) {
    const int r = it >> 3, j = it & 7;
    const long long row = (long long)q0 * H + r;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (row < (long long)Qn * H) v = __ldg(reinterpret_cast<const uint4*>(q + row * 128 + 16 * j));
    *reinterpret_cast<uint4*>(sq + (r / NC) * (NC * 128) + sw128_offset(r % NC, j)) = v;
  }
}

// Thread 0's part of a block's set-up (both templates): the ring's kStages full / empty
// mbarrier pairs (one producer arrival fills a slot, `consumers` arrivals empty it) and the
// block's key span — the union [lo, hi) of its nq queries' ranges clipped to [0, N), in whole
// stages of `stage_keys` keys: stages [s0, s1) (none when the union is empty).
__device__ __forceinline__ void ring_and_span(uint64_t* full, uint64_t* empty, int consumers,
                                              const int* __restrict__ ks,
                                              const int* __restrict__ ke, int q0, int nq,
                                              long long N, int stage_keys, long long& s0,
                                              long long& s1) {
  for (int s = 0; s < kStages; ++s) {
    mbar_init(&full[s], 1);
    mbar_init(&empty[s], consumers);
  }
  fence_barrier_init();
  long long lo = N, hi = 0;
  for (int j = 0; j < nq; ++j) {
    lo = min(lo, (long long)max(ks[q0 + j], 0));
    hi = max(hi, (long long)min((long long)ke[q0 + j], N));
  }
  if (hi <= lo) lo = hi = 0;
  s0 = lo / stage_keys;
  s1 = (hi + stage_keys - 1) / stage_keys;
}

// One query of the block, set up once per block in shared memory so the epilogue's stores
// need no index arithmetic: its output row's offset (−1 past the last query) and its
// visible keys [lo, hi).
struct QueryRow {
  long long off, lo, hi;
};

// The tile's scores (scorer_fp8.cuh head_sums, × α) written to the logits: value k = 2u + h
// (query u, row h) by lane qd = k mod 4 of the quad, picked by selects (a register array
// indexed by the lane would go to local memory) and stored under one predicate; −inf where
// not visible.
template <int H, int NC>
__device__ __forceinline__ void epilogue(const float (&x)[NC / 2], const float2 (&wv)[NC / 8],
                                         int qd, const QueryRow* __restrict__ rows, long long r0,
                                         long long r1, float a0, float a1, long long N,
                                         float* __restrict__ out) {
  constexpr int QPT = NC / H;
  constexpr int NV = 2 * QPT;  // values per quad
  float q[QPT][2];
  head_sums<H, NC>(x, wv, q);
#pragma unroll
  for (int m = 0; m < (NV + 3) / 4; ++m) {
    const int k = qd + 4 * m;
    float v = q[(4 * m) >> 1][0];
#pragma unroll
    for (int kk = 4 * m + 1; kk < 4 * m + 4 && kk < NV; ++kk) v = k == kk ? q[kk >> 1][kk & 1] : v;
    if (k >= NV) continue;  // NC = H: lanes 2 and 3 write nothing
    const QueryRow row = rows[k >> 1];
    const long long r = (k & 1) ? r1 : r0;
    const float sc = v * ((k & 1) ? a1 : a0);
    if (row.off >= 0 && r < N) out[row.off + r] = (r >= row.lo && r < row.hi) ? sc : neg_inf();
  }
}

// DeepGEMM's arithmetic in this kernel's frame, a timing build only (bench/fp8_dense.py: what
// the frame costs beside DeepGEMM): QT query tiles of NC head rows per block (NC = 64 or 128:
// the MMA's N), H heads per query (64 or 32), CWG consumer warpgroups (stages of 64·CWG keys);
// one k128 chain on the tensor core (its window follows the running sum, docs/numerics.md,
// so it is not the canonical scorer: dense_fp8_lean below is).
template <int H, int NC, int QT, int CWG>
__device__ __forceinline__ void dense_fp8_chained(const TensorMap& kmap, const uint8_t* __restrict__ q,
                                          const float* __restrict__ w,
                                          const float* __restrict__ alpha,
                                          const int* __restrict__ ks, const int* __restrict__ ke,
                                          int Qn, long long N, float* __restrict__ out) {
  static_assert(H == 64 || H == 32, "H: 64 or 32 heads");
  static_assert(NC == 64 || NC == 128, "NC: 64 or 128 columns per MMA");
  constexpr int QPT = NC / H;        // queries per tile
  constexpr int QB = QT * QPT;       // queries per block
  constexpr int NA = NC / 2;         // accumulator registers per step
  constexpr int kThreads = threads<CWG>();
  constexpr int kStageKeys = 64 * CWG;
  constexpr int kStageBytes = kStageKeys * 128;
  constexpr int kTileBytes = NC * 128;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* base =
      reinterpret_cast<uint8_t*>((reinterpret_cast<unsigned long long>(smem_raw) + 1023) & ~1023ull);
  uint8_t* sk = base;                                   // kStages key slots
  uint8_t* sq = base + kStages * kStageBytes;           // QT query tiles
  uint64_t* full = reinterpret_cast<uint64_t*>(sq + QT * kTileBytes);
  uint64_t* empty = full + kStages;
  // static shared arrays: the compiler then reads them with shared-memory loads (through
  // pointers into the dynamic buffer it used generic loads)
  __shared__ __align__(16) float sw[QT * NC];  // the block's weights
  __shared__ QueryRow qrows[QB];
  // the block's stage span, computed by thread 0 and read by each warpgroup after its
  // setmaxnreg: values kept in registers across it would have to fit the producer's 32–56
  // registers (spills otherwise)
  __shared__ long long span[3];  // first stage, first and end key of the stages' span
  __shared__ int span_stages;

  const int t = threadIdx.x, q0 = blockIdx.x * QB;
  const int nq = min(QB, Qn - q0);

  load_query_tiles<H, NC, QT, kThreads>(q, Qn, q0, sq);
  for (int i = t; i < QT * NC; i += kThreads) {
    const long long row = (long long)q0 * H + i;
    sw[i] = row < (long long)Qn * H ? w[row] : 0.f;
  }
  if (t < QB) {
    const bool live = t < nq;
    qrows[t] = QueryRow{live ? (long long)(q0 + t) * N : -1, live ? (long long)ks[q0 + t] : 0,
                        live ? (long long)ke[q0 + t] : 0};
  }
  if (t == 0) {
    long long s0, s1;
    ring_and_span(full, empty, 128 * CWG, ks, ke, q0, nq, N, kStageKeys, s0, s1);
    span[0] = s0;
    span[1] = s0 * kStageKeys;
    span[2] = min(s1 * kStageKeys, N);
    span_stages = (int)(s1 - s0);
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();

  const int wg = t >> 7;
  if (wg == 0) {
    const int pt = threadIdx.x;
    if (pt == 0) {
      const int n_st = span_stages;
      const long long first = span[0];
      for (int it = 0; it < n_st; ++it) {
        const int slot = it % kStages;
        if (it >= kStages) mbar_wait(&empty[slot], ((it / kStages) - 1) & 1);
        mbar_expect_tx(&full[slot], kStageBytes);
        tma_load_2d(sk + slot * kStageBytes, &kmap, &full[slot], 0, (int)((first + it) * kStageKeys));
      }
    } else if (pt >= 32) {  // −inf outside the span, for every query of the block
      // pointer loops, not unrolled: the producer keeps few registers
#pragma unroll 1
      for (int j = 0; j < QB; ++j) {
        const long long off = qrows[j].off;
        if (off < 0) break;  // past the last query
        float* row = out + off;
#pragma unroll 1
        for (float *p = row + (pt - 32), *e = row + span[1]; p < e; p += 96) *p = neg_inf();
#pragma unroll 1
        for (float *p = row + span[2] + (pt - 32), *e = row + N; p < e; p += 96) *p = neg_inf();
      }
    }
    return;
  }

  // consumers: warpgroup c = wg − 1 takes keys [64c, 64c + 64) of each stage
  const int c = wg - 1, tw = t & 127, warp = tw >> 5, lane = tw & 31, g = lane >> 2, qd = lane & 3;
  const uint32_t sq_addr = (uint32_t)__cvta_generic_to_shared(sq);
  const long long s0 = span[0];
  const int nst = span_stages;
  // stage it of the ring, once its keys have landed: its slot, the descriptor of this
  // warpgroup's 64 keys, the lane's two key rows and their scales
  struct Stage {
    int slot;
    uint64_t da;
    long long r0, r1;
    float a0, a1;
  };
  auto begin_stage = [&](int it) {
    Stage st;
    st.slot = it % kStages;
    mbar_wait(&full[st.slot], (it / kStages) & 1);
    st.da = desc_sw128(
        (uint32_t)__cvta_generic_to_shared(sk + st.slot * kStageBytes + c * 64 * 128));
    st.r0 = (s0 + it) * kStageKeys + 64 * c + 16 * warp + g;
    st.r1 = st.r0 + 8;
    st.a0 = st.r0 < N ? __ldg(alpha + st.r0) : 0.f;
    st.a1 = st.r1 < N ? __ldg(alpha + st.r1) : 0.f;
    return st;
  };
  auto add_into = [&](float (&acc)[NA], float (&x)[NA]) {
    pin(x);
#pragma unroll
    for (int e = 0; e < NA; ++e) acc[e] = acc[e] + x[e];  // the fresh steps in k order
  };

  for (int it = 0; it < nst; ++it) {
    const Stage st = begin_stage(it);
#pragma unroll
    for (int qt = 0; qt < QT; ++qt) {
      const uint64_t db = desc_sw128(sq_addr + qt * kTileBytes);
      float acc[NA];
      pin(acc);
      fence();
#pragma unroll
      for (int s = 0; s < 4; ++s) mma_e4m3<NC>(acc, st.da + 2 * s, db + 2 * s, s > 0);
      commit();
      wait<0>();
      pin(acc);
      if (qt == QT - 1) mbar_arrive(&empty[st.slot]);  // the stage's keys are read
      float2 wv[NC / 8];
      lane_weights<NC>(sw + qt * NC, qd, wv);
      epilogue<H, NC>(acc, wv, qd, qrows + qt * QPT, st.r0, st.r1, st.a0, st.a1, N, out);
    }
  }
}

// ---- The lean builds (dense_fp8_lean): the same values as dense_fp8 (the k32 steps' sums in
// k order, head_sums' fmaf chains and butterfly tree, × α), fewer instructions per tile and
// the next MMAs in flight during a tile's epilogue (docs/records/notes.md "The native FP8
// scorer, session 15": issue-bound at ~440 instructions per 64 × 128 tile, 20 % of the
// warps' cycles waiting on the fresh steps).

// One fresh e4m3 k32 step (scale-d = 0) into d.  The accumulators are read-write operands
// although scale-d = 0 ignores them: with write-only ones ptxas serialises the wgmmas
// (C7512) once several buffers are in flight.
template <int N>
__device__ __forceinline__ void mma_fresh(float (&d)[N / 2], uint64_t adesc, uint64_t bdesc) {
  mma_e4m3<N>(d, adesc, bdesc, 0);
}

// One query of the block for the lean epilogue: its output row, its visible keys [lo, lo +
// len) clipped to [0, N) (so the test is one unsigned compare of a 32-bit key index: the
// tensor map's coordinates already limit N to 2^31), len = −1 past the last query (no
// stores; the producer stops there).
struct __align__(16) LeanRow {
  float* row;
  int lo, len;
};

// The lane's key row of a stage and what its stores need: the row's index (32 bits), α, and
// whether it stores at all (key < N; at QPT = 1 lanes 2 and 3 do not).
struct LeanLane {
  int r;
  float a;
  bool st;
};

// The epilogue of tile qt in two parts: lean_partials reads the combined dots x (the lane's
// partial head sums: lane_partials_of with the tile's weights, read from shared memory as
// they are used — 16 bytes per two column groups, so a schedule with accumulators in flight
// needs no registers for all of them at once), lean_stores finishes the quad's tree, × α,
// −inf where not visible, one store per value the lane keeps (the quad's four lanes write
// four 32-byte runs of key rows).  Between them x is free: dense_fp8_lean's SCHED 1 and 2
// issue the next tile's steps into it there.
template <int H, int NC>
__device__ __forceinline__ void lean_partials(const float (&x)[NC / 2],
                                              const float* __restrict__ sw_tile, int qd,
                                              float (&q)[NC / H][2]) {
  float4 f;
  lane_partials_of<H, NC>(x, [&](int j) {
    if ((j & 1) == 0) f = *reinterpret_cast<const float4*>(sw_tile + 16 * (j >> 1) + 4 * qd);
    return (j & 1) ? make_float2(f.z, f.w) : make_float2(f.x, f.y);
  }, q);
}

template <int H, int NC>
__device__ __forceinline__ void lean_stores(const float (&q)[NC / H][2], int qd,
                                            const LeanRow* __restrict__ rows_tile,
                                            const LeanLane& ln) {
  constexpr int QPT = NC / H;
  float r[(QPT + 1) / 2];
  quad_scatter<QPT>(q, qd, r);
  const LeanRow* rl = rows_tile + (QPT > 1 ? (qd >> 1) : 0);
#pragma unroll
  for (int v = 0; v < (QPT + 1) / 2; ++v) {
    const int4 row = *reinterpret_cast<const int4*>(rl + 2 * v);  // one 16-byte load
    const float sc = r[v] * ln.a;
    const bool vis = (unsigned)(ln.r - row.z) < (unsigned)row.w;
    // the row pointer came through shared memory: st.global says where it points (a generic
    // store otherwise), and it is an ordinary weak store like dense_fp8's
    float* p = reinterpret_cast<float*>(((unsigned long long)(unsigned)row.y << 32) | (unsigned)row.x) + ln.r;
    if (ln.st && row.w >= 0)
      asm volatile("st.global.f32 [%0], %1;\n" ::"l"(p), "f"(vis ? sc : neg_inf()));
  }
}

// The lean kernel: each tile's fresh steps 0 and 1 together, then 2 and 3 one at a time into
// one buffer (acc + one buffer: NC registers of accumulators), the epilogue with nothing of
// this warpgroup in flight; three consumer warpgroups at NC = 128 fill each other's waits.
// Deeper schedules with fewer warpgroups (the next tile's steps in flight during an epilogue,
// across stages too) measured slower (docs/records/benchmarks.md "FP8 dense logits: lean
// builds", "`--scorer fp8` after the anchors' fix and the key ring": more warps beat deeper
// schedules).  The stage's tiles are unrolled (QT is a constant); nothing in flight crosses
// the stage loop's back edge (docs/records/notes.md, session 13: ptxas serialises wgmma whose
// accumulators reach the back edge in flight through phi copies).
// PREG: the producer's registers after setmaxnreg (fewer leave more to the consumers); SCHED:
// the schedule of the MMAs — 0 as above; 1 the next tile's steps 0 and 1 issued during this
// tile's epilogue; 2 four buffers, the next tile's steps issued as the buffers free (below).
template <int H, int NC, int QT, int CWG, int PREG, int SCHED>
__device__ __forceinline__ void dense_fp8_lean(const TensorMap& kmap, const uint8_t* __restrict__ q,
                                               const float* __restrict__ w,
                                               const float* __restrict__ alpha,
                                               const int* __restrict__ ks,
                                               const int* __restrict__ ke, int Qn, long long N,
                                               float* __restrict__ out) {
  static_assert(H == 64 || H == 32, "H: 64 or 32 heads");
  static_assert(NC == 64 || NC == 128, "NC: 64 or 128 columns per MMA");
  constexpr int QPT = NC / H;
  constexpr int QB = QT * QPT;
  constexpr int NA = NC / 2;
  constexpr int kThreads = threads<CWG>();
  constexpr int kStageKeys = 64 * CWG;
  constexpr int kStageBytes = kStageKeys * 128;
  constexpr int kTileBytes = NC * 128;
  // setmaxnreg within the block's pool (dense_fp8; docs/design.md "The FP8 dense kernel")
  constexpr int kLaunchRegs = (65536 / kThreads) / 8 * 8;
  constexpr int kProducerRegs = PREG;
  constexpr int kConsumerFit = (kLaunchRegs + (kLaunchRegs - kProducerRegs) / CWG) / 8 * 8;
  constexpr int kConsumerRegs = kConsumerFit < 240 ? kConsumerFit : 240;
  static_assert(PREG % 8 == 0 && PREG >= 24, "setmaxnreg: multiples of 8, at least 24");
  static_assert(CWG * (kConsumerRegs - kLaunchRegs) <= kLaunchRegs - kProducerRegs,
                "setmaxnreg: the consumers take no more than the producer gives back");
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* base =
      reinterpret_cast<uint8_t*>((reinterpret_cast<unsigned long long>(smem_raw) + 1023) & ~1023ull);
  uint8_t* sk = base;
  uint8_t* sq = base + kStages * kStageBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(sq + QT * kTileBytes);
  uint64_t* empty = full + kStages;
  // the weights in lane order: tile qt, 16-column group jj, lane qd holds (w[16jj + 2qd],
  // w[16jj + 2qd + 1], w[16jj + 8 + 2qd], w[16jj + 8 + 2qd + 1]) — one conflict-free 16-byte
  // load per two column groups
  __shared__ __align__(16) float sw[QT * NC];
  __shared__ __align__(16) LeanRow qrows[QB];
  __shared__ int span[4];  // first stage, first and end key of the span, stages

  const int t = threadIdx.x, q0 = blockIdx.x * QB;
  const int nq = min(QB, Qn - q0);

  load_query_tiles<H, NC, QT, kThreads>(q, Qn, q0, sq);
  for (int i = t; i < QT * NC; i += kThreads) {
    const long long row = (long long)q0 * H + i;
    const int col = i % NC, jj = col >> 4, jo = (col >> 3) & 1, qd = (col >> 1) & 3, e = col & 1;
    sw[(i - col) + 16 * jj + 4 * qd + 2 * jo + e] = row < (long long)Qn * H ? w[row] : 0.f;
  }
  if (t < QB) {
    const bool live = t < nq;
    const long long lo = live ? max((long long)ks[q0 + t], 0ll) : 0;
    const long long hi = live ? min((long long)ke[q0 + t], N) : 0;
    qrows[t] = LeanRow{live ? out + (long long)(q0 + t) * N : out, (int)lo,
                       live ? (int)max(hi - lo, 0ll) : -1};
  }
  if (t == 0) {
    long long s0, s1;
    ring_and_span(full, empty, 128 * CWG, ks, ke, q0, nq, N, kStageKeys, s0, s1);
    span[0] = (int)s0;
    span[1] = (int)(s0 * kStageKeys);
    span[2] = (int)min(s1 * kStageKeys, N);
    span[3] = (int)(s1 - s0);
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();

  const int wg = t >> 7;
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs) : "memory");
    const int pt = threadIdx.x;
    if (pt == 0) {
      const int n_st = span[3];
      const int first = span[0];
      for (int it = 0; it < n_st; ++it) {
        const int slot = it % kStages;
        if (it >= kStages) mbar_wait(&empty[slot], ((it / kStages) - 1) & 1);
        mbar_expect_tx(&full[slot], kStageBytes);
        tma_load_2d(sk + slot * kStageBytes, &kmap, &full[slot], 0, (first + it) * kStageKeys);
      }
    } else if (pt >= 32) {  // −inf outside the span, for every query of the block
#pragma unroll 1
      for (int j = 0; j < QB; ++j) {
        if (qrows[j].len < 0) break;  // past the last query
        float* row = qrows[j].row;
#pragma unroll 1
        for (float *p = row + (pt - 32), *e = row + span[1]; p < e; p += 96) *p = neg_inf();
#pragma unroll 1
        for (float *p = row + span[2] + (pt - 32), *e = row + N; p < e; p += 96) *p = neg_inf();
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs) : "memory");

  // the warpgroup and warp index through a shuffle from lane 0: the compiler then knows them
  // to be the same in every lane and keeps the descriptors in uniform registers (one
  // R2UR / IADD3 pair per MMA otherwise)
  const int c = __shfl_sync(0xffffffffu, wg - 1, 0);
  const int warp = __shfl_sync(0xffffffffu, (t >> 5) & 3, 0);
  const int lane = t & 31, g = lane >> 2, qd = lane & 3;
  const uint32_t a_lo0 = desc_lo((uint32_t)__cvta_generic_to_shared(sk + c * 64 * 128));
  const uint32_t b_lo0 = desc_lo((uint32_t)__cvta_generic_to_shared(sq));
  const int s0 = span[0], nst = span[3];
  const int Ni = (int)N;
  const float* sw_lane = sw;  // + tile and group offsets below
  const LeanRow* rows = qrows;
  // the key row within a stage of lane ln of warp wp (of 4): row g = ln / 4 or g + 8 of the
  // warp's 16 (value k's h = k & 1)
  auto lane_row = [&](int wp, int ln) { return 64 * c + 16 * wp + (ln >> 2) + 8 * (ln & 1); };
  const int row_in_stage = lane_row(warp, lane);
  const bool lane_stores = QPT > 1 || qd < 2;

  auto adesc = [&](uint32_t a_lo, int s) { return desc_of(a_lo) + 2 * s; };
  auto bdesc = [&](int qt, int s) { return desc_of(b_lo0) + (qt * (kTileBytes >> 4) + 2 * s); };
  auto add_into = [&](float (&acc)[NA], float (&x)[NA]) {
    pin(x);
#pragma unroll
    for (int e = 0; e < NA; ++e) acc[e] = acc[e] + x[e];
  };

  // steps 2 and 3 of tile qt one at a time into x, each added to acc in k order; the
  // stage's slot released after the last tile's last step
  auto steps_2_3 = [&](float (&acc)[NA], float (&x)[NA], uint32_t a_lo, int qt, int slot) {
#pragma unroll
    for (int s = 2; s < 4; ++s) {
      fence();
      mma_fresh<NC>(x, adesc(a_lo, s), bdesc(qt, s));
      commit();
      wait<0>();
      add_into(acc, x);
    }
    if (qt == QT - 1) mbar_arrive(&empty[slot]);
  };

  // the key slot's A descriptor (low word) of stage it
  auto a_of = [&](int it) { return a_lo0 + (it % kStages) * (kStageBytes >> 4); };
  auto stage_lane = [&](int it) {
    LeanLane ln;
    if constexpr (SCHED > 0) {  // the first stage and the lane's row read again each stage:
      // kept in registers across the stage loop they would be spilled (steps in flight)
      const int first = *reinterpret_cast<volatile const int*>(&span[0]);
      unsigned tid;  // volatile: not hoisted out of the stage loop as an invariant
      asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(tid));
      ln.r = (first + it) * kStageKeys + lane_row((int)(tid >> 5) & 3, (int)(tid & 31));
    } else {
      ln.r = (s0 + it) * kStageKeys + row_in_stage;
    }
    ln.st = lane_stores && ln.r < Ni;
    ln.a = ln.r < Ni ? __ldg(alpha + ln.r) : 0.f;
    return ln;
  };

  // whether stage it is one of the block's; the count read again each stage where four
  // buffers are in flight (kept in a register across the stage loop it is spilled)
  auto in_span = [&](int it) {
    if constexpr (SCHED == 2) {
      return it < *reinterpret_cast<volatile const int*>(&span[3]);
    } else {
      return it < nst;
    }
  };
#pragma unroll 1
    for (int it = 0; in_span(it); ++it) {
      const int slot = it % kStages;
      mbar_wait(&full[slot], (it / kStages) & 1);
      const uint32_t a_lo = a_of(it);
      const LeanLane ln = stage_lane(it);
      if constexpr (SCHED == 0) {
#pragma unroll
        for (int qt = 0; qt < QT; ++qt) {
          float acc[NA], x[NA];
          fence();
          mma_fresh<NC>(acc, adesc(a_lo, 0), bdesc(qt, 0));
          mma_fresh<NC>(x, adesc(a_lo, 1), bdesc(qt, 1));
          commit();
          wait<0>();
          pin(acc);
          add_into(acc, x);
          steps_2_3(acc, x, a_lo, qt, slot);
          float hq[QPT][2];
          lean_partials<H, NC>(acc, sw_lane + qt * NC, qd, hq);
          lean_stores<H, NC>(hq, qd, rows + qt * QPT, ln);
        }
      } else if constexpr (SCHED == 1) {
        // step 0 of tile qt + 1 runs on the tensor cores during tile qt's head sums
        // and step 1 during its stores (step 0 into x once the last add has read it, step 1
        // into acc once lean_partials has), within the stage: nothing in flight crosses the
        // loop's back edge.  Step 0 lands in x and step 1 in acc, and x + acc is the
        // canonical x_0 + x_1 (the sum is commutative bit for bit).
        float acc[NA], x[NA];
        fence();
        mma_fresh<NC>(x, adesc(a_lo, 0), bdesc(0, 0));
        mma_fresh<NC>(acc, adesc(a_lo, 1), bdesc(0, 1));
        commit();
#pragma unroll
        for (int qt = 0; qt < QT; ++qt) {
          wait<0>();
          pin(acc);
          pin(x);
#pragma unroll
          for (int e = 0; e < NA; ++e) acc[e] = x[e] + acc[e];
          steps_2_3(acc, x, a_lo, qt, slot);
          if (qt + 1 < QT) {
            fence();
            mma_fresh<NC>(x, adesc(a_lo, 0), bdesc(qt + 1, 0));
            commit();
          }
          float hq[QPT][2];
          lean_partials<H, NC>(acc, sw_lane + qt * NC, qd, hq);
          if (qt + 1 < QT) {
            fence();
            mma_fresh<NC>(acc, adesc(a_lo, 1), bdesc(qt + 1, 1));
            commit();
          }
          lean_stores<H, NC>(hq, qd, rows + qt * QPT, ln);
        }
      } else {
        // four buffers: a tile's four steps in flight together, one wait, the sums in k order
        // into b[0]; steps 1 and 2 of tile qt + 1 issued into b[1], b[2] once the sums have
        // read them, steps 0 and 3 once the head sums have read b[0] (all four before the
        // head sums spill at H 32) — the next tile's MMAs run during this tile's epilogue,
        // within the stage (NC = 64: 32 registers a buffer; the tiles unrolled by static_for)
        float b[4][NA];
        fence();
#pragma unroll
        for (int s = 0; s < 4; ++s) mma_fresh<NC>(b[s], adesc(a_lo, s), bdesc(0, s));
        commit();
        static_for<0, QT>([&](int qt) {
          wait<0>();
          pin(b);
#pragma unroll
          for (int s = 1; s < 4; ++s)
#pragma unroll
            for (int e = 0; e < NA; ++e) b[0][e] = b[0][e] + b[s][e];
          if (qt == QT - 1) mbar_arrive(&empty[slot]);
          if (qt + 1 < QT) {
            fence();
#pragma unroll
            for (int s = 1; s < 3; ++s) mma_fresh<NC>(b[s], adesc(a_lo, s), bdesc(qt + 1, s));
            commit();
          }
          float hq[QPT][2];
          lean_partials<H, NC>(b[0], sw_lane + qt * NC, qd, hq);
          if (qt + 1 < QT) {
            fence();
            mma_fresh<NC>(b[0], adesc(a_lo, 0), bdesc(qt + 1, 0));
            mma_fresh<NC>(b[3], adesc(a_lo, 3), bdesc(qt + 1, 3));
            commit();
          }
          lean_stores<H, NC>(hq, qd, rows + qt * QPT, ln);
        });
      }
    }
}
}  // namespace fp8
}  // namespace dosa
#endif

// the parameter list of every dense_fp8 kernel (the key map first: a tensor map passed by
// value must sit at a 64-byte-aligned parameter offset, dosa_cupy/tma.py)
#define DENSE_FP8_PARAMS                                                                      \
  const __grid_constant__ dosa::TensorMap kmap, const uint8_t* __restrict__ q,                \
      const float* __restrict__ w, const float* __restrict__ alpha, const int* __restrict__ ks, \
      const int* __restrict__ ke, int Qn, long long N, float* __restrict__ out
#define DENSE_FP8_INST(H, NC, QT, CWG, TAG)                                             \
  extern "C" __global__ void __launch_bounds__(dosa::fp8::threads<CWG>(), 1)                     \
      dense_fp8_h##H##_##TAG(DENSE_FP8_PARAMS) {                                               \
    DENSE_FP8_BODY(H, NC, QT, CWG)                                                       \
  }
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DENSE_FP8_BODY(H, NC, QT, CWG) \
  dosa::fp8::dense_fp8_chained<H, NC, QT, CWG>(kmap, q, w, alpha, ks, ke, Qn, N, out);
#else
#define DENSE_FP8_BODY(H, NC, QT, CWG)
#endif
// the lean builds (dense_fp8_lean; PREG: the producer's registers)
#define DENSE_FP8_LEAN(H, NC, QT, CWG, PREG, SCHED, TAG)                                  \
  extern "C" __global__ void __launch_bounds__(dosa::fp8::threads<CWG>(), 1)                     \
      dense_fp8_h##H##_##TAG(DENSE_FP8_PARAMS) {                                               \
    DENSE_FP8_LEAN_BODY(H, NC, QT, CWG, PREG, SCHED)                                 \
  }
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DENSE_FP8_LEAN_BODY(H, NC, QT, CWG, PREG, SCHED) \
  dosa::fp8::dense_fp8_lean<H, NC, QT, CWG, PREG, SCHED>(kmap, q, w, alpha, ks, ke, Qn, N, out);
#else
#define DENSE_FP8_LEAN_BODY(H, NC, QT, CWG, PREG, SCHED)
#endif
// builds (dosa_cupy/bench/fp8_dense.py VARIANTS): the canonical scorer's dense logits
// (scorer.FP8_DENSE: the fastest of every fresh build measured, docs/records/benchmarks.md "FP8
// dense logits: lean builds") and DeepGEMM's arithmetic in the same frame (timing only)
#define DENSE_FP8_BUILDS(H)                              \
  DENSE_FP8_INST(H, 128, 1, 4, n128_w4_chained)          \
  DENSE_FP8_LEAN(H, 128, 4, 3, 32, 0, lean_n128q4_w3_seq) \
  DENSE_FP8_LEAN(H, 128, 4, 3, 32, 1, lean_n128q4_w3_next) \
  DENSE_FP8_LEAN(H, 64, 8, 3, 32, 2, lean_qt8_w3_pipe4)
DENSE_FP8_BUILDS(64)
DENSE_FP8_BUILDS(32)
