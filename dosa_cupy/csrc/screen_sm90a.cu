// Hopper screening (docs/method.md §8–§9): the screen of screen_mt1 / screen_mt2 with the
// head tiles' MMA issued as warpgroup MMA (wgmma, sm_90a) on an f16 key tile in swizzled
// shared memory, overlapped with the epilogue of the previous key chunk.  One build per
// plan width: DOSA_WG_MTS = 1 (r ≤ 14, m64n64k16, kernel screen_wg_mt1) or 2 (r ≤ 30, two
// m64n32k16 per k-step — one per 16-row tile of the query — kernel screen_wg_mt2).  Built by nvcc as an sm_90a cubin
// (dosa_cupy/sm90a.py) and loaded with cupy.RawModule; every other target compiles this
// file to an empty module (tests/test_cuda_build.py builds it for sm_90 and sm_90a).
//
// Same values as screen_mt1, bit for bit (docs/numerics.md "Warpgroup MMA"): the A operand
// is Scorer::Rows<1>'s register fragment (the m16n8k16 A layout, which is also wgmma's register-A
// layout), and the key tile stores every key's 128 dims in the canonical k-order of
// common.cuh, so wgmma step s' multiplies exactly the dims that mma.sync step s' does, in
// the same positions, chained from +0 in the same order s' = 0..7 (per tile).  The accumulator of a
// wgmma column chunk is laid out like four m16n8 accumulators per 32 keys (warp w holds rows
// 16w + g, 16w + g + 8), so the epilogue below is screen_impl's, per query = per warp.
#include "epilogue.cuh"
#include "ptx_sm90a.cuh"

#ifndef DOSA_TILE_N
#define DOSA_TILE_N 256
#endif

namespace dosa {
namespace wg {

#ifndef DOSA_WG_MTS
#define DOSA_WG_MTS 1  // 16-row head tiles per query (the plan's mts)
#endif
#ifndef DOSA_WG_GROUPS
#define DOSA_WG_GROUPS 3  // warpgroups per block (3: 12 warps per SM at ≤ 168 registers)
#endif
#ifndef DOSA_WG_MINB
#define DOSA_WG_MINB 1  // blocks per multiprocessor asked of the register allocator
#endif
#ifndef DOSA_WG_DIAG
// Diagnostic builds that give up exactness to time one part of the kernel (dosa bench
// --screen-variants reports them, never used by dosa_topk): 1 = no fp64 guard (U := Û), 2 =
// no epilogue, 3 = no MMA, 4 = no reduce8 (each lane keeps its own partial).
#define DOSA_WG_DIAG 0
#endif
constexpr int kTileN = DOSA_TILE_N;      // keys per block tile
constexpr int kMts = DOSA_WG_MTS;        // head tiles per query
// keys per wgmma: m64n64k16 for one tile; m64n32k16 for two (the same accumulator registers)
constexpr int kChunk = kMts == 1 ? 64 : 32;
constexpr int kAcc = kChunk / 2;         // fp32 accumulators per thread of one chunk
constexpr int kBatches = kChunk / 32;    // 32-key batches (bitmask words) per chunk
constexpr int kChunks = kTileN / kChunk;
constexpr int kThreads = 128 * DOSA_WG_GROUPS;
}  // namespace wg
}  // namespace dosa

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace dosa {
namespace wg {
static_assert(kTileN % kChunk == 0, "tile must be a multiple of the chunk");
static_assert(kMts == 1 || kMts == 2, "DOSA_WG_MTS: 1 or 2");

// Shared-memory layout of the key tile: two 128-byte-swizzled K-major panels (logical k
// 0..63 and 64..127), kTileN rows of 128 bytes each; then α, ρ and the anchor-pool words.
constexpr int kPanel = kTileN * 128;
constexpr int kKeyBytes = 2 * kPanel;

template <int N>
__device__ __forceinline__ void mma_chunk(float (&d)[N], uint32_t a0, uint32_t a1, uint32_t a2,
                                          uint32_t a3, uint64_t desc) {
  if constexpr (N == 32) mma_m64n64k16(d, a0, a1, a2, a3, desc);
  else mma_m64n32k16(d, a0, a1, a2, a3, desc);
}
// e4m3 keys [n0, n0 + kTileN) → f16 in the canonical k-order: logical position 16s' + κ of
// a key holds dim 32c + 4s' + e with (κ < 8: c = κ/2, e = κ%2; κ ≥ 8: c = (κ−8)/2,
// e = 2 + κ%2) — the dims mma.sync step s' feeds at k = κ (common.cuh).  Thread item
// (key n, step s'): the four e4m3 words at dims 32c + 4s' (c = 0..3) give logical
// 16s' + 0..7 (their low halves) and 16s' + 8..15 (high halves): two 16-byte chunks.
__device__ __forceinline__ void load_tile(const uint8_t* __restrict__ kp, long long N,
                                          long long n0, uint8_t* sk) {
  // (key, step) items, all loads issued before the first use; the last round may be partial
  // (kThreads need not divide kTileN · 8).
  constexpr int kItems = (kTileN * 8 + kThreads - 1) / kThreads;
  uint32_t w[kItems][4];
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int it = threadIdx.x + kThreads * k, n = it >> 3, sp = it & 7;
    const uint8_t* row = kp + (n0 + n) * DOSA_D + 4 * sp;
#pragma unroll
    for (int c = 0; c < 4; ++c)
      w[k][c] = (it < kTileN * 8 && n0 + n < N)
                    ? __ldg(reinterpret_cast<const uint32_t*>(row + 32 * c)) : 0u;
  }
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int it = threadIdx.x + kThreads * k, n = it >> 3, sp = it & 7;
    if (it >= kTileN * 8) break;
    const uint4 lo = make_uint4(f16x2_lo(w[k][0]), f16x2_lo(w[k][1]), f16x2_lo(w[k][2]), f16x2_lo(w[k][3]));
    const uint4 hi = make_uint4(f16x2_hi(w[k][0]), f16x2_hi(w[k][1]), f16x2_hi(w[k][2]), f16x2_hi(w[k][3]));
    // Logical chunk j = 2(s' mod 4) (+1) of panel s'/4; 128-byte swizzle: j ^ (n mod 8).
    uint8_t* prow = sk + (sp >> 2) * kPanel + n * 128;
    const int j = 2 * (sp & 3), x = n & 7;
    *reinterpret_cast<uint4*>(prow + ((j ^ x) << 4)) = lo;
    *reinterpret_cast<uint4*>(prow + (((j + 1) ^ x) << 4)) = hi;
  }
}

// The 8 chained k16 steps of one key chunk for the warpgroup's 64 rows, per head tile mt
// (each tile's chain runs s' = 0..7 from +0 in its own accumulator, as mma_batch's does).
__device__ __forceinline__ void issue_chunk(float (&d)[kMts][kAcc], const Scorer::Rows<kMts>& A,
                                            uint32_t sk_addr, int chunk) {
#pragma unroll
  for (int mt = 0; mt < kMts; ++mt)
#pragma unroll
    for (int i = 0; i < kAcc; ++i) d[mt][i] = 0.f;
  pin(d);
  // An opaque copy of the tile address: the 8 · kChunks descriptors are recomputed (two
  // integer adds each) instead of being hoisted out of the query loop into 64-bit registers.
  uint32_t base;
  asm volatile("mov.b32 %0, %1;" : "=r"(base) : "r"(sk_addr + chunk * kChunk * 128));
  const uint64_t desc0 = desc_sw128(base);
  fence();
#pragma unroll
  for (int sp = 0; sp < 8; ++sp) {
    // + (byte offset >> 4) in the start-address field (no carry: the tile is < 256 KB)
    const uint32_t off = (sp >> 2) * kPanel + (sp & 3) * 32;
#pragma unroll
    for (int mt = 0; mt < kMts; ++mt) {
      uint32_t a0, a1, a2, a3;
      A.frag(mt, sp, a0, a1, a2, a3);
      if (DOSA_WG_DIAG != 3) mma_chunk(d[mt], a0, a1, a2, a3, desc0 + (uint64_t)(off >> 4));
    }
  }
  commit();
}


// The calling warp's tie-rejected counter of its current query (TIE, stats only; lane 0
// writes).
__device__ __forceinline__ unsigned int* tie_slot() {
  __shared__ unsigned int s_tie[kThreads / 32];
  return s_tie + (threadIdx.x >> 5);
}

// Per-query constants of the screen (screen_impl's, for one 16-row tile): spans as offsets
// in the tile, the weights of the lane's two rows, and the guard's constants.
struct Query {
  int lo_i, hi_i, shi_i, llo_i;  // visible span, sink end, local-window start (tile offsets)
  int kj;                        // TIE: id j of the K-th seed record (τ, j)
  float wlo, whi, tq;            // last tile: weights of rows g / g + 8 (aux lane: −σ_a, 0); τ
  float w0lo, w0hi;              // the first of two tiles: weights of rows g / g + 8
  // TIE, zero plateau (warp-uniform): −1 when off, else the offset of row g's coefficient in
  // zrow (rows g / g + 8 read there when needed: registers are the kernel's budget)
  int zoff;
  float aux_add;                 // 1 on the aux lane g = 7 (rows 7 + 15 summed), else 0
  double C, er, eo;
};

// The key tile's per-key operands of the guard: α and ρ as fp32 and as fp64 (converted
// exactly once per tile instead of once per query), and the anchor-pool words.
struct TileKeys {
  const float* sa;
  const float* sr;
  const double* dsa;
  const double* dsr;
  const uint32_t* spm;
};

// The operands of the TIE variant (docs/method.md §7 "Tie-aware rejection and zero
// plateaus"): the plateau coefficients and the tie-rejected counters (null when TIE = false).
struct TieArgs {
  const float* __restrict__ zrow;
  unsigned int* __restrict__ tcnt;
};

// screen_impl's epilogue for NB consecutive batches bb0 .. bb0 + NB − 1 of a chunk (b0 = the
// first one's index in the tile), written as NB independent chains so that their shuffles
// and fp64 latencies overlap: Û per key (fmaf chain of the lane's rows, reduce8), U^num in
// fp64 rounded up, the keep rule of the TIE variant (screen.cu DOSA_KEEP) and each batch's
// survivor word (kept by lane b); with TIE and tcnt (stats) the warp's shared slot
// tie_slot() counts the keys the strict rule keeps and the tie-aware rule rejects (in shared
// memory: no register for it).
template <bool TIE, int NB>
__device__ __forceinline__ void epilogue(const float (&d)[kMts][kAcc], int bb0, int b0, const Query& Q,
                                         const TileKeys& K, long long tN, long long n0,
                                         double* __restrict__ Uout, const TieArgs& X, int lane,
                                         uint32_t& myword) {
  float x[NB][8];
#pragma unroll
  for (int k = 0; k < NB; ++k)
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      float a0 = 0.f, a1 = 0.f;
      if constexpr (kMts == 2)  // screen_impl's tile 0: both rows weighed by their ω
        weigh_tile(d[0] + 4 * (4 * (bb0 + k) + u), Q.w0lo, Q.w0hi, a0, a1);
      weigh_last_tile(d[kMts - 1] + 4 * (4 * (bb0 + k) + u), Q.wlo, Q.whi, Q.aux_add, a0, a1);
      x[k][2 * u] = a0;
      x[k][2 * u + 1] = a1;
    }
  float uh[NB];
#pragma unroll
  for (int k = 0; k < NB; ++k) uh[k] = DOSA_WG_DIAG == 4 ? x[k][0] : reduce8(x[k], lane);
  const int pos = batch_pos(lane), c4 = lane & 3;
#pragma unroll
  for (int k = 0; k < NB; ++k) {
    const int b = b0 + k, i = b * 32 + pos;
    bool plat = false;  // TIE: screen_impl's zero-plateau test (every positive row inactive)
    if constexpr (TIE) {
      if (Q.zoff >= 0) {
        float miss[8];
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
          for (int v = 0; v < 2; ++v) {
            const double rk = K.dsr[b * 32 + 8 * u + 2 * c4 + v];
            float m = 0.f;
#pragma unroll
            for (int mt = 0; mt < kMts; ++mt) {  // rows g, g + 8 of tile mt (zrow: 16 per tile)
              const float* c = d[mt] + 4 * (4 * (bb0 + k) + u);
              const float zlo = __ldg(X.zrow + Q.zoff + 16 * mt);
              const float zhi = __ldg(X.zrow + Q.zoff + 16 * mt + 8);
              m += plateau_miss(c[v], zlo, rk) + plateau_miss(c[2 + v], zhi, rk);
            }
            miss[2 * u + v] = m;
          }
        plat = reduce8(miss, lane) == 0.f;  // small integers: exact
      }
    }
    const bool vis = i >= Q.lo_i && i < Q.hi_i;
    const bool seed = i < Q.shi_i || i >= Q.llo_i || ((K.spm[b] >> pos) & 1u);
#if DOSA_WG_DIAG == 1
    const bool plain = vis && !seed && !(uh[k] < Q.tq), p = plain;
#else
    const double U = guard_bound_ru(uh[k], K.dsr[i], K.dsa[i], Q.C, Q.er, Q.eo);
    if (Uout && vis) Uout[tN + n0 + i] = U;
    const bool plain = vis && !seed && !(U < (double)Q.tq);
    const bool p = DOSA_KEEP(TIE, plain, U, Q.tq, plat, n0 + i, Q.kj);
#endif
    const uint32_t word = __reduce_or_sync(0xffffffffu, p ? (1u << pos) : 0u);
    if (lane == b) myword = word;
    if constexpr (TIE) {
      if (X.tcnt != nullptr) {
        const unsigned int n = __popc(__ballot_sync(0xffffffffu, plain && !p));
        if (lane == 0) *tie_slot() += n;
      }
    }
  }
}

// One chunk step of the ping-pong: issue chunk c + 1 into `nxt` (unless c is the last),
// wait for chunk c in `cur`, run its epilogue while the tensor cores work on c + 1.  The
// epilogue runs for every batch of every warp, whatever its query sees (a key outside the
// visible span only clears its bit): no branch between a wgmma and its wait, so ptxas does
// not serialize the wgmma behind a divergent path (its warning C7518).
template <bool TIE, int C>
__device__ __forceinline__ void chunk_step(float (&cur)[kMts][kAcc], float (&nxt)[kMts][kAcc], const Scorer::Rows<kMts>& A,
                                           uint32_t sk_addr, const Query& Q, const TileKeys& K,
                                           long long tN, long long n0, double* __restrict__ Uout,
                                           const TieArgs& X, int lane, uint32_t& myword) {
  if constexpr (C + 1 < kChunks) {
    issue_chunk(nxt, A, sk_addr, C + 1);
    wait<1>();
  } else {
    wait<0>();
  }
  pin(cur);
  if constexpr (DOSA_WG_DIAG != 2)
    epilogue<TIE, kBatches>(cur, 0, kBatches * C, Q, K, tN, n0, Uout, X, lane, myword);
}

template <bool TIE, int C>
__device__ __forceinline__ void chunks(float (&a)[kMts][kAcc], float (&b)[kMts][kAcc], const Scorer::Rows<kMts>& A,
                                       uint32_t sk_addr, const Query& Q, const TileKeys& K,
                                       long long tN, long long n0, double* __restrict__ Uout,
                                       const TieArgs& X, int lane, uint32_t& myword) {
  if constexpr (C < kChunks) {
    chunk_step<TIE, C>(a, b, A, sk_addr, Q, K, tN, n0, Uout, X, lane, myword);
    chunks<TIE, C + 1>(b, a, A, sk_addr, Q, K, tN, n0, Uout, X, lane, myword);
  }
}

__device__ __forceinline__ uint8_t* align1024(uint8_t* p) {
  const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
  return p + ((1024u - (a & 1023u)) & 1023u);
}

}  // namespace wg
}  // namespace dosa
#endif

#define DOSA_WG_CAT2(a, b) a##b
#define DOSA_WG_CAT(a, b) DOSA_WG_CAT2(a, b)
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// screen_mt1's / screen_mt2's contract (screen.cu) as screen_wg_mt1 / screen_wg_mt2 (the
// DOSA_WG_MTS of the build) and their TIE variants screen_wg_mt*_tie: arguments, grid
// (ceil(N / DOSA_TILE_N), ceil(Qn / QG)), outputs (the survivor words of every query t < Qn
// for the block's tile; U^num in Uout where given; with TIE, tie-rejected counts in tcnt
// where given).  Block: warpgroups of 4 warps; a warpgroup screens 4 queries at a time (one
// per warp, rows 16w..16w+15 of its wgmma), QG a multiple of 4.
// sk: the kernel's dynamic shared memory aligned to the 1,024-byte swizzle atom (computed in
// the kernel itself, which keeps its address arithmetic that of a kernel body).
template <bool TIE>
__device__ __forceinline__ void screen_wg(uint8_t* sk, SCREEN_WG_PARAMS_IN,
                                          const int* __restrict__ kj,
                                          const float* __restrict__ zrow, SCREEN_WG_PARAMS_KEYS,
                                          unsigned int* __restrict__ tcnt) {
  using namespace dosa;
  using namespace dosa::wg;
  double* dsa = reinterpret_cast<double*>(sk + kKeyBytes);
  double* dsr = dsa + kTileN;
  float* sa = reinterpret_cast<float*>(dsr + kTileN);
  float* sr = sa + kTileN;
  uint32_t* spm = reinterpret_cast<uint32_t*>(sr + kTileN);
  const long long n0 = (long long)blockIdx.x * kTileN;
  load_tile(kp, N, n0, sk);
  for (int i = threadIdx.x; i < kTileN; i += blockDim.x) {
    sa[i] = (n0 + i < N) ? __ldg(alpha + n0 + i) : 0.f;
    sr[i] = (n0 + i < N) ? __ldg(rho + n0 + i) : 0.f;
    dsa[i] = (double)sa[i];
    dsr[i] = (double)sr[i];
  }
  const TileKeys K{sa, sr, dsa, dsr, spm};
  if (threadIdx.x < kTileN / 32)
    spm[threadIdx.x] = (n0 + 32 * threadIdx.x < N) ? __ldg(poolmask + (n0 >> 5) + threadIdx.x) : 0u;
  // The tile is written by ordinary stores and read by wgmma (the async proxy).
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  const uint32_t sk_addr = (uint32_t)__cvta_generic_to_shared(sk);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wq = warp & 3;
  const int wgi = warp >> 2, nwg = blockDim.x >> 7, g = lane >> 2;
  const long long NW = (N + 31) >> 5;
  const int tile_n = (int)min((long long)kTileN, N - n0), nb = (tile_n + 31) >> 5;
  const int qend = min(Qn, (int)(blockIdx.y + 1) * QG);
  for (int t0 = blockIdx.y * QG + 4 * wgi; t0 < qend; t0 += 4 * nwg) {
    // Branch-free per warp: a warp past the block's last query screens that query again
    // (valid rows for its share of the wgmma) with an empty span and writes nothing.
    const int t = t0 + wq;
    const bool live = t < qend;
    const int tl = live ? t : qend - 1;
    const int ks = ks_[tl], ke = ke_[tl];
    const long long lo = max((long long)ks, n0), hi = min((long long)ke, n0 + tile_n);
    Query Q;
    Q.lo_i = live ? (int)(lo - n0) : 0;
    Q.hi_i = live ? (int)(max(hi, lo) - n0) : 0;
    const int ns = min(sinks, ke - ks);
    const long long s_hi = (long long)ks + ns, loc_lo = max(s_hi, (long long)ke - window);
    Q.shi_i = (int)min(max(s_hi - n0, 0LL), (long long)kTileN);
    Q.llo_i = (int)min(max(loc_lo - n0, 0LL), (long long)kTileN);
    Scorer::Rows<kMts> A;
    A.load(rows + (long long)tl * (16 * kMts) * DOSA_D, lane);
    const bool aux_lane = g == 7;  // rows 7 and 15 of the last tile: the two aux rows
    const float sg = sig[tl];
    const float* oq = om + (long long)tl * (16 * kMts);
    Q.wlo = aux_lane ? -sg : __ldg(oq + 16 * (kMts - 1) + g);
    Q.whi = aux_lane ? 0.f : __ldg(oq + 16 * (kMts - 1) + g + 8);
    Q.w0lo = __ldg(oq + g);
    Q.w0hi = __ldg(oq + g + 8);
    Q.aux_add = aux_lane ? 1.f : 0.f;
    Q.tq = tau[tl];
    if constexpr (TIE) {
      Q.kj = kj[tl];
      // Zero plateau (screen_impl): rows g, g + 8 of the query's zrow (−1 on the aux lane).
      const float z0 = zrow[(long long)tl * (16 * kMts)];
      const bool zp = z0 == z0 && Q.tq >= 0.f;
      Q.zoff = zp ? tl * (16 * kMts) + g : -1;
    }
    Q.C = Cq[tl];
    Q.er = eps_raw[tl];
    Q.eo = eps_out;
    uint32_t myword = 0u;
    if constexpr (TIE) {
      if (tcnt != nullptr && lane == 0) *tie_slot() = 0u;
    }
    float acc0[kMts][kAcc], acc1[kMts][kAcc];
    issue_chunk(acc0, A, sk_addr, 0);
    const TieArgs X{zrow, tcnt};
    chunks<TIE, 0>(acc0, acc1, A, sk_addr, Q, K, (long long)tl * N, n0, Uout, X, lane, myword);
    if (live && lane < nb) surv[(long long)t * NW + (n0 >> 5) + lane] = myword;
    if constexpr (TIE) {
      if (live && tcnt != nullptr && lane == 0 && *tie_slot()) atomicAdd(tcnt + t, *tie_slot());
    }
  }
}
#define DOSA_WG_CALL(TIE, ...)               \
  extern __shared__ uint8_t smem_raw[];      \
  screen_wg<TIE>(dosa::wg::align1024(smem_raw), __VA_ARGS__)
#else
#define DOSA_WG_CALL(TIE, ...)
#endif

// The kernels (TIE = false: screen_wg_mt<MTS>; TIE = true: screen_wg_mt<MTS>_tie, with kj
// and zrow after tau and tcnt after Uout).
extern "C" __global__ void __launch_bounds__(dosa::wg::kThreads, DOSA_WG_MINB)
DOSA_WG_CAT(screen_wg_mt, DOSA_WG_MTS)(SCREEN_WG_PARAMS_IN, SCREEN_WG_PARAMS_KEYS) {
  DOSA_WG_CALL(false, SCREEN_WG_ARGS_IN, nullptr, nullptr, SCREEN_WG_ARGS_KEYS, nullptr);
}
extern "C" __global__ void __launch_bounds__(dosa::wg::kThreads, DOSA_WG_MINB)
DOSA_WG_CAT(DOSA_WG_CAT(screen_wg_mt, DOSA_WG_MTS), _tie)(
    SCREEN_WG_PARAMS_IN, const int* __restrict__ kj, const float* __restrict__ zrow,
    SCREEN_WG_PARAMS_KEYS, unsigned int* __restrict__ tcnt) {
  DOSA_WG_CALL(true, SCREEN_WG_ARGS_IN, kj, zrow, SCREEN_WG_ARGS_KEYS, tcnt);
}

// Accumulator probe (tests/test_gpu_sm90a.py, docs/numerics.md "Warpgroup MMA"): for kThreads/2
// e4m3 rows [kThreads / 2, 128] and kTileN e4m3 keys [kTileN, 128], the raw fp32 accumulators of the
// canonical chain (8 k16 steps from +0, Scorer::Rows<1> fragments) computed once by wgmma on the
// swizzled key tile and once by mma.sync on keys gathered from global memory:
// out_wg[row, key], out_mma[row, key].  One block of kThreads; warp w owns rows 16w..16w+15.
#if DOSA_WG_MTS == 1
extern "C" __global__ void __launch_bounds__(dosa::wg::kThreads, 1) wg_probe_mma(
    const uint8_t* __restrict__ rows, const uint8_t* __restrict__ keys, float* __restrict__ out_wg,
    float* __restrict__ out_mma) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace dosa;
  using namespace dosa::wg;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* sk = align1024(smem_raw);
  load_tile(keys, kTileN, 0, sk);
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  const uint32_t sk_addr = (uint32_t)__cvta_generic_to_shared(sk);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2;
  Scorer::Rows<1> A;
  A.load(rows + (long long)warp * 16 * DOSA_D, lane);
  float acc[1][kAcc];
#pragma unroll
  for (int ch = 0; ch < kChunks; ++ch) {
    issue_chunk(acc, A, sk_addr, ch);
    wait<0>();
    pin(acc);
#pragma unroll
    for (int j = 0; j < kChunk / 8; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int row = acc_row(warp, lane, r), col = ch * kChunk + acc_col(lane, j, r);
        out_wg[row * kTileN + col] = acc[0][4 * j + r];
      }
  }
  for (int b = 0; b < kTileN / 32; ++b) {
    const int my[4] = {32 * b + g, 32 * b + 8 + g, 32 * b + 16 + g, 32 * b + 24 + g};
    KeysReg K;
    gather_keys(keys, my, lane, K);
    float C[4][1][4];
    Scorer::mma<1>(A, K, lane, C);
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        // the m16n8 accumulator of group u is laid out as wgmma's column chunk j = u
        const int row = acc_row(warp, lane, r), col = 32 * b + acc_col(lane, u, r);
        out_mma[row * kTileN + col] = C[u][0][r];
      }
  }
#endif
}
#endif  // DOSA_WG_MTS == 1
