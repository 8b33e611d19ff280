// DoSA kernels (docs/method.md §7–§9): prepare, dense logits, seed scoring, screening,
// refinement with compact writeback, exact selection.  Built by CuPy (RawModule, plain
// sm_90; CuPy appends -ftz=true) and, in CI, by nvcc -arch=sm_90 (tests/test_cuda_build.py).
// Every score goes through dosa::score_batch (common.cuh): one arithmetic for every route.
#include <cuda_fp8.h>

#include "common.cuh"

#ifdef DOSA_TILE_N
#define TILE_N DOSA_TILE_N  // keys per block tile (dense logits, fused route, screening)
#else
#define TILE_N 128
#endif
#define NEG_INF __int_as_float(0xff800000)

using namespace dosa;

// ---------------------------------------------------------------------------------------
// Prepare (docs/method.md §8): e4m3 payload + fp32 scale per token, and the RMS summary ρ.
// ---------------------------------------------------------------------------------------

// Conservative RMS summary: ρ ≥ ‖k̄‖/√D, rounded up to fp32.  Squares of e4m3 values are
// multiples of 2^-18 below 2^18 and 128 of them sum exactly in fp64; sqrt/div round up.
__device__ __forceinline__ double e4m3_value(uint32_t b) {
  const uint32_t e = (b >> 3) & 15u, m = b & 7u;
  double v = e ? ldexp((double)(8u + m), (int)e - 10) : ldexp((double)m, -9);
  return (b & 0x80u) ? -v : v;
}

__device__ __forceinline__ float rho_of_sumsq(double ss) {
  return __double2float_ru(__dsqrt_ru(__ddiv_ru(ss, (double)DOSA_D)));
}

// One warp per token; lane holds 4 coordinates.  fmt 0: s = max(amax, 1e-4)/448 (fp32
// division); fmt 1: s = 2^ceil(log2(max(amax, 1e-4)/448)) (ue8m0).  Payload =
// e4m3_satfinite_rn(x / s) (fp32 division).  Mirrors dosa_cupy.emulate.quantize_keys.
extern "C" __global__ void quantize_keys_kernel(const float* __restrict__ k, long long N, int fmt,
                                                uint8_t* __restrict__ payload,
                                                float* __restrict__ scale,
                                                float* __restrict__ rho) {
  const int lane = threadIdx.x & 31;
  const long long tok = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (tok >= N) return;
  float4 x = reinterpret_cast<const float4*>(k + tok * DOSA_D)[lane];
  float amax = fmaxf(fmaxf(fabsf(x.x), fabsf(x.y)), fmaxf(fabsf(x.z), fabsf(x.w)));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  amax = fmaxf(amax, 1e-4f);
  float s = amax / 448.f;
  if (fmt == 1) {
    int e;
    float m = frexpf(s, &e);  // s = m 2^e, m in [0.5, 1)
    s = ldexpf(1.f, m == 0.5f ? e - 1 : e);
  }
  uint32_t b0 = __nv_cvt_float_to_fp8(x.x / s, __NV_SATFINITE, __NV_E4M3);
  uint32_t b1 = __nv_cvt_float_to_fp8(x.y / s, __NV_SATFINITE, __NV_E4M3);
  uint32_t b2 = __nv_cvt_float_to_fp8(x.z / s, __NV_SATFINITE, __NV_E4M3);
  uint32_t b3 = __nv_cvt_float_to_fp8(x.w / s, __NV_SATFINITE, __NV_E4M3);
  reinterpret_cast<uint32_t*>(payload + tok * DOSA_D)[lane] = b0 | (b1 << 8) | (b2 << 16) | (b3 << 24);
  double ss = 0.0;
  ss += e4m3_value(b0) * e4m3_value(b0);
  ss += e4m3_value(b1) * e4m3_value(b1);
  ss += e4m3_value(b2) * e4m3_value(b2);
  ss += e4m3_value(b3) * e4m3_value(b3);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (lane == 0) {
    scale[tok] = s;
    rho[tok] = rho_of_sumsq(ss);
  }
}

// ρ of given payloads (dosa_topk takes quantized keys).
extern "C" __global__ void key_rho_kernel(const uint8_t* __restrict__ payload, long long N,
                                          float* __restrict__ rho) {
  const int lane = threadIdx.x & 31;
  const long long tok = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (tok >= N) return;
  uint32_t v = reinterpret_cast<const uint32_t*>(payload + tok * DOSA_D)[lane];
  double ss = 0.0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    double e = e4m3_value((v >> (8 * i)) & 0xffu);
    ss += e * e;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (lane == 0) rho[tok] = rho_of_sumsq(ss);
}

// ---------------------------------------------------------------------------------------
// Key tiles in shared memory (dense logits and screening).
// ---------------------------------------------------------------------------------------
__device__ __forceinline__ void load_key_tile(const uint8_t* __restrict__ kp,
                                              const float* __restrict__ alpha, long long N,
                                              long long n0, uint8_t* sk, float* sa) {
  // e4m3 → f16 once per tile (reused by every query of the block); layout: see KeysSmem.
  for (int i = threadIdx.x; i < TILE_N * 8; i += blockDim.x) {
    const int r = i >> 3, m = i & 7, c = m >> 1, j = 2 * (m & 1);
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (n0 + r < N) v = __ldg(reinterpret_cast<const uint4*>(kp + (n0 + r) * DOSA_D) + m);
    uint8_t* row = sk + r * ROWH + c * 16;
    *reinterpret_cast<uint4*>(row + j * 64) = make_uint4(f16x2_lo(v.x), f16x2_hi(v.x), f16x2_lo(v.y), f16x2_hi(v.y));
    *reinterpret_cast<uint4*>(row + (j + 1) * 64) = make_uint4(f16x2_lo(v.z), f16x2_hi(v.z), f16x2_lo(v.w), f16x2_hi(v.w));
  }
  for (int i = threadIdx.x; i < TILE_N; i += blockDim.x) sa[i] = (n0 + i < N) ? __ldg(alpha + n0 + i) : 0.f;
}

// gather_keys (key fragments of 32 arbitrary keys): common.cuh.

// ---------------------------------------------------------------------------------------
// Dense logits (the canonical original scorer over every visible key; docs/method.md §1).
// out[t, i] = score for i ∈ [ks[t], ke[t]), −inf elsewhere.  grid (N/TILE_N, Qn/QG).
// ---------------------------------------------------------------------------------------
template <int MT>
__device__ void dense_logits_impl(const uint8_t* __restrict__ q, const float* __restrict__ w,
                                  const uint8_t* __restrict__ kp, const float* __restrict__ alpha,
                                  const int* __restrict__ ks, const int* __restrict__ ke, int Qn,
                                  long long N, int QG, float* __restrict__ out) {
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* sk = smem;
  float* sa = reinterpret_cast<float*>(smem + TILE_N * ROWH);
  const long long n0 = (long long)blockIdx.x * TILE_N;
  load_key_tile(kp, alpha, N, n0, sk, sa);
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int pos = batch_pos(lane);
  const int tend = min(Qn, (int)(blockIdx.y + 1) * QG);
  const int tile_n = (int)min((long long)TILE_N, N - n0);
  for (int t = blockIdx.y * QG + warp; t < tend; t += nw) {
    const long long lo = max((long long)ks[t], n0), hi = min((long long)ke[t], n0 + tile_n);
    float* orow = out + (long long)t * N + n0;
    if (lo >= hi) {
      for (int i = lane; i < tile_n; i += 32) orow[i] = NEG_INF;
      continue;
    }
    QRows<MT> A;
    float wlo[MT], whi[MT];
    A.load(q + (long long)t * (MT * 16) * DOSA_D, lane);
    load_weights<MT>(w + (long long)t * (MT * 16), wlo, whi, lane);
    const int blo = (int)((lo - n0) >> 5), bhi = (int)((hi - n0 + 31) >> 5);
    for (int b = 0; b < TILE_N / 32; ++b) {
      const int i = b * 32 + pos;
      float v = NEG_INF;
      if (b >= blo && b < bhi) {
        const float sc = score_batch<MT>(A, KeysSmem{sk + b * 32 * ROWH}, wlo, whi, lane);
        if (n0 + i >= lo && n0 + i < hi) v = sc * sa[i];
      }
      if (i < tile_n) orow[i] = v;
    }
  }
}

#define DENSE_INST(MT)                                                                        \
  extern "C" __global__ void __launch_bounds__(256) dense_logits_mt##MT(                       \
      const uint8_t* q, const float* w, const uint8_t* kp, const float* alpha, const int* ks, \
      const int* ke, int Qn, long long N, int QG, float* out) {                               \
    dense_logits_impl<MT>(q, w, kp, alpha, ks, ke, Qn, N, QG, out);                           \
  }
DENSE_INST(1)
DENSE_INST(2)
DENSE_INST(3)
DENSE_INST(4)

// ---------------------------------------------------------------------------------------
// Score a batch of 32 arbitrary keys (ids, −1 = empty) for one query and append the
// records with s ≥ τ to the query's buffer (compact writeback, docs/method.md §9).  my[u] =
// id of key g of group u (this lane loads it); id = the key at batch_pos(lane).  The
// counter counts every qualifying record, so a full buffer is detected (count > cap) and
// nothing is silently lost.
// ---------------------------------------------------------------------------------------
template <int MT>
__device__ __forceinline__ void score_ids_and_emit(const QRows<MT>& A, const float (&wlo)[MT],
                                                   const float (&whi)[MT],
                                                   const uint8_t* __restrict__ kp,
                                                   const float* __restrict__ alpha,
                                                   const int (&my)[4], int id, float tau, int lane,
                                                   unsigned int* count, unsigned long long* rec,
                                                   long long cap) {
  KeysReg B;
  gather_keys(kp, my, lane, B);
  float s = score_batch<MT>(A, B, wlo, whi, lane);
  s = (id >= 0) ? s * __ldg(alpha + id) : 0.f;
  warp_emit(id >= 0 && s >= tau, s, id, lane, count, rec, cap);
}

// ---------------------------------------------------------------------------------------
// Fused route (what LiteTopK does; issue 5): full-head scoring of every visible non-seed
// key with the canonical scorer, filtered online against the query's seed threshold τ,
// compact writeback of s ≥ τ — no dense logits.  Exact by Theorem 1 with U = +inf.
// grid (N/TILE_N, Qn/QG), like dense_logits.
// ---------------------------------------------------------------------------------------
template <int MT>
__device__ void fused_impl(const uint8_t* __restrict__ q, const float* __restrict__ w,
                           const uint8_t* __restrict__ kp, const float* __restrict__ alpha,
                           const float* __restrict__ tau, const int* __restrict__ ks_,
                           const int* __restrict__ ke_, int sinks, int window,
                           const uint32_t* __restrict__ poolmask, int Qn, long long N, int QG,
                           unsigned int* __restrict__ count, unsigned long long* __restrict__ rec,
                           long long cap) {
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* sk = smem;
  float* sa = reinterpret_cast<float*>(smem + TILE_N * ROWH);
  const long long n0 = (long long)blockIdx.x * TILE_N;
  __shared__ uint32_t spm[TILE_N / 32];  // anchor-pool bits of the tile (seeds)
  load_key_tile(kp, alpha, N, n0, sk, sa);
  if (threadIdx.x < TILE_N / 32) spm[threadIdx.x] = (n0 + 32 * threadIdx.x < N) ? __ldg(poolmask + (n0 >> 5) + threadIdx.x) : 0u;
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int pos = batch_pos(lane);
  const int tend = min(Qn, (int)(blockIdx.y + 1) * QG);
  const int tile_n = (int)min((long long)TILE_N, N - n0);
  for (int t = blockIdx.y * QG + warp; t < tend; t += nw) {
    const int ks = ks_[t], ke = ke_[t];
    const long long lo = max((long long)ks, n0), hi = min((long long)ke, n0 + tile_n);
    if (lo >= hi) continue;
    const int ns = min(sinks, ke - ks);
    const long long s_hi = (long long)ks + ns, loc_lo = max(s_hi, (long long)ke - window);
    QRows<MT> A;
    float wlo[MT], whi[MT];
    A.load(q + (long long)t * (MT * 16) * DOSA_D, lane);
    load_weights<MT>(w + (long long)t * (MT * 16), wlo, whi, lane);
    const float tq = tau[t];
    const int blo = (int)((lo - n0) >> 5), bhi = (int)((hi - n0 + 31) >> 5);
    for (int b = blo; b < bhi; ++b) {
      const float sc = score_batch<MT>(A, KeysSmem{sk + b * 32 * ROWH}, wlo, whi, lane);
      const int i = b * 32 + pos;
      const long long key = n0 + i;
      const float s = sc * sa[i];
      const bool seed = key < s_hi || key >= loc_lo || ((spm[b] >> pos) & 1u);
      const bool p = key >= lo && key < hi && !seed && s >= tq;
      warp_emit(p, s, (int)key, lane, count + t, rec + (long long)t * cap, cap);
    }
  }
}

#define FUSED_INST(MT)                                                                          \
  extern "C" __global__ void __launch_bounds__(256) fused_mt##MT(                                \
      const uint8_t* q, const float* w, const uint8_t* kp, const float* alpha, const float* tau, \
      const int* ks, const int* ke, int sinks, int window, const uint32_t* poolmask, int Qn,    \
      long long N, int QG, unsigned int* count, unsigned long long* rec, long long cap) {        \
    fused_impl<MT>(q, w, kp, alpha, tau, ks, ke, sinks, window, poolmask, Qn, N, QG, count, rec, \
                   cap);                                                                         \
  }
FUSED_INST(1)
FUSED_INST(2)
FUSED_INST(3)
FUSED_INST(4)

// ---------------------------------------------------------------------------------------
// Seed scoring (docs/method.md §2): S_t = sinks [ks, ks+sinks) ∪ local [max(ks+ns, ke−W), ke)
// ∪ (anchor pool ∩ [ks, ke)).  All seed records go to seed_rec[t, :]; τ is then the K-th
// largest (selection kernel).  grid (ceil(Smax / (8 warps·SEEDW)), Qn).
// ---------------------------------------------------------------------------------------
#define SEEDW 256
__device__ __forceinline__ int seed_id(long long j, int ks, int ns, int loc_lo, int nloc,
                                       const int* __restrict__ pool, int plo, int phi) {
  if (j < ns) return ks + (int)j;
  j -= ns;
  if (j < nloc) return loc_lo + (int)j;
  j -= nloc;
  if (plo + j >= phi) return -1;
  const int id = __ldg(pool + plo + j);
  if (id < ks + ns || id >= loc_lo) return -1;  // already a sink / local seed
  return id;
}

template <int MT>
__device__ void seed_score_impl(const uint8_t* __restrict__ q, const float* __restrict__ w,
                                const uint8_t* __restrict__ kp, const float* __restrict__ alpha,
                                const int* __restrict__ ks_, const int* __restrict__ ke_, int sinks,
                                int window, const int* __restrict__ pool,
                                const int* __restrict__ plo_, const int* __restrict__ phi_,
                                unsigned int* __restrict__ count, unsigned long long* __restrict__ rec,
                                long long cap) {
  const int t = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int ks = ks_[t], ke = ke_[t];
  const int ns = min(sinks, ke - ks);
  const int loc_lo = max(ks + ns, ke - window), nloc = ke - loc_lo;
  const int plo = plo_[t], phi = phi_[t];
  const long long total = (long long)ns + nloc + (phi - plo);
  const long long j0 = ((long long)blockIdx.x * (blockDim.x >> 5) + warp) * SEEDW;
  if (j0 >= total) return;
  QRows<MT> A;
  float wlo[MT], whi[MT];
  A.load(q + (long long)t * (MT * 16) * DOSA_D, lane);
  load_weights<MT>(w + (long long)t * (MT * 16), wlo, whi, lane);
  const long long j1 = min(total, j0 + SEEDW);
  const int g = lane >> 2, pos = batch_pos(lane);
  for (long long jb = j0; jb < j1; jb += 32) {
    int my[4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      my[u] = (jb + 8 * u + g < j1) ? seed_id(jb + 8 * u + g, ks, ns, loc_lo, nloc, pool, plo, phi) : -1;
    const int id = (jb + pos < j1) ? seed_id(jb + pos, ks, ns, loc_lo, nloc, pool, plo, phi) : -1;
    score_ids_and_emit<MT>(A, wlo, whi, kp, alpha, my, id, NEG_INF, lane, count + t,
                           rec + (long long)t * cap, cap);
  }
}

#define SEED_INST(MT)                                                                           \
  extern "C" __global__ void __launch_bounds__(256) seed_score_mt##MT(                           \
      const uint8_t* q, const float* w, const uint8_t* kp, const float* alpha, const int* ks,   \
      const int* ke, int sinks, int window, const int* pool, const int* plo, const int* phi,    \
      unsigned int* count, unsigned long long* rec, long long cap) {                            \
    seed_score_impl<MT>(q, w, kp, alpha, ks, ke, sinks, window, pool, plo, phi, count, rec, cap); \
  }
SEED_INST(1)
SEED_INST(2)
SEED_INST(3)
SEED_INST(4)

// The key tile of a screening block (screen_impl, screen_pair): keys as f16 (sk) with
// their scales α (sa), ρ (sr) and anchor-pool bits (spm), in shared memory, synchronized.
struct ScreenTile {
  uint8_t* sk;
  float* sa;
  float* sr;
  long long n0;
};
__device__ __forceinline__ ScreenTile load_screen_tile(uint8_t* smem, uint32_t* spm,
                                                       const uint8_t* __restrict__ kp,
                                                       const float* __restrict__ alpha,
                                                       const float* __restrict__ rho,
                                                       const uint32_t* __restrict__ poolmask,
                                                       long long N) {
  ScreenTile t;
  t.sk = smem;
  t.sa = reinterpret_cast<float*>(smem + TILE_N * ROWH);
  t.sr = t.sa + TILE_N;
  t.n0 = (long long)blockIdx.x * TILE_N;
  const long long n0 = t.n0;
  load_key_tile(kp, alpha, N, n0, t.sk, t.sa);
  for (int i = threadIdx.x; i < TILE_N; i += blockDim.x) t.sr[i] = (n0 + i < N) ? __ldg(rho + n0 + i) : 0.f;
  if (threadIdx.x < TILE_N / 32) spm[threadIdx.x] = (n0 + 32 * threadIdx.x < N) ? __ldg(poolmask + (n0 >> 5) + threadIdx.x) : 0u;
  __syncthreads();
  return t;
}

// ---------------------------------------------------------------------------------------
// Screening (docs/method.md §8, §9): for every visible non-seed key,
//   Û = Σ_{rows j} ω_j [x̂_j]_+ − σ_a [x̂_{aux0} + x̂_{aux1}]_+     (fp32, payload units)
//   U^num = α (Û + ρ C + ε_raw) + ε_out                               (fp64, rounded up)
// survives unless U^num < τ (strict).  Rows: MTS·16 plan rows of the query; rows 7 and 15 of
// the last tile are the two FP8 aux rows (the same lane g = 7 holds both), the other rows are
// retained heads (zero rows where r is smaller).  One batch of 32 keys = one bitmask word:
// after reduce8 each lane owns one key, evaluates its U^num once, and a warp OR-reduction
// packs the survivors.  Queries that see a key with an invalid scale (α < 0, NaN, inf) are
// found on the host by a prefix count (pipeline._invalid_scale_queries) and recovered
// (docs/method.md §7 C.3); their screen output is discarded.  grid (ceil(N/TILE_N), ceil(Qn/QG)).
// ---------------------------------------------------------------------------------------
#ifndef DOSA_SCREEN_UNROLL
#define DOSA_SCREEN_UNROLL 2  // batches per loop trip (v8: 2 beat 1 by 8%, docs/records/notes.md)
#endif
constexpr int kScreenUnroll = DOSA_SCREEN_UNROLL;
#ifndef DOSA_SCREEN_FAST32
#define DOSA_SCREEN_FAST32 0  // fp32 pre-test of the guard (proofs/fp32_pretest.py); opt-in
#endif
// CERT (screen_cert_mt*): also write, for every survivor, the record (U^num rounded up to
// fp32, id) to urec[t, :ucap] (counter ucnt[t] counts past ucap; entries beyond the
// capacity are dropped — they only feed the choice of certificate seeds, docs/method.md §2,
// for which any subset of the visible keys is valid).  CERT = false is the plain screen.
template <int MTS, bool CERT>
__device__ void screen_impl(const uint8_t* __restrict__ rows, const float* __restrict__ om,
                            const float* __restrict__ sig, const double* __restrict__ Cq,
                            const double* __restrict__ eps_raw, double eps_out,
                            const float* __restrict__ tau, const uint8_t* __restrict__ kp,
                            const float* __restrict__ alpha, const float* __restrict__ rho,
                            const int* __restrict__ ks_, const int* __restrict__ ke_, int sinks,
                            int window, const uint32_t* __restrict__ poolmask, int Qn, long long N,
                            int QG, uint32_t* __restrict__ surv, double* __restrict__ Uout,
                            unsigned int* __restrict__ ucnt, unsigned long long* __restrict__ urec,
                            long long ucap) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ uint32_t spm[TILE_N / 32];  // anchor-pool bits of the tile (seeds)
  const auto [sk, sa, sr, n0] = load_screen_tile(smem, spm, kp, alpha, rho, poolmask, N);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5,
            g = lane >> 2, pos = batch_pos(lane);
  const long long NW = (N + 31) >> 5;
  const int tend = min(Qn, (int)(blockIdx.y + 1) * QG);
  const int tile_n = (int)min((long long)TILE_N, N - n0);
  // v8 (docs/records/notes.md): per-query work in tile-relative int32 coordinates, batches limited to
  // the visible span, the aux-row combination done with selects instead of a divergent
  // branch, and the tile's bitmask words kept in lanes 0..7 and stored once (coalesced).
  const bool aux_lane = g == 7;  // rows 7 and 15 of the last tile are the two aux rows
  const float aux_add = aux_lane ? 1.f : 0.f;
  const int nb = (tile_n + 31) >> 5;
  for (int t = blockIdx.y * QG + warp; t < tend; t += nw) {
    const int ks = ks_[t], ke = ke_[t];
    const long long lo = max((long long)ks, n0), hi = min((long long)ke, n0 + tile_n);
    uint32_t* srow = surv + (long long)t * NW + (n0 >> 5);
    uint32_t myword = 0u;  // lane b < nb ends with word b of this tile
    if (lo < hi) {
      // Visible span and seed spans as offsets in [0, TILE_N] (clamped, so int32 is exact).
      const int lo_i = (int)(lo - n0), hi_i = (int)(hi - n0);
      const int ns = min(sinks, ke - ks);
      const long long s_hi = (long long)ks + ns, loc_lo = max(s_hi, (long long)ke - window);
      const int shi_i = (int)min(max(s_hi - n0, 0LL), (long long)TILE_N);
      const int llo_i = (int)min(max(loc_lo - n0, 0LL), (long long)TILE_N);
      QRows<MTS> A;
      float olo[MTS], ohi[MTS];
      A.load(rows + (long long)t * (MTS * 16) * DOSA_D, lane);
      load_weights<MTS>(om + (long long)t * (MTS * 16), olo, ohi, lane);
      const float sg = sig[t], tq = tau[t];
      // Last tile: lane g = 7 weighs [x_7 + x_15]_+ by −σ_a and row 15 by 0 (fmaf(0, x, a)
      // adds an exact zero), the other lanes weigh both rows by their ω — the values of a
      // per-lane branch, without its divergence.
      const float last_lo = aux_lane ? -sg : olo[MTS - 1];
      const float last_hi = aux_lane ? 0.f : ohi[MTS - 1];
      const double C = Cq[t], er = eps_raw[t];
#if DOSA_SCREEN_FAST32
      // fp32 pre-test (proofs/fp32_pretest.py): its constants rounded up; it may reject
      // only against a finite τ and when they are normal fp32 numbers (no flush).
      const float Cf = __double2float_ru(C), ef = __double2float_ru(er);
      const float of = __double2float_ru(eps_out);
      const float f32_min = 0x1p-126f, f32_inf = __int_as_float(0x7f800000);
      const bool q_fast = Cf >= f32_min && Cf < f32_inf && ef >= f32_min && ef < f32_inf &&
                          of >= f32_min && of < f32_inf && tq > -f32_inf && tq < f32_inf;
      const float tq_fast = q_fast ? __fsub_rd(tq, 0x1p-59f) : -f32_inf;
#endif
      const int b0 = lo_i >> 5, b1 = (hi_i + 31) >> 5;
#pragma unroll kScreenUnroll
      for (int b = b0; b < b1; ++b) {
        float Cm[4][MTS][4];
        mma_batch<MTS>(A, KeysSmem{sk + b * 32 * ROWH}, lane, Cm);
        float x[8];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          float a0 = 0.f, a1 = 0.f;
#pragma unroll
          for (int mt = 0; mt < MTS; ++mt) {
            if (mt == MTS - 1) {
              // fmaf(1, C2, C0) = C0 + C2 (one rounding); fmaf(0, C2, C0) = C0 exactly.
              a0 = fmaf(last_lo, fmaxf(fmaf(aux_add, Cm[u][mt][2], Cm[u][mt][0]), 0.f), a0);
              a1 = fmaf(last_lo, fmaxf(fmaf(aux_add, Cm[u][mt][3], Cm[u][mt][1]), 0.f), a1);
              a0 = fmaf(last_hi, fmaxf(Cm[u][mt][2], 0.f), a0);
              a1 = fmaf(last_hi, fmaxf(Cm[u][mt][3], 0.f), a1);
            } else {
              a0 = fmaf(olo[mt], fmaxf(Cm[u][mt][0], 0.f), a0);
              a1 = fmaf(olo[mt], fmaxf(Cm[u][mt][1], 0.f), a1);
              a0 = fmaf(ohi[mt], fmaxf(Cm[u][mt][2], 0.f), a0);
              a1 = fmaf(ohi[mt], fmaxf(Cm[u][mt][3], 0.f), a1);
            }
          }
          x[2 * u] = a0;
          x[2 * u + 1] = a1;
        }
        const float uh = reduce8(x, lane);
        const int i = b * 32 + pos;
        const bool vis = i >= lo_i && i < hi_i;
        const float al = sa[i];
#if DOSA_SCREEN_FAST32
        const bool seed = i < shi_i || i >= llo_i || ((spm[b] >> pos) & 1u);
        // u32 > V − 2^-59 under round-up and flush-to-zero (α normal ≤ 2^64, ρ 0 or
        // normal), so u32 < τ − 2^-59 proves V < τ; the fp64 guard runs only for warps with
        // a key the pre-test could not reject (rejections stay sound; proofs/fp32_pretest).
        const float sri = sr[i];
        // ρ exactly zero (a bit test: under FTZ `sri == 0.f` would also accept a denormal
        // ρ, which the multiply then reads as 0 — review of 2026-11-30) or normal
        const bool k_fast = al >= f32_min && al <= 0x1p64f &&
                            ((__float_as_uint(sri) << 1) == 0u || sri >= f32_min);
        float u32 = __fadd_ru(__fadd_ru(uh, __fmul_ru(sri, Cf)), ef);
        u32 = __fadd_ru(__fmul_ru(al, u32), of);
        const bool need = vis && !seed && !(k_fast && u32 < tq_fast);
        bool p = false;
        double U = 0.0;  // computed wherever p can be true (read by CERT for survivors)
        if (Uout != nullptr || __any_sync(0xffffffffu, need)) {
          U = __dadd_ru(__dadd_ru((double)uh, __dmul_ru((double)sri, C)), er);
          U = __dadd_ru(__dmul_ru((double)al, U), eps_out);
          if (Uout && vis) Uout[(long long)t * N + n0 + i] = U;
          p = need && !(U < (double)tq);
        }
#else
        double U = __dadd_ru(__dadd_ru((double)uh, __dmul_ru((double)sr[i], C)), er);
        U = __dadd_ru(__dmul_ru((double)al, U), eps_out);
        if (Uout && vis) Uout[(long long)t * N + n0 + i] = U;
        const bool seed = i < shi_i || i >= llo_i || ((spm[b] >> pos) & 1u);
        const bool p = vis && !seed && !(U < (double)tq);
#endif
        const uint32_t word = __reduce_or_sync(0xffffffffu, p ? (1u << pos) : 0u);
        if (lane == b) myword = word;
        if constexpr (CERT) {
          if (word) {  // warp-aggregated append of the survivors' (U, id) records
            // u ≥ U: cvt.rp.ftz flushes a positive U < 2^-126 to +0 < U, so raise it to 2^-126
            float u = __double2float_ru(U);
            if ((double)u < U) u = 0x1p-126f;
            warp_emit(p, u, (int)(n0 + i), lane, ucnt + t, urec + (long long)t * ucap, ucap);
          }
        }
      }
    }
    if (lane < nb) srow[lane] = myword;
  }
}

#define SCREEN_INST(MTS)                                                                         \
  extern "C" __global__ void __launch_bounds__(256) screen_mt##MTS(                               \
      const uint8_t* rows, const float* om, const float* sig, const double* Cq,                  \
      const double* eps_raw, double eps_out, const float* tau, const uint8_t* kp,                \
      const float* alpha, const float* rho, const int* ks, const int* ke, int sinks, int window, \
      const uint32_t* poolmask, int Qn, long long N, int QG, uint32_t* surv, double* Uout) {    \
    screen_impl<MTS, false>(rows, om, sig, Cq, eps_raw, eps_out, tau, kp, alpha, rho, ks, ke,    \
                            sinks, window, poolmask, Qn, N, QG, surv, Uout, nullptr, nullptr, 0); \
  }                                                                                              \
  extern "C" __global__ void __launch_bounds__(256) screen_cert_mt##MTS(                          \
      const uint8_t* rows, const float* om, const float* sig, const double* Cq,                  \
      const double* eps_raw, double eps_out, const float* tau, const uint8_t* kp,                \
      const float* alpha, const float* rho, const int* ks, const int* ke, int sinks, int window, \
      const uint32_t* poolmask, int Qn, long long N, int QG, uint32_t* surv, double* Uout,       \
      unsigned int* ucnt, unsigned long long* urec, long long ucap) {                            \
    screen_impl<MTS, true>(rows, om, sig, Cq, eps_raw, eps_out, tau, kp, alpha, rho, ks, ke,     \
                           sinks, window, poolmask, Qn, N, QG, surv, Uout, ucnt, urec, ucap);    \
  }
SCREEN_INST(1)
SCREEN_INST(2)

// ---------------------------------------------------------------------------------------
// Paired screen (opt-in `screen="pair"`, r ≤ 6; docs/records/notes.md "Paired screen"): two queries
// share one 16-row MMA tile, so each query costs half the MMAs, key-fragment loads and
// ReLU-weighted products of screen_mt1.  The host (pipeline._pair_plan) gathers from the
// mts = 1 plans of queries a = 2p and b = 2p + 1 (retained rows in slots 0..5, aux rows v0,
// v1 in rows 7 and 15) the tile
//   row 0..5 = a's retained rows, 6 = b's v0, 7 = a's v0,
//   row 8..13 = b's retained rows, 14 = b's v1, 15 = a's v1,
// so that lane g (rows g and g + 8) holds a retained row of a and one of b (g < 6), both
// aux rows of b (g = 6) or both aux rows of a (g = 7).  Per key and query:
//   Û = Σ_{j<6} ω_j [x_j]_+ − σ_a [x_v0 + x_v1]_+ ,
// each term rounded at most 5 times (the aux sum, the product, reduce8's three additions):
// within the γ_{2·mts+6} = γ_8 screening allowance of the mts = 1 plan (plan.py g_scr), so
// the same plan, C and ε stay valid (the plan does not depend on the evaluation layout
// beyond that depth; the MMA of each row is the same m16n8k16 chain as screen_mt1's).
// The rest (guard, seeds, visibility, bitmask words) is screen_impl's, once per query.
// grid (ceil(N/TILE_N), ceil(ceil(Qn/2)/QG)); a missing b (odd Qn) sees nothing.
// ---------------------------------------------------------------------------------------
struct PairQuery {  // one query's scalars and tile-relative spans (screen_impl's, per query)
  int t, lo_i, hi_i, shi_i, llo_i;
  float sg, tq;
  double C, er;
  uint32_t word;
  __device__ __forceinline__ void init(int t_, bool exists, const int* __restrict__ ks_,
                                       const int* __restrict__ ke_, const float* __restrict__ sig,
                                       const float* __restrict__ tau, const double* __restrict__ Cq,
                                       const double* __restrict__ eps_raw, int sinks, int window,
                                       long long n0, int tile_n) {
    t = t_;
    word = 0u;
    lo_i = hi_i = shi_i = llo_i = 0;
    sg = 0.f;
    tq = 0.f;
    C = er = 0.0;
    if (!exists) return;
    const int ks = ks_[t], ke = ke_[t];
    const long long lo = max((long long)ks, n0), hi = min((long long)ke, n0 + tile_n);
    if (lo >= hi) return;
    lo_i = (int)(lo - n0);
    hi_i = (int)(hi - n0);
    const int ns = min(sinks, ke - ks);
    const long long s_hi = (long long)ks + ns, loc_lo = max(s_hi, (long long)ke - window);
    shi_i = (int)min(max(s_hi - n0, 0LL), (long long)TILE_N);
    llo_i = (int)min(max(loc_lo - n0, 0LL), (long long)TILE_N);
    sg = sig[t];
    tq = tau[t];
    C = Cq[t];
    er = eps_raw[t];
  }
  // Guard and bitmask word b (lane b keeps it): screen_impl's fp64 evaluation.
  __device__ __forceinline__ void test(float uh, int b, int i, int pos, int lane, float al,
                                       float sri, double eps_out, const uint32_t* spm,
                                       double* __restrict__ Uout, long long N, long long n0) {
    double U = __dadd_ru(__dadd_ru((double)uh, __dmul_ru((double)sri, C)), er);
    U = __dadd_ru(__dmul_ru((double)al, U), eps_out);
    const bool vis = i >= lo_i && i < hi_i;
    if (Uout && vis) Uout[(long long)t * N + n0 + i] = U;
    const bool seed = i < shi_i || i >= llo_i || ((spm[b] >> pos) & 1u);
    const bool p = vis && !seed && !(U < (double)tq);
    const uint32_t w = __reduce_or_sync(0xffffffffu, p ? (1u << pos) : 0u);
    if (lane == b) word = w;
  }
};

template <int UNUSED>  // a template, like the other kernels' bodies (one `smem` declaration each)
__device__ void screen_pair_impl(const uint8_t* __restrict__ rows_p, const float* __restrict__ om_p,
                const float* __restrict__ sig, const double* __restrict__ Cq,
                const double* __restrict__ eps_raw, double eps_out,
                const float* __restrict__ tau, const uint8_t* __restrict__ kp,
                const float* __restrict__ alpha, const float* __restrict__ rho,
                const int* __restrict__ ks_, const int* __restrict__ ke_, int sinks, int window,
                const uint32_t* __restrict__ poolmask, int Qn, long long N, int QG,
                uint32_t* __restrict__ surv, double* __restrict__ Uout) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ uint32_t spm[TILE_N / 32];
  const auto [sk, sa, sr, n0] = load_screen_tile(smem, spm, kp, alpha, rho, poolmask, N);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5,
            g = lane >> 2, pos = batch_pos(lane);
  const long long NW = (N + 31) >> 5;
  const int P = (Qn + 1) >> 1;
  const int pend = min(P, (int)(blockIdx.y + 1) * QG);
  const int tile_n = (int)min((long long)TILE_N, N - n0);
  const int nb = (tile_n + 31) >> 5;
  const float aux_a = g == 7 ? 1.f : 0.f, aux_b = g == 6 ? 1.f : 0.f;
  for (int p = blockIdx.y * QG + warp; p < pend; p += nw) {
    PairQuery qa, qb;
    qa.init(2 * p, true, ks_, ke_, sig, tau, Cq, eps_raw, sinks, window, n0, tile_n);
    qb.init(2 * p + 1, 2 * p + 1 < Qn, ks_, ke_, sig, tau, Cq, eps_raw, sinks, window, n0, tile_n);
    const bool va = qa.lo_i < qa.hi_i, vb = qb.lo_i < qb.hi_i;
    if (va || vb) {
      QRows<1> A;
      float olo[1], ohi[1];
      A.load(rows_p + (long long)p * 16 * DOSA_D, lane);
      load_weights<1>(om_p + (long long)p * 16, olo, ohi, lane);
      // lane weights: retained rows (g < 6), −σ on the lane holding the query's aux rows
      const float wa = g < 6 ? olo[0] : (g == 7 ? -qa.sg : 0.f);
      const float wb = g < 6 ? ohi[0] : (g == 6 ? -qb.sg : 0.f);
      const int lo_i = va ? (vb ? min(qa.lo_i, qb.lo_i) : qa.lo_i) : qb.lo_i;
      const int hi_i = va ? (vb ? max(qa.hi_i, qb.hi_i) : qa.hi_i) : qb.hi_i;
      const int b0 = lo_i >> 5, b1 = (hi_i + 31) >> 5;
#pragma unroll kScreenUnroll
      for (int b = b0; b < b1; ++b) {
        float Cm[4][1][4];
        mma_batch<1>(A, KeysSmem{sk + b * 32 * ROWH}, lane, Cm);
        float xa[8], xb[8];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
#pragma unroll
          for (int v = 0; v < 2; ++v) {
            // fmaf(1, y, x) = x + y (one rounding), fmaf(0, y, x) = x exactly for finite y.
            // y is the partner's row on lanes g < 6: a NaN there would erase this query's
            // term (fmaf(0, NaN, x) = NaN, fmaxf(NaN, 0) = 0), so pipeline.pair_plan zeroes
            // the rows of invalid plans — the only plans with NaN rows (plan.cu header;
            // review of 2026-11-30) — and every row here is finite.
            const float sa_ = fmaf(aux_a, Cm[u][0][2 + v], Cm[u][0][v]);
            const float sb_ = fmaf(aux_b, Cm[u][0][v], Cm[u][0][2 + v]);
            xa[2 * u + v] = wa * fmaxf(sa_, 0.f);
            xb[2 * u + v] = wb * fmaxf(sb_, 0.f);
          }
        }
        const float uha = reduce8(xa, lane), uhb = reduce8(xb, lane);
        const int i = b * 32 + pos;
        const float al = sa[i], sri = sr[i];
        qa.test(uha, b, i, pos, lane, al, sri, eps_out, spm, Uout, N, n0);
        qb.test(uhb, b, i, pos, lane, al, sri, eps_out, spm, Uout, N, n0);
      }
    }
    if (lane < nb) surv[(long long)qa.t * NW + (n0 >> 5) + lane] = qa.word;
    if (lane < nb && 2 * p + 1 < Qn) surv[(long long)qb.t * NW + (n0 >> 5) + lane] = qb.word;
  }
}

extern "C" __global__ void __launch_bounds__(256) screen_pair(
    const uint8_t* rows_p, const float* om_p, const float* sig, const double* Cq,
    const double* eps_raw, double eps_out, const float* tau, const uint8_t* kp,
    const float* alpha, const float* rho, const int* ks, const int* ke, int sinks, int window,
    const uint32_t* poolmask, int Qn, long long N, int QG, uint32_t* surv, double* Uout) {
  screen_pair_impl<0>(rows_p, om_p, sig, Cq, eps_raw, eps_out, tau, kp, alpha, rho, ks, ke, sinks,
                      window, poolmask, Qn, N, QG, surv, Uout);
}

// Certificate-guided seeds, second half (docs/method.md §2, §7): after the certificate seeds
// raised τ to tau[t], clear the survivor bit of every recorded key whose bound is below it.
// u = fp32(U^num) rounded up ≥ U^num ≥ s (the guard), so u < τ proves s < τ: the key can be
// in no Top-K (strict, as in the screen) and refinement need not score it.  Keys whose
// record was dropped (count > ucap) keep their bit.  grid (x, min(Qn, 65535)); rows
// t = blockIdx.y, blockIdx.y + gridDim.y, ... (grid y is capped at 65535).
extern "C" __global__ void cert_clear_below_tau(const unsigned long long* __restrict__ urec,
                                                const unsigned int* __restrict__ ucnt,
                                                long long ucap, const float* __restrict__ tau,
                                                int Qn, long long NW,
                                                uint32_t* __restrict__ surv) {
  for (int t = blockIdx.y; t < Qn; t += gridDim.y) {
    const long long n = min((long long)ucnt[t], ucap);
    const float tq = tau[t];
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < n;
         j += (long long)gridDim.x * blockDim.x) {
      const unsigned long long r = urec[(long long)t * ucap + j];
      const float u = code_score((uint32_t)(r >> 32));  // NaN (code 0) never clears
      if (u < tq) {
        const uint32_t id = ~(uint32_t)(r & 0xffffffffull);
        atomicAnd(surv + (long long)t * NW + (id >> 5), ~(1u << (id & 31u)));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Refinement (docs/method.md §9): score every surviving key of the bitmask with all H heads
// through score_batch (bit-identical to the dense route) and write records with s ≥ τ.
// Per-query stream: block = (query qlist[x], word chunk y); each warp takes RW words.  The
// query index varies fastest, so concurrently resident blocks work on the same key chunk
// for many queries and the gathered keys are served from L2 (a key that survives for
// several queries is read from HBM about once per chunk, not once per query).
// ---------------------------------------------------------------------------------------
#define RW 256
template <int MT>
__device__ void refine_impl(const uint8_t* __restrict__ q, const float* __restrict__ w,
                            const uint8_t* __restrict__ kp, const float* __restrict__ alpha,
                            const float* __restrict__ tau, const int* __restrict__ ks_,
                            const int* __restrict__ ke_, const int* __restrict__ qlist,
                            long long N, const uint32_t* __restrict__ surv,
                            unsigned int* __restrict__ count, unsigned long long* __restrict__ rec,
                            long long cap) {
  __shared__ int sid[8][1024 + 32];
  const int t = qlist[blockIdx.x];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long NW = (N + 31) >> 5;
  const long long wlo_ = (long long)ks_[t] >> 5, whi_ = ((long long)ke_[t] + 31) >> 5;
  const long long w0 = wlo_ + ((long long)blockIdx.y * (blockDim.x >> 5) + warp) * RW;
  if (w0 >= whi_) return;
  const long long w1 = min(whi_, w0 + RW);
  const uint32_t* srow = surv + (long long)t * NW;
  // Skip the warp entirely when it has no survivor (common: survival is a few percent).
  bool any = false;
  for (long long wi = w0 + lane; wi < w1; wi += 32) any |= srow[wi] != 0u;
  if (!__any_sync(0xffffffffu, any)) return;
  QRows<MT> A;
  float wl[MT], wh[MT];
  A.load(q + (long long)t * (MT * 16) * DOSA_D, lane);
  load_weights<MT>(w + (long long)t * (MT * 16), wl, wh, lane);
  const float tq = tau[t];
  int* buf = sid[warp];
  const int g = lane >> 2, pos = batch_pos(lane);
  int have = 0;  // ids carried over in buf[0 .. have)
  for (long long wb = w0; wb < w1; wb += 32) {
    const long long wi = wb + lane;
    const uint32_t m = (wi < w1) ? srow[wi] : 0u;
    const int n = __popc(m);
    int incl = n;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    const int total = have + __shfl_sync(0xffffffffu, incl, 31);
    int at = have + incl - n;
    uint32_t mm = m;
    while (mm) {
      const int bit = __ffs(mm) - 1;
      mm &= mm - 1u;
      buf[at++] = (int)(wi * 32 + bit);
    }
    __syncwarp();
    const bool last = wb + 32 >= w1;
    const int full = last ? total : (total & ~31);
    for (int j = 0; j < full; j += 32) {
      int my[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) my[u] = (j + 8 * u + g < total) ? buf[j + 8 * u + g] : -1;
      const int id = (j + pos < total) ? buf[j + pos] : -1;
      score_ids_and_emit<MT>(A, wl, wh, kp, alpha, my, id, tq, lane, count + t,
                             rec + (long long)t * cap, cap);
    }
    __syncwarp();
    have = total - full;  // < 32 ids left: move them to the front
    const int src = (lane < have) ? buf[full + lane] : 0;
    __syncwarp();
    if (lane < have) buf[lane] = src;
    __syncwarp();
  }
}

#define REFINE_INST(MT)                                                                        \
  extern "C" __global__ void __launch_bounds__(256) refine_mt##MT(                              \
      const uint8_t* q, const float* w, const uint8_t* kp, const float* alpha, const float* tau, \
      const int* ks, const int* ke, const int* qlist, long long N, const uint32_t* surv,       \
      unsigned int* count, unsigned long long* rec, long long cap) {                           \
    refine_impl<MT>(q, w, kp, alpha, tau, ks, ke, qlist, N, surv, count, rec, cap);            \
  }
REFINE_INST(1)
REFINE_INST(2)
REFINE_INST(3)
REFINE_INST(4)

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

// Saturating RNE e4m3 bits of fp64 values via fp32 (plan aux rows, docs/method.md §8).  Any
// rounding is acceptable here: the planner computes the reconstruction error exactly.
extern "C" __global__ void e4m3_round_f64(const double* __restrict__ x, long long n,
                                          uint8_t* __restrict__ out) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __nv_cvt_float_to_fp8((float)x[i], __NV_SATFINITE, __NV_E4M3);
}

// ---------------------------------------------------------------------------------------
// Explicit seeds (docs/method.md §2, Prop. 4; reference: dosa_ref.stages.seed_ids).  Caller-given
// key ids per query (e.g. the previous chunk's selections) are scored by the canonical
// scorer — score_ids_and_emit, i.e. dosa::score_batch, bit-identical to refinement and to
// the dense route — and their records go to rec[t, :]; the host then takes τ = the K-th
// record of (default seed records ∪ these records).  Explicit seeds ONLY raise τ: they are
// not excluded from screening, so one with s ≥ τ survives (U ≥ s ≥ τ) and refinement
// writes it into the compact records (docs/method.md §7 steps 4–7 with S = the default seeds).
// Precondition (pipeline.explicit_seed_table): each row of `ids` holds distinct visible
// ids that are not default seeds (sinks, local window, anchor pool), −1 padding — a key
// counted twice in the union could raise τ above τ_K(Ω) (docs/method.md §2 needs *distinct*
// seeds).  The visibility test below only keeps the gathers in bounds.
// grid (ceil(S / (8 warps·SEEDW)), Qn); rec is [Qn, S] (count[t] ≤ S: no overflow).
// ---------------------------------------------------------------------------------------
template <int MT>
__device__ void seed_ids_impl(const uint8_t* __restrict__ q, const float* __restrict__ w,
                              const uint8_t* __restrict__ kp, const float* __restrict__ alpha,
                              const int* __restrict__ ks_, const int* __restrict__ ke_,
                              const int* __restrict__ ids, long long S,
                              unsigned int* __restrict__ count, unsigned long long* __restrict__ rec) {
  const int t = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int ks = ks_[t], ke = ke_[t];
  const long long j0 = ((long long)blockIdx.x * (blockDim.x >> 5) + warp) * SEEDW;
  if (j0 >= S) return;
  const long long j1 = min(S, j0 + SEEDW);
  const int* row = ids + (long long)t * S;
  // Rows are padded with −1 at the end: skip a warp whose entries are all padding.
  bool any = false;
  for (long long j = j0 + lane; j < j1; j += 32) any |= row[j] >= 0;
  if (!__any_sync(0xffffffffu, any)) return;
  QRows<MT> A;
  float wlo[MT], whi[MT];
  A.load(q + (long long)t * (MT * 16) * DOSA_D, lane);
  load_weights<MT>(w + (long long)t * (MT * 16), wlo, whi, lane);
  const int g = lane >> 2, pos = batch_pos(lane);
  for (long long jb = j0; jb < j1; jb += 32) {
    int my[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int v = (jb + 8 * u + g < j1) ? row[jb + 8 * u + g] : -1;
      my[u] = (v >= ks && v < ke) ? v : -1;
    }
    int id = (jb + pos < j1) ? row[jb + pos] : -1;
    if (id < ks || id >= ke) id = -1;
    if (!__any_sync(0xffffffffu, id >= 0)) continue;  // warp-uniform: padding only
    score_ids_and_emit<MT>(A, wlo, whi, kp, alpha, my, id, NEG_INF, lane, count + t,
                           rec + (long long)t * S, S);
  }
}

#define SEED_IDS_INST(MT)                                                                    \
  extern "C" __global__ void __launch_bounds__(256) seed_ids_mt##MT(                          \
      const uint8_t* q, const float* w, const uint8_t* kp, const float* alpha, const int* ks, \
      const int* ke, const int* ids, long long S, unsigned int* count,                        \
      unsigned long long* rec) {                                                              \
    seed_ids_impl<MT>(q, w, kp, alpha, ks, ke, ids, S, count, rec);                           \
  }
SEED_IDS_INST(1)
SEED_IDS_INST(2)
SEED_IDS_INST(3)
SEED_IDS_INST(4)
