// Dense logits on the native FP8 tensor cores (sm_90a; docs/numerics.md "The e4m3 wgmma
// accumulator"): out[t, i] = α_i · Σ_h w_h [q̄_h · k̄_i]_+ for i ∈ [ks[t], ke[t]), −inf
// elsewhere — the arithmetic of a candidate FP8 canonical scorer, measured against DeepGEMM
// before any route adopts it (dosa_cupy/bench/fp8_dense.py).
//
// Keys are wgmma's M operand (64 keys per warpgroup MMA), the heads of one 64-row query tile
// its N operand (H = 64: one query; H = 32: two).  Each k32 step of a dot runs from a fresh
// accumulator (scale-d = 0): its truncation window is then set by the step's own operands,
// not by the running sum (docs/numerics.md), and the four step results are added on the CUDA
// cores in k order: x = ((x_0 + x_1) + x_2) + x_3.  Head sum per key: each lane's fmaf chain
// over its 16 columns (j = 0..7, then the column pair), then the quad's butterfly (lanes
// c ^ 1, then c ^ 2), the same tree for every key whatever its tile position; then × α_i.
//
// One block: warpgroup 0 is the producer (one thread issues the bulk tensor copies of
// 128-key stages into a ring of kStages 128-byte-swizzled slots; its other warps write −inf
// outside the block's key span), warpgroups 1 and 2 consume 64 keys of each stage each.
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

// The tile's scores (scorer_fp8.cuh head_sums, × α) written to the logits: lane qd writes
// (query u, row h) with qd = 2u + h (H = 32) or qd = h (H = 64); −inf where not visible.
template <int H>
__device__ __forceinline__ void epilogue(const float (&x)[32], const float* __restrict__ sw_tile,
                                         int qd, const QueryRow* __restrict__ rows, long long r0,
                                         long long r1, float a0, float a1, long long N,
                                         float* __restrict__ out) {
  constexpr int QPT = 64 / H;
  float q[QPT][2];
  head_sums<H, 64>(x, sw_tile, qd, q);
#pragma unroll
  for (int u = 0; u < QPT; ++u)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (qd != 2 * u + h && !(QPT == 1 && qd == h)) continue;
      const QueryRow row = rows[u];
      const long long r = h ? r1 : r0;
      if (row.off < 0 || r >= N) continue;
      const float sc = q[u][h] * (h ? a1 : a0);
      out[row.off + r] = (r >= row.lo && r < row.hi) ? sc : -INFINITY;
    }
}

// QT query tiles of 64 head rows per block; H heads per query (64 or 32); CWG consumer
// warpgroups (stages of 64·CWG keys); FRESH: each k32 step from a fresh accumulator (the
// candidate canonical arithmetic) or chained on the tensor core (a timing variant only:
// its window follows the running sum, docs/numerics.md); PIPE (with FRESH): 1 — each tile's
// four steps as two halves of two (the same values), a register budget set by setmaxnreg;
// 2 — the halves of two tiles interleaved, so one tile's sums and epilogue run while the
// other tile's MMAs do (nothing in flight across the loop's back edge: docs/records/notes.md).
template <int H, int QT, int CWG, bool FRESH, int PIPE>
__device__ __forceinline__ void dense_fp8(const TensorMap& kmap, const uint8_t* __restrict__ q,
                                          const float* __restrict__ w,
                                          const float* __restrict__ alpha,
                                          const int* __restrict__ ks, const int* __restrict__ ke,
                                          int Qn, long long N, float* __restrict__ out) {
  static_assert(H == 64 || H == 32, "H: 64 or 32 heads");
  constexpr int QPT = 64 / H;        // queries per tile
  constexpr int QB = QT * QPT;       // queries per block
  constexpr int kThreads = threads<CWG>();
  constexpr int kStageKeys = 64 * CWG;
  constexpr int kStageBytes = kStageKeys * 128;
  // registers per thread after setmaxnreg (PIPE): the producer warpgroup gives back what
  // the consumers take, 65,536 in all (multiples of 8)
  constexpr int kProducerRegs = 56;
  constexpr int kConsumerRegs = ((65536 / 128 - kProducerRegs) / CWG) / 8 * 8;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* base =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* sk = base;                                   // kStages × 16 KB key slots
  uint8_t* sq = base + kStages * kStageBytes;           // QT × 8 KB query tiles
  uint64_t* full = reinterpret_cast<uint64_t*>(sq + QT * 8192);
  uint64_t* empty = full + kStages;
  // static shared arrays: the compiler then reads them with shared-memory loads (through
  // pointers into the dynamic buffer it used generic loads)
  __shared__ __align__(16) float sw[QT * 64];  // the block's weights
  __shared__ QueryRow qrows[QB];

  const int t = threadIdx.x, q0 = blockIdx.x * QB;
  const int nq = min(QB, Qn - q0);
  // the block's key span [lo, hi): the union of its queries' ranges, in whole stages
  long long lo = N, hi = 0;
  for (int j = 0; j < nq; ++j) {
    lo = min(lo, (long long)max(ks[q0 + j], 0));
    hi = max(hi, (long long)min((long long)ke[q0 + j], N));
  }
  if (hi <= lo) lo = hi = 0;
  const long long s0 = lo / kStageKeys, s1 = (hi + kStageKeys - 1) / kStageKeys;
  const int nst = (int)(s1 - s0);

  // query tiles (rows q0·H .. of the [Qn·H, 128] payload) into swizzled shared memory
  for (int it = t; it < QT * 64 * 8; it += kThreads) {
    const int r = it >> 3, j = it & 7;
    const long long row = (long long)q0 * H + r;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (row < (long long)Qn * H) v = __ldg(reinterpret_cast<const uint4*>(q + row * 128 + 16 * j));
    *reinterpret_cast<uint4*>(sq + (r >> 6) * 8192 + sw128_offset(r & 63, j)) = v;
  }
  for (int i = t; i < QT * 64; i += kThreads) {
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
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();

  const int wg = t >> 7;
  if (wg == 0) {
    if constexpr (PIPE)
      asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs) : "memory");
    if (t == 0) {
      for (int it = 0; it < nst; ++it) {
        const int slot = it % kStages;
        if (it >= kStages) mbar_wait(&empty[slot], ((it / kStages) - 1) & 1);
        mbar_expect_tx(&full[slot], kStageBytes);
        tma_load_2d(sk + slot * kStageBytes, &kmap, &full[slot], 0, (int)((s0 + it) * kStageKeys));
      }
    } else if (t >= 32) {  // −inf outside the span, for every query of the block
      const long long a = s0 * kStageKeys, b = min(s1 * kStageKeys, N);
      for (int j = 0; j < nq; ++j) {
        float* row = out + (long long)(q0 + j) * N;
        for (long long i = t - 32; i < a; i += 96) row[i] = -INFINITY;
        for (long long i = b + (t - 32); i < N; i += 96) row[i] = -INFINITY;  // 96 fill threads
      }
    }
    return;
  }

  // consumers: warpgroup c = wg − 1 takes keys [64c, 64c + 64) of each stage
  const int c = wg - 1, tw = t & 127, warp = tw >> 5, lane = tw & 31, g = lane >> 2, qd = lane & 3;
  const uint32_t sq_addr = (uint32_t)__cvta_generic_to_shared(sq);
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
  if constexpr (PIPE) {
    // two halves per tile: steps 0, 1 from fresh accumulators, their sum; then steps 2, 3
    // into the same registers: 64 accumulator registers instead of 128, so a third consumer
    // warpgroup fits and keeps the tensor cores fed while the others add and weigh
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs) : "memory");
    if constexpr (PIPE == 2) {
      static_assert(QT % 2 == 0, "PIPE = 2 takes the query tiles in pairs");
      for (int it = 0; it < nst; ++it) {
        const Stage st = begin_stage(it);
        const uint64_t da = st.da;
        auto issue = [&](float (&x)[2][32], uint64_t db, int half) {
          fence();
          mma_m64n64k32_e4m3(x[0], da + 4 * half, db + 4 * half, 0);
          mma_m64n64k32_e4m3(x[1], da + 4 * half + 2, db + 4 * half + 2, 0);
          commit();
        };
#pragma unroll
        for (int qp = 0; qp < QT / 2; ++qp) {
          const int ta = 2 * qp, tb = ta + 1;
          const uint64_t dba = desc_sw128(sq_addr + ta * 8192);
          const uint64_t dbb = desc_sw128(sq_addr + tb * 8192);
          float xa[2][32], xb[2][32], acca[32], accb[32];
          issue(xa, dba, 0);
          issue(xb, dbb, 0);
          wait<1>();  // tile a, half 0
          add_half<64>(xa, acca, true);
          issue(xa, dba, 1);
          wait<1>();  // tile b, half 0
          add_half<64>(xb, accb, true);
          issue(xb, dbb, 1);
          wait<1>();  // tile a, half 1
          add_half<64>(xa, acca, false);
          epilogue<H>(acca, sw + ta * 64, qd, qrows + ta * QPT, st.r0, st.r1, st.a0, st.a1, N, out);
          wait<0>();  // tile b, half 1
          add_half<64>(xb, accb, false);
          if (qp == QT / 2 - 1) mbar_arrive(&empty[st.slot]);  // the stage's keys are read
          epilogue<H>(accb, sw + tb * 64, qd, qrows + tb * QPT, st.r0, st.r1, st.a0, st.a1, N, out);
        }
      }
    } else {
      for (int it = 0; it < nst; ++it) {
        const Stage st = begin_stage(it);
#pragma unroll
        for (int qt = 0; qt < QT; ++qt) {
          const uint64_t db = desc_sw128(sq_addr + qt * 8192);
          float x[2][32], acc[32];
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            pin(x[0]);
            pin(x[1]);
            fence();
            mma_m64n64k32_e4m3(x[0], st.da + 4 * half, db + 4 * half, 0);
            mma_m64n64k32_e4m3(x[1], st.da + 4 * half + 2, db + 4 * half + 2, 0);
            commit();
            wait<0>();
            add_half<64>(x, acc, half == 0);
          }
          if (qt == QT - 1) mbar_arrive(&empty[st.slot]);  // the stage's keys are read
          epilogue<H>(acc, sw + qt * 64, qd, qrows + qt * QPT, st.r0, st.r1, st.a0, st.a1, N,
                      out);
        }
      }
    }
  } else {
    for (int it = 0; it < nst; ++it) {
      const Stage st = begin_stage(it);
      const int slot = st.slot;
      const uint64_t da = st.da;
      const long long r0 = st.r0, r1 = st.r1;
      const float a0 = st.a0, a1 = st.a1;
#pragma unroll 1
      for (int qt = 0; qt < QT; ++qt) {
        constexpr int NX = FRESH ? 4 : 1;
        float x[NX][32];
        const uint64_t db = desc_sw128(sq_addr + qt * 8192);
#pragma unroll
        for (int s = 0; s < NX; ++s) pin(x[s]);
        fence();
#pragma unroll
        for (int s = 0; s < 4; ++s)
          mma_m64n64k32_e4m3(x[FRESH ? s : 0], da + 2 * s, db + 2 * s, FRESH ? 0 : (s > 0));
        commit();
        wait<0>();
#pragma unroll
        for (int s = 0; s < NX; ++s) pin(x[s]);
        if (qt == QT - 1) mbar_arrive(&empty[slot]);  // this stage's shared keys are read
        float acc[32];
#pragma unroll
        for (int e = 0; e < 32; ++e) {
          acc[e] = x[0][e];
#pragma unroll
          for (int s = 1; s < NX; ++s) acc[e] = acc[e] + x[s][e];  // the fresh steps in k order
        }
        epilogue<H>(acc, sw + qt * 64, qd, qrows + qt * QPT, r0, r1, a0, a1, N, out);
      }
    }
  }
}
}  // namespace fp8
}  // namespace dosa
#endif

#define DENSE_FP8_INST(H, QT, CWG, FRESH, PIPE, TAG)                                              \
  extern "C" __global__ void __launch_bounds__(dosa::fp8::threads<CWG>(), 1)                     \
      dense_fp8_h##H##_qt##QT##_w##CWG##_##TAG(                                                 \
          const __grid_constant__ dosa::TensorMap kmap, const uint8_t* __restrict__ q,          \
          const float* __restrict__ w, const float* __restrict__ alpha,                         \
          const int* __restrict__ ks, const int* __restrict__ ke, int Qn, long long N,          \
          float* __restrict__ out) {                                                            \
    DENSE_FP8_BODY(H, QT, CWG, FRESH, PIPE)                                                     \
  }
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DENSE_FP8_BODY(H, QT, CWG, FRESH, PIPE) \
  dosa::fp8::dense_fp8<H, QT, CWG, FRESH, PIPE>(kmap, q, w, alpha, ks, ke, Qn, N, out);
#else
#define DENSE_FP8_BODY(H, QT, CWG, FRESH, PIPE)
#endif
// fresh: the candidate canonical arithmetic; chained: timing variants
DENSE_FP8_INST(64, 4, 2, true, 0, fresh)
DENSE_FP8_INST(32, 4, 2, true, 0, fresh)
DENSE_FP8_INST(64, 4, 3, true, 1, half)
DENSE_FP8_INST(32, 4, 3, true, 1, half)
DENSE_FP8_INST(64, 4, 2, true, 1, half)
DENSE_FP8_INST(32, 4, 2, true, 1, half)
DENSE_FP8_INST(64, 4, 2, true, 2, pair)
DENSE_FP8_INST(32, 4, 2, true, 2, pair)
DENSE_FP8_INST(64, 4, 4, false, 0, chained)
DENSE_FP8_INST(32, 4, 4, false, 0, chained)
