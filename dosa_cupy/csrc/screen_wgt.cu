// The transposed Hopper screen (opt-in screen="wgt"; docs/method.md §8–§9, docs/records/
// notes.md "The FP8 scorer as a call's canonical scorer, session 16", item 1): the contract
// of screen_wg_mt1 (screen_sm90a.cu) — same parameters, same outputs, same keep rules — with
// the MMA turned around so that the epilogue costs fewer instructions per (query, key) pair.
//
// Orientation (as csrc/dense_fp8.cu): keys are the wgmma M operand (64 keys per warpgroup),
// the 16 plan rows of each of 8 queries the N operand (m64n128k16, f16, both operands K-major
// in 128-byte-swizzled shared memory; every e4m3 code converted exactly to f16).  The 128 dims
// run as 8 chained k16 steps in natural dim order, the first with scale-d = 0 (a fresh
// accumulator: the chain starts from nothing, i.e. from +0, and a zero accumulator term
// changes neither the alignment nor the sum of a step).  The dots need not equal the other
// screens' bits: only the f16 chain's error model (MMA_BITS = 17 bits per k16 step,
// plan.gamma_mma) enters the plan's allowance, and it does not depend on the order of the
// dims over the steps.
//
// Who holds what (ptx_sm90a.cuh acc_row / acc_col): lane (g = lane/4, qd = lane%4) of warp w
// holds M rows 16w + g (k = 0) and 16w + g + 8 (k = 1) and the columns 8j + 2qd + {0, 1},
// j = 0..15.  The N operand is laid out (stage_group, b_row) so that in slot s = 0..7 lane qd
// finds query u = s ^ 2qd: columns j = 2s hold its plan rows 2qd, 2qd + 1, j = 2s + 1 its plan
// rows 8 + 2qd, 9 + 2qd.  Every lane thus holds 4 rows of every query of the group (lane 3
// rows 6, 7, 14, 15: both aux rows, plan.py row_slots), and the lane-dependent query order
// lets the quad's reduce-scatter keep and send fixed slots, without selects.
//
// Û of one (key, query) (docs/method.md §9), in fp32 round-to-nearest:
//   lane chain  a = ω_a[x_a]_+ ; a = fmaf(ω_b, [x_b (+ x_15 on lane 3)]_+, a) ;
//               a = fmaf(ω_c, [x_c]_+, a) ; a = fmaf(ω_d, [x_d]_+, a)
//   (lane 3: ω_b = −σ_a on [x_7 + x_15]_+ and ω_d = 0 on row 15 — fmaf(0, y, a) = a exactly;
//   the other lanes add x_b + 0·x_d = x_b exactly), then the quad's reduce-scatter: two
//   additions (shfl_xor 2, then 1), after which lane qd owns queries 2qd, 2qd + 1 of both
//   keys.  Roundings on any term's path: ≤ 4 in the lane (the first row's product and three
//   fmaf; the aux row's sum, product and two fmaf) + 2 quad additions = 6 ≤ 2·mts + 6 = 8,
//   the depth proofs/gpu_screen_epilogue.py's argument (Higham's Lemma 3.1 over the rounding
//   factors of each term) grants and plan.py's g_scr = γ_mma + γ_8(1 + γ_mma) covers.
// Then ONE lane per (key, query) evaluates guard_bound_ru (epilogue.cuh) in fp64 and the keep
// rule (DOSA_KEEP; the tie-aware variant with common.cuh's zero-plateau test).
//
// Survivor words without shared memory: the key tile is stored permuted so that the 16 M rows
// of warp w in chunk c (c = 0, 1) of warpgroup v are the keys 128v + 32w + 16c + (0..15):
// warp w collects word 4v + w of the tile, bits 0..15 from chunk 0 and 16..31 from chunk 1
// (an OR-butterfly over the 8 lanes of a qd carries each query's 16 bits to every lane).
//
// Block: DOSA_WGT_GROUPS warpgroups, 128 keys each (tile = 128 · groups keys, converted to f16
// once per block); query groups of 8 (QG per block, any QG ≥ 1) are staged into one of two
// shared buffers while the other one feeds the MMAs.  Grid (ceil(N / tile), ceil(Qn / QG)).
// sm_90a only; every other target compiles this file to an empty module (NVRTC and nvcc).
#include "epilogue.cuh"
#include "ptx_sm90a.cuh"

#ifndef DOSA_WGT_GROUPS
#define DOSA_WGT_GROUPS 3  // warpgroups per block (one block per SM: 168 registers each)
#endif

namespace dosa {
namespace wgt {
constexpr int kGroups = DOSA_WGT_GROUPS;
constexpr int kThreads = 128 * kGroups;
constexpr int kTile = 128 * kGroups;       // keys per block (screen.WGT_TILE)
constexpr int kQ = 8;                      // queries per group (N = 8 · 16 plan rows)
constexpr int kKeyPanel = kTile * 128;     // bytes of one 64-dim panel of the key tile
constexpr int kRowPanel = 128 * 128;       // bytes of one 64-dim panel of a group's rows
// A query of a group as the epilogue reads it (staged once per group): its visible span
// [lo, hi) and its candidates [clo, clo + cw) — the visible keys past the sinks and before
// the local window, screen_wg's `vis && !seed` without the anchor-pool bit — as tile offsets,
// kj, its row t (−1: no query), the zero-plateau switch, τ (fp64), C, ε_raw.
struct QInfo {
  int lo, hi, clo, cw, kj, t, zp, pad;
  double tq, C, er;
};
// Dynamic shared memory (screen.wgt_smem_bytes mirrors it): the 1,024-byte alignment slack,
// the key tile (two panels), two row buffers (two panels each), α and ρ as fp64, per buffer
// the lanes' weights and plateau coefficients (float4 [8][4] each) and the QInfo [8], the
// anchor-pool words of the tile.
constexpr int kOffRows = 2 * kKeyPanel;
constexpr int kOffAlpha = kOffRows + 2 * 2 * kRowPanel;
constexpr int kOffRho = kOffAlpha + kTile * 8;
constexpr int kMetaBytes = 2 * kQ * 4 * 16 + kQ * (int)sizeof(QInfo);
constexpr int kOffMeta = kOffRho + kTile * 8;
constexpr int kOffPool = kOffMeta + 2 * kMetaBytes;
constexpr int kSmemBytes = 1024 + kOffPool + (kTile / 32) * 4;
static_assert(sizeof(QInfo) == 56, "QInfo: 56 bytes (screen.wgt_smem_bytes)");
}  // namespace wgt
}  // namespace dosa

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace dosa {
namespace wgt {
using namespace dosa::wg;

// 16 e4m3 codes (dims 16i .. 16i + 15 of one operand row) → f16 into row r of a 128-byte-
// swizzled K-major tile of two panels: dims 16i .. 16i + 7 are 16-byte chunk 2(i mod 4) of
// panel i / 4, dims 16i + 8 .. 16i + 15 chunk 2(i mod 4) + 1; chunk j sits at j ^ (r mod 8).
__device__ __forceinline__ void store_f16(uint8_t* tile, int panel, int r, int i, uint4 e) {
  const uint4 lo = make_uint4(f16x2_lo(e.x), f16x2_hi(e.x), f16x2_lo(e.y), f16x2_hi(e.y));
  const uint4 hi = make_uint4(f16x2_lo(e.z), f16x2_hi(e.z), f16x2_lo(e.w), f16x2_hi(e.w));
  uint8_t* row = tile + (i >> 2) * panel;
  const int j = 2 * (i & 3);
  *reinterpret_cast<uint4*>(row + sw128_offset(r, j)) = lo;
  *reinterpret_cast<uint4*>(row + sw128_offset(r, j + 1)) = hi;
}

// B row (N column) of plan row j of query u of the group: slot s = u ^ 2qd of lane
// qd = (j / 2) mod 4, column block 2s (+1 for rows 8..15), column 2qd + j mod 2 in the block.
__device__ __forceinline__ int b_row(int u, int j) {
  const int qd = (j >> 1) & 3;
  return 8 * (2 * (u ^ (2 * qd)) + (j >> 3)) + 2 * qd + (j & 1);
}

// Shared-memory row of tile key n: warpgroup v = n / 128, and within its 128 keys key
// 32w + 16c + j is row j of warp w of chunk c (the survivor-word layout, header).
__device__ __forceinline__ int key_row(int n) {
  const int v = n >> 7, w = (n >> 5) & 3, c = (n >> 4) & 1, j = n & 15;
  return 128 * v + 64 * c + 16 * w + j;
}

// The key tile [n0, n0 + kTile) as f16 (zero past N), all loads issued before the first use.
__device__ __forceinline__ void load_keys(const uint8_t* __restrict__ kp, long long N,
                                          long long n0, uint8_t* sk) {
  constexpr int kItems = kTile * 8 / kThreads;  // (key, 16-dim chunk) items per thread
  static_assert(kTile * 8 % kThreads == 0, "whole rounds");
  uint4 e[kItems];
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int it = threadIdx.x + kThreads * k, n = it >> 3, i = it & 7;
    e[k] = n0 + n < N ? __ldg(reinterpret_cast<const uint4*>(kp + (n0 + n) * DOSA_D + 16 * i))
                      : make_uint4(0u, 0u, 0u, 0u);
  }
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int it = threadIdx.x + kThreads * k;
    store_f16(sk, kKeyPanel, key_row(it >> 3), it & 7, e[k]);
  }
}

// The operands of the TIE variant (null / unused when TIE = false).
struct TieArgs {
  const int* __restrict__ kj;
  const float* __restrict__ zrow;
  unsigned int* __restrict__ tcnt;
};

// Stage query group t0 .. t0 + 7 (queries ≥ qend: zero rows, t = −1) into a buffer: its plan
// rows as f16 (B row 16u + j = plan row j of query u), per (query u, lane qd) the weights of
// the lane's rows {2qd, 2qd + 1, 8 + 2qd, 9 + 2qd} in the order of the lane's chain (lane 3:
// ω_6, −σ_a, ω_14, 0) and — TIE — their plateau coefficients (−1 everywhere where the plateau
// is off: no condition), and the QInfo of each query (screen_wg's per-query set-up).
template <bool TIE>
__device__ __forceinline__ void stage_group(
    int t0, int qend, uint8_t* srow, float4* sw, float4* sz, QInfo* sq,
    const uint8_t* __restrict__ rows, const float* __restrict__ om, const float* __restrict__ sig,
    const double* __restrict__ Cq, const double* __restrict__ eps_raw,
    const float* __restrict__ tau, const TieArgs& X, const int* __restrict__ ks_,
    const int* __restrict__ ke_, int sinks, int window, long long n0, int tile_n) {
  constexpr int kItems = (kQ * 16 * 8 + kThreads - 1) / kThreads;
  uint4 e[kItems];
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int it = threadIdx.x + kThreads * k, n = it >> 3, i = it & 7, t = t0 + (n >> 4);
    e[k] = make_uint4(0u, 0u, 0u, 0u);
    if (it < kQ * 16 * 8 && t < qend)
      e[k] = __ldg(reinterpret_cast<const uint4*>(rows + ((long long)t * 16 + (n & 15)) * DOSA_D + 16 * i));
  }
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int it = threadIdx.x + kThreads * k;
    if (it < kQ * 16 * 8) store_f16(srow, kRowPanel, b_row(it >> 7, (it >> 3) & 15), it & 7, e[k]);
  }
  const int tid = threadIdx.x;
  if (tid < kQ * 4) {  // (query u, lane qd): the lane's weights and plateau coefficients
    const int u = tid >> 2, qd = tid & 3, t = t0 + u;
    float4 w = make_float4(0.f, 0.f, 0.f, 0.f), z = make_float4(-1.f, -1.f, -1.f, -1.f);
    if (t < qend) {
      const float* o = om + (long long)t * 16;
      w = make_float4(o[2 * qd], o[2 * qd + 1], o[8 + 2 * qd], o[9 + 2 * qd]);
      if (qd == 3) w.y = -sig[t], w.w = 0.f;  // the aux rows 7, 15: −σ_a [x_7 + x_15]_+
      if constexpr (TIE) {
        // screen_wg's zero-plateau switch: row 0 of zrow not NaN and τ ≥ 0 (screen.cu)
        const float* zq = X.zrow + (long long)t * 16;
        if (zq[0] == zq[0] && tau[t] >= 0.f)
          z = make_float4(zq[2 * qd], zq[2 * qd + 1], zq[8 + 2 * qd], zq[9 + 2 * qd]);
      }
    }
    sw[4 * (u ^ (2 * qd)) + qd] = w;  // slot u ^ 2qd of lane qd (b_row)
    if constexpr (TIE) sz[4 * (u ^ (2 * qd)) + qd] = z;
  } else if (tid < kQ * 4 + kQ) {  // query u: screen_wg's spans, τ, kj, C, ε
    const int u = tid - kQ * 4, t = t0 + u;
    QInfo q{0, 0, 0, 0, kNoKthId, -1, 0, 0, 0.0, 0.0, 0.0};
    if (t < qend) {
      const int ks = ks_[t], ke = ke_[t];
      const long long lo = max((long long)ks, n0), hi = min((long long)ke, n0 + tile_n);
      q.lo = (int)(lo - n0);
      q.hi = (int)(max(hi, lo) - n0);
      const int ns = min(sinks, ke - ks);
      const long long s_hi = (long long)ks + ns, loc_lo = max(s_hi, (long long)ke - window);
      const int shi = (int)min(max(s_hi - n0, 0LL), (long long)kTile);
      const int llo = (int)min(max(loc_lo - n0, 0LL), (long long)kTile);
      q.clo = max(q.lo, shi);
      q.cw = max(min(q.hi, llo) - q.clo, 0);
      q.t = t;
      const float tq = tau[t];
      q.tq = (double)tq;
      if constexpr (TIE) {
        q.kj = X.kj[t];
        const float z0 = X.zrow[(long long)t * 16];
        q.zp = z0 == z0 && tq >= 0.f;
      }
      q.C = Cq[t];
      q.er = eps_raw[t];
    }
    sq[u] = q;
  }
}

// The 8 chained k16 steps of one chunk: 64 key rows (from row `a`'s byte address in panel 0)
// × the group's 128 plan rows (`b`), dims in natural order, step 0 with scale-d = 0.
__device__ __forceinline__ void issue_chunk(float (&d)[64], uint32_t a, uint32_t b) {
  fence();
#pragma unroll
  for (int s = 0; s < 8; ++s)
    mma_m64n128k16_ss(d, desc_sw128(a + (s >> 2) * kKeyPanel + (s & 3) * 32),
                      desc_sw128(b + (s >> 2) * kRowPanel + (s & 3) * 32), s > 0);
  commit();
}

// The quad's reduce-scatter: x[k][s] is the lane's partial sum of slot s (query s ^ 2qd,
// b_row) for key half k; afterwards z[k][e] is the quad's sum of query 2qd + e.  Lane qd
// keeps slots 0..3 and receives the partner qd ^ 2's slots 4..7 — the same queries, since
// (s + 4) ^ 2(qd ^ 2) = s ^ 2qd —, then keeps slots 0, 1 and receives qd ^ 1's slots 2, 3:
// two additions per value, fixed registers in every lane.
__device__ __forceinline__ void reduce_scatter(const float (&x)[2][kQ], float (&z)[2][2]) {
  float y[2][4];
#pragma unroll
  for (int k = 0; k < 2; ++k)
#pragma unroll
    for (int e = 0; e < 4; ++e) y[k][e] = x[k][e] + __shfl_xor_sync(0xffffffffu, x[k][e + 4], 2);
#pragma unroll
  for (int k = 0; k < 2; ++k)
#pragma unroll
    for (int e = 0; e < 2; ++e) z[k][e] = y[k][e] + __shfl_xor_sync(0xffffffffu, y[k][e + 2], 1);
}

// The per-thread state of a query group for the lane's two queries 2qd + e: their survivor
// words (bits of chunk c at 16c..16c+15, valid in every lane after the butterfly) and — TIE —
// the keys the strict rule keeps and the tie-aware rule rejects.  (Their QInfo stays in
// shared memory, read where used: registers are the kernel's budget.)
struct Lane {
  uint32_t word[2];
  unsigned int tie[2];
};

// The epilogue of chunk c of the calling warp: Û (header), the guard and the keep rule for
// the lane's keys 128v + 32w + 16c + g + 8k (k = 0, 1) and queries 2qd + e, U^num into Uout
// (visible keys) and the survivor bits into L.word.
template <bool TIE>
__device__ __forceinline__ void epilogue(const float (&d)[64], int c, const float4* sw,
                                         const float4* sz, const QInfo* sq, const double* dsa,
                                         const double* dsr,
                                         const uint32_t* spm, Lane& L, double eps_out,
                                         long long N, long long n0, double* __restrict__ Uout,
                                         int lane, int v, int w) {
  const int qd = lane & 3, g = lane >> 2;
  const float aux = qd == 3 ? 1.f : 0.f;  // lane 3: x_7 + x_15 (fmaf(1, ·)); others + 0·x
  const int i0 = 128 * v + 32 * w + 16 * c + g;  // tile offset of the lane's key k = 0
  float x[2][kQ];  // [key half][slot]
  // TIE: misses of the zero-plateau test (screen_wg's, on the raw dot of each of the lane's
  // rows; z = −1: no condition, every row of a query without the plateau), summed like Û
  // (small integers: exact) — in the same pass as Û, so each accumulator is read once
  float m[2][kQ];
  double rk[2] = {0.0, 0.0};
  if constexpr (TIE) rk[0] = dsr[i0], rk[1] = dsr[i0 + 8];
#pragma unroll
  for (int u = 0; u < kQ; ++u) {  // slot u: query u ^ 2qd
    const float4 W = sw[4 * u + qd];
    float4 Z = make_float4(-1.f, -1.f, -1.f, -1.f);
    if constexpr (TIE) Z = sz[4 * u + qd];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      // accumulator 4j + 2k + h: column 8j + 2qd + h, key half k; j = 2u: plan rows
      // 2qd + h, j = 2u + 1: plan rows 8 + 2qd + h
      const float* lo = d + 8 * u + 2 * k;
      const float* hi = d + 8 * u + 4 + 2 * k;
      float a = W.x * fmaxf(lo[0], 0.f);
      a = fmaf(W.y, fmaxf(fmaf(aux, hi[1], lo[1]), 0.f), a);
      a = fmaf(W.z, fmaxf(hi[0], 0.f), a);
      a = fmaf(W.w, fmaxf(hi[1], 0.f), a);
      x[k][u] = a;
      if constexpr (TIE)
        m[k][u] = plateau_miss(lo[0], Z.x, rk[k]) + plateau_miss(lo[1], Z.y, rk[k]) +
                  plateau_miss(hi[0], Z.z, rk[k]) + plateau_miss(hi[1], Z.w, rk[k]);
    }
  }
  float uh[2][2];
  reduce_scatter(x, uh);
  float plat[2][2] = {{1.f, 1.f}, {1.f, 1.f}};  // TIE: misses of the key's positive rows
  if constexpr (TIE) reduce_scatter(m, plat);
  uint32_t bits = 0u;  // bit 16e + g + 8k: key k of the lane kept for query 2qd + e
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int i = i0 + 8 * k;
    const double al = dsa[i], rh = dsr[i];
    const bool pool = (spm[4 * v + w] >> (16 * c + g + 8 * k)) & 1u;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const QInfo& Q = sq[2 * qd + e];
      const double U = guard_bound_ru(uh[k][e], rh, al, Q.C, Q.er, eps_out);
      if (Uout && i >= Q.lo && i < Q.hi) Uout[(long long)Q.t * N + n0 + i] = U;
      const bool cand = (unsigned)(i - Q.clo) < (unsigned)Q.cw && !pool;  // vis && !seed
      const bool plain = cand && !(U < Q.tq);
      const bool pl = TIE && Q.zp && plat[k][e] == 0.f;
      const bool p = DOSA_KEEP(TIE, plain, U, Q.tq, pl, n0 + i, Q.kj);
      bits |= (p ? 1u : 0u) << (16 * e + g + 8 * k);
      if constexpr (TIE) L.tie[e] += (plain && !p) ? 1u : 0u;
    }
  }
  // OR over the 8 lanes of this qd (lanes qd + 4g): every lane then holds, for its queries
  // 2qd + e, the 16 bits of the warp's keys 16c + 0..15 of its word
  bits |= __shfl_xor_sync(0xffffffffu, bits, 4);
  bits |= __shfl_xor_sync(0xffffffffu, bits, 8);
  bits |= __shfl_xor_sync(0xffffffffu, bits, 16);
  L.word[0] |= (bits & 0xffffu) << (16 * c);
  L.word[1] |= (bits >> 16) << (16 * c);
}

}  // namespace wgt
}  // namespace dosa
#endif

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// screen_wg_mt1's contract (screen_sm90a.cu, screen.cu "The keep rule"): for every query
// t < Qn of the block's QG and the block's key tile, the survivor words surv[t, ·] of the
// tile, U^num into Uout[t, i] for every visible key (where Uout is given), TIE: the keys the
// strict rule keeps and the tie-aware rule rejects added to tcnt[t] (where given).
template <bool TIE>
__device__ __forceinline__ void screen_wgt(SCREEN_WG_PARAMS_IN, const int* __restrict__ kj,
                                           const float* __restrict__ zrow, SCREEN_WG_PARAMS_KEYS,
                                           unsigned int* __restrict__ tcnt) {
  using namespace dosa;
  using namespace dosa::wg;
  using namespace dosa::wgt;
  extern __shared__ uint8_t smem_raw[];
  uint32_t dyn;  // the launch must give the layout below (screen.wgt_smem_bytes)
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
  if (dyn < (uint32_t)kSmemBytes) __trap();
  const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
  uint8_t* sm = smem_raw + ((1024u - (raw & 1023u)) & 1023u);
  uint8_t* sk = sm;
  double* dsa = reinterpret_cast<double*>(sm + kOffAlpha);
  double* dsr = reinterpret_cast<double*>(sm + kOffRho);
  uint32_t* spm = reinterpret_cast<uint32_t*>(sm + kOffPool);
  const TieArgs X{kj, zrow, tcnt};

  const long long n0 = (long long)blockIdx.x * kTile;
  const int tile_n = (int)min((long long)kTile, N - n0), nb = (tile_n + 31) >> 5;
  const long long NW = (N + 31) >> 5;
  const int q0 = blockIdx.y * QG, qend = min(Qn, q0 + QG);
  const int ngroups = (qend - q0 + kQ - 1) / kQ;  // the same for every thread of the block
  auto buffer = [&](int b, uint8_t*& r, float4*& w, float4*& z, QInfo*& q) {
    r = sm + kOffRows + b * 2 * kRowPanel;
    uint8_t* m = sm + kOffMeta + b * kMetaBytes;
    w = reinterpret_cast<float4*>(m);
    z = w + kQ * 4;
    q = reinterpret_cast<QInfo*>(z + kQ * 4);
  };

  load_keys(kp, N, n0, sk);
  for (int i = threadIdx.x; i < kTile; i += kThreads) {
    dsa[i] = n0 + i < N ? (double)__ldg(alpha + n0 + i) : 0.0;
    dsr[i] = n0 + i < N ? (double)__ldg(rho + n0 + i) : 0.0;
  }
  if (threadIdx.x < kTile / 32)
    spm[threadIdx.x] = n0 + 32 * threadIdx.x < N ? __ldg(poolmask + (n0 >> 5) + threadIdx.x) : 0u;
  if (ngroups > 0) {
    uint8_t* r;
    float4 *w, *z;
    QInfo* q;
    buffer(0, r, w, z, q);
    stage_group<TIE>(q0, qend, r, w, z, q, rows, om, sig, Cq, eps_raw, tau, X, ks_, ke_,
                     sinks, window, n0, tile_n);
  }
  // ordinary stores above, read by wgmma (the async proxy) below
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, w = warp & 3, v = warp >> 2;
  const int qd = lane & 3;
  const uint32_t sk_addr = (uint32_t)__cvta_generic_to_shared(sk);
#pragma unroll 1
  for (int gi = 0; gi < ngroups; ++gi) {
    const int b = gi & 1;
    uint8_t* srow;
    float4 *sw, *sz;
    QInfo* sq;
    buffer(b, srow, sw, sz, sq);
    const uint32_t rows_addr = (uint32_t)__cvta_generic_to_shared(srow);
    float acc[64];
    issue_chunk(acc, sk_addr + 128 * (128 * v) * 1, rows_addr);
    // the next group into the other buffer while the tensor cores work (its last readers
    // finished before the barrier that ended the previous group)
    if (gi + 1 < ngroups) {
      uint8_t* r;
      float4 *w2, *z2;
      QInfo* q2;
      buffer(b ^ 1, r, w2, z2, q2);
      stage_group<TIE>(q0 + kQ * (gi + 1), qend, r, w2, z2, q2, rows, om, sig, Cq, eps_raw,
                       tau, X, ks_, ke_, sinks, window, n0, tile_n);
    }
    Lane L;
    L.word[0] = L.word[1] = 0u;
    L.tie[0] = L.tie[1] = 0u;
    wait<0>();
    pin(acc);
    epilogue<TIE>(acc, 0, sw, sz, sq, dsa, dsr, spm, L, eps_out, N, n0, Uout, lane, v, w);
    issue_chunk(acc, sk_addr + 128 * (128 * v + 64), rows_addr);
    wait<0>();
    pin(acc);
    epilogue<TIE>(acc, 1, sw, sz, sq, dsa, dsr, spm, L, eps_out, N, n0, Uout, lane, v, w);
    // word 4v + w of the tile for the lane's queries 2qd + e (lanes 0..3 store)
    const int word = 4 * v + w;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int t = sq[2 * qd + e].t;
      if (lane < 4 && t >= 0 && word < nb) surv[(long long)t * NW + (n0 >> 5) + word] = L.word[e];
    }
    if constexpr (TIE) {
      if (tcnt != nullptr) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          unsigned int n = L.tie[e];
          n += __shfl_xor_sync(0xffffffffu, n, 4);
          n += __shfl_xor_sync(0xffffffffu, n, 8);
          n += __shfl_xor_sync(0xffffffffu, n, 16);
          const int t = sq[2 * qd + e].t;
          if (lane < 4 && n && t >= 0) atomicAdd(tcnt + t, n);
        }
      }
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
  }
}
#define DOSA_WGT_CALL(TIE, ...) screen_wgt<TIE>(__VA_ARGS__)
#else
#define DOSA_WGT_CALL(TIE, ...)
#endif

// The kernels: screen_wgt_mt1 (TIE = false) and screen_wgt_mt1_tie (kj and zrow after tau,
// tcnt after Uout) — screen_wg_mt1's parameter lists (screen.ScreenLaunch passes the same
// arguments).  Block dosa::wgt::kThreads, dynamic shared memory dosa::wgt::kSmemBytes.
extern "C" __global__ void __launch_bounds__(dosa::wgt::kThreads, 1)
screen_wgt_mt1(SCREEN_WG_PARAMS_IN, SCREEN_WG_PARAMS_KEYS) {
  DOSA_WGT_CALL(false, SCREEN_WG_ARGS_IN, nullptr, nullptr, SCREEN_WG_ARGS_KEYS, nullptr);
}
extern "C" __global__ void __launch_bounds__(dosa::wgt::kThreads, 1)
screen_wgt_mt1_tie(SCREEN_WG_PARAMS_IN, const int* __restrict__ kj,
                   const float* __restrict__ zrow, SCREEN_WG_PARAMS_KEYS,
                   unsigned int* __restrict__ tcnt) {
  DOSA_WGT_CALL(true, SCREEN_WG_ARGS_IN, kj, zrow, SCREEN_WG_ARGS_KEYS, tcnt);
}
