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

// QT query tiles of NC head rows per block (NC = 64 or 128: the MMA's N); H heads per query
// (64 or 32); CWG consumer warpgroups (stages of 64·CWG keys).  FRESH = 3 or 2 — the
// candidate canonical arithmetic, each k32 step from a fresh accumulator, added in k order
// (setmaxnreg moves the producer's registers to the consumers): 3 — steps 0, 1 and 2 in
// flight at once, step 3 issued into step 1's buffer once that is added (3·NC/2 accumulator
// registers: the warpgroup waits once for a single step); 2 — steps 0 and 1 in flight, then
// 2 and 3 one at a time into one buffer (2·NC/2 registers, so that four consumer warpgroups
// fit at NC = 64).  FRESH = 0 — one k128 chain on the tensor core, DeepGEMM's arithmetic (a
// timing variant only: its window follows the running sum, docs/numerics.md).  Schedules that
// measured slower (docs/records/benchmarks.md, session 14): two halves of two steps; two
// tiles interleaved in one warpgroup.  Keeping the next tile's first steps in flight during
// this tile's head sum needs more registers than 2 consumer warpgroups have at NC = 128
// (ptxas spills them and inserts waits); three consumer warpgroups at NC = 128 fit two steps
// in flight (FRESH = 2) once the producer keeps only 32 registers.
template <int H, int NC, int QT, int CWG, int FRESH>
__device__ __forceinline__ void dense_fp8(const TensorMap& kmap, const uint8_t* __restrict__ q,
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
  // registers per thread after setmaxnreg (FRESH; docs/design.md "The FP8 dense kernel"):
  // setmaxnreg.inc draws only on the registers the block was given at launch (kLaunchRegs
  // per thread, the __launch_bounds__ allocation) and that the producer gave back, not on the
  // SM's unallocated ones — a consumer asking for more waits for ever.  The producer keeps 32
  // where more consumer warpgroups share the pool (three at NC = 128, four), 56 elsewhere
  // (the budget the measured builds ran with); multiples of 8, at most 240.
  constexpr int kLaunchRegs = (65536 / kThreads) / 8 * 8;
  constexpr int kProducerRegs = ((CWG == 3 && NC == 128) || CWG >= 4) ? 32 : 56;
  constexpr int kConsumerFit = (kLaunchRegs + (kLaunchRegs - kProducerRegs) / CWG) / 8 * 8;
  constexpr int kConsumerRegs = kConsumerFit < 240 ? kConsumerFit : 240;
  static_assert(CWG * (kConsumerRegs - kLaunchRegs) <= kLaunchRegs - kProducerRegs,
                "setmaxnreg: the consumers take no more than the producer gives back");
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

  // query tiles (rows q0·H .. of the [Qn·H, 128] payload) into swizzled shared memory
  for (int it = t; it < QT * NC * 8; it += kThreads) {
    const int r = it >> 3, j = it & 7;
    const long long row = (long long)q0 * H + r;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (row < (long long)Qn * H) v = __ldg(reinterpret_cast<const uint4*>(q + row * 128 + 16 * j));
    *reinterpret_cast<uint4*>(sq + (r / NC) * kTileBytes + sw128_offset(r % NC, j)) = v;
  }
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
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 128 * CWG);
    }
    fence_barrier_init();
    // the block's key span [lo, hi): the union of its queries' ranges, in whole stages
    long long lo = N, hi = 0;
    for (int j = 0; j < nq; ++j) {
      lo = min(lo, (long long)max(ks[q0 + j], 0));
      hi = max(hi, (long long)min((long long)ke[q0 + j], N));
    }
    if (hi <= lo) lo = hi = 0;
    const long long s0 = lo / kStageKeys, s1 = (hi + kStageKeys - 1) / kStageKeys;
    span[0] = s0;
    span[1] = s0 * kStageKeys;
    span[2] = min(s1 * kStageKeys, N);
    span_stages = (int)(s1 - s0);
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();

  const int wg = t >> 7;
  if (wg == 0) {
    if constexpr (FRESH)
      asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs) : "memory");
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
  if constexpr (FRESH)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs) : "memory");

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
      if constexpr (FRESH == 3) {
        float x[NA], y[NA];
        fence();
        mma_e4m3<NC>(acc, st.da, db, 0);
        mma_e4m3<NC>(x, st.da + 2, db + 2, 0);
        commit();
        mma_e4m3<NC>(y, st.da + 4, db + 4, 0);
        commit();
        wait<1>();  // steps 0 and 1
        pin(acc);
        add_into(acc, x);
        fence();
        mma_e4m3<NC>(x, st.da + 6, db + 6, 0);
        commit();
        wait<1>();  // step 2
        add_into(acc, y);
        wait<0>();  // step 3
        add_into(acc, x);
      } else if constexpr (FRESH == 2) {
        float x[NA];
        fence();
        mma_e4m3<NC>(acc, st.da, db, 0);
        mma_e4m3<NC>(x, st.da + 2, db + 2, 0);
        commit();
        wait<0>();  // steps 0 and 1
        pin(acc);
        add_into(acc, x);
#pragma unroll
        for (int s = 2; s < 4; ++s) {
          fence();
          mma_e4m3<NC>(x, st.da + 2 * s, db + 2 * s, 0);
          commit();
          wait<0>();
          add_into(acc, x);
        }
      } else {
        pin(acc);
        fence();
#pragma unroll
        for (int s = 0; s < 4; ++s) mma_e4m3<NC>(acc, st.da + 2 * s, db + 2 * s, s > 0);
        commit();
        wait<0>();
        pin(acc);
      }
      if (qt == QT - 1) mbar_arrive(&empty[st.slot]);  // the stage's keys are read
      float2 wv[NC / 8];
      lane_weights<NC>(sw + qt * NC, qd, wv);
      epilogue<H, NC>(acc, wv, qd, qrows + qt * QPT, st.r0, st.r1, st.a0, st.a1, N, out);
    }
  }
}
}  // namespace fp8
}  // namespace dosa
#endif

#define DENSE_FP8_INST(H, NC, QT, CWG, FRESH, TAG)                                             \
  extern "C" __global__ void __launch_bounds__(dosa::fp8::threads<CWG>(), 1)                     \
      dense_fp8_h##H##_##TAG(const __grid_constant__ dosa::TensorMap kmap,                       \
                             const uint8_t* __restrict__ q, const float* __restrict__ w,         \
                             const float* __restrict__ alpha, const int* __restrict__ ks,        \
                             const int* __restrict__ ke, int Qn, long long N,                    \
                             float* __restrict__ out) {                                          \
    DENSE_FP8_BODY(H, NC, QT, CWG, FRESH)                                                       \
  }
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DENSE_FP8_BODY(H, NC, QT, CWG, FRESH) \
  dosa::fp8::dense_fp8<H, NC, QT, CWG, FRESH>(kmap, q, w, alpha, ks, ke, Qn, N, out);
#else
#define DENSE_FP8_BODY(H, NC, QT, CWG, FRESH)
#endif
// builds (dosa_cupy/bench/fp8_dense.py VARIANTS): the fastest fresh build of each H (records:
// 128 columns at H = 64, 64 columns at H = 32) for both H, and DeepGEMM's arithmetic in the
// same frame (timing only); to measure: qt8_w4_seq (four consumer warpgroups at 64 columns)
// and n128q4_w3_seq (three at 128 columns: 160 registers each, the producer keeping 32)
#define DENSE_FP8_BUILDS(H)                              \
  DENSE_FP8_INST(H, 128, 4, 2, 3, n128q4_w2_fresh)       \
  DENSE_FP8_INST(H, 64, 8, 3, 3, qt8_w3_fresh)           \
  DENSE_FP8_INST(H, 64, 8, 4, 2, qt8_w4_seq)             \
  DENSE_FP8_INST(H, 128, 4, 3, 2, n128q4_w3_seq)         \
  DENSE_FP8_INST(H, 128, 1, 4, 0, n128_w4_chained)
DENSE_FP8_BUILDS(64)
DENSE_FP8_BUILDS(32)
