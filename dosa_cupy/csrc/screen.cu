#ifndef DOSA_SCREEN_CU
#define DOSA_SCREEN_CU
#include "epilogue.cuh"
#include "stage.cuh"

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
// Rows: MTS·16 plan rows of the query; rows 7 and 15 of the last tile are the two FP8 aux
// rows (the same lane g = 7 holds both), the other rows are retained heads (zero rows where
// r is smaller).  One batch of 32 keys = one bitmask word: after reduce8 each lane owns one
// key, evaluates its U^num once, and a warp OR-reduction packs the survivors.  Queries that
// see a key with an invalid scale (α < 0, NaN, inf) are found on the host by a prefix count
// (select.recovery_queries) and recovered (docs/method.md §7 C.3); their screen output is
// discarded.  grid (ceil(N/TILE_N), ceil(Qn/QG)).
//
// The keep rule, a template parameter TIE of every screen kernel (docs/method.md §7
// "Tie-aware rejection and zero plateaus"):
//   TIE = false: a key survives unless U^num < τ (strict);
//   TIE = true (the *_tie kernels): it survives unless its record (U^num, i) is below the
//   K-th seed record (τ, j): U^num < τ, or U^num = τ and i > j (j = kj[t]; kNoKthId gives
//   the strict rule).  Zero plateau: when the query's plan retains every positive head
//   (zrow[t, 0] not NaN, screen.plateau_rows) and τ ≥ 0, a key whose every positive row
//   passes plateau_miss's test has canonical score ≤ 0 (or NaN), so min(U^num, 0) bounds it
//   (proofs/gpu_zero_plateau.py).  tcnt[t] (when given) counts the keys the strict rule
//   keeps and this rule rejects (stat tie_rejected).
// The TIE = true kernels take kj and zrow after tau and tcnt after Uout; the TIE = false
// kernels have neither (screen.ScreenLaunch builds both argument lists).
// ---------------------------------------------------------------------------------------
#ifndef DOSA_SCREEN_UNROLL
#define DOSA_SCREEN_UNROLL 2  // batches per loop trip (v8: 2 beat 1 by 8%, docs/records/notes.md)
#endif
constexpr int kScreenUnroll = DOSA_SCREEN_UNROLL;

// CERT (screen_cert_mt*): also write, for every survivor, the record (U^num rounded up to
// fp32, id) to urec[t, :ucap] (counter ucnt[t] counts past ucap; entries beyond the
// capacity are dropped — they only feed the choice of certificate seeds, docs/method.md §2,
// for which any subset of the visible keys is valid).  CERT = false is the plain screen.
template <int MTS, bool CERT, bool TIE>
__device__ void screen_impl(const uint8_t* __restrict__ rows, const float* __restrict__ om,
                            const float* __restrict__ sig, const double* __restrict__ Cq,
                            const double* __restrict__ eps_raw, double eps_out,
                            const float* __restrict__ tau, const int* __restrict__ kj,
                            const float* __restrict__ zrow, const uint8_t* __restrict__ kp,
                            const float* __restrict__ alpha, const float* __restrict__ rho,
                            const int* __restrict__ ks_, const int* __restrict__ ke_, int sinks,
                            int window, const uint32_t* __restrict__ poolmask, int Qn, long long N,
                            int QG, uint32_t* __restrict__ surv, double* __restrict__ Uout,
                            unsigned int* __restrict__ tcnt, unsigned int* __restrict__ ucnt,
                            unsigned long long* __restrict__ urec, long long ucap) {
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
    unsigned int tie = 0u;  // TIE: keys of this tile the strict rule keeps and TIE rejects
    if (lo < hi) {
      // Visible span and seed spans as offsets in [0, TILE_N] (clamped, so int32 is exact).
      const int lo_i = (int)(lo - n0), hi_i = (int)(hi - n0);
      const int ns = min(sinks, ke - ks);
      const long long s_hi = (long long)ks + ns, loc_lo = max(s_hi, (long long)ke - window);
      const int shi_i = (int)min(max(s_hi - n0, 0LL), (long long)TILE_N);
      const int llo_i = (int)min(max(loc_lo - n0, 0LL), (long long)TILE_N);
      Scorer::Rows<MTS> A;
      float olo[MTS], ohi[MTS];
      A.load(rows + (long long)t * (MTS * 16) * DOSA_D, lane);
      load_weights<MTS>(om + (long long)t * (MTS * 16), olo, ohi, lane);
      const float sg = sig[t], tq = tau[t];
      int kjq = kNoKthId;
      bool zp = false;
      float zlo[MTS], zhi[MTS];  // TIE: the plateau rows g, g + 8 of each tile, as ω
      if constexpr (TIE) {
        kjq = kj[t];
        // Zero plateau (docs/method.md §7): warp-uniform, only where min(U, 0) can reject.
        const float* zq = zrow + (long long)t * (MTS * 16);
        zp = zq[0] == zq[0] && tq >= 0.f;
        load_weights<MTS>(zq, zlo, zhi, lane);
      }
      // Last tile: lane g = 7 weighs [x_7 + x_15]_+ by −σ_a and row 15 by 0 (fmaf(0, x, a)
      // adds an exact zero), the other lanes weigh both rows by their ω — the values of a
      // per-lane branch, without its divergence.
      const float last_lo = aux_lane ? -sg : olo[MTS - 1];
      const float last_hi = aux_lane ? 0.f : ohi[MTS - 1];
      const double C = Cq[t], er = eps_raw[t];
      const int b0 = lo_i >> 5, b1 = (hi_i + 31) >> 5;
#pragma unroll kScreenUnroll
      for (int b = b0; b < b1; ++b) {
        float Cm[4][MTS][4];
        Scorer::mma<MTS>(A, KeysSmem{sk + b * 32 * ROWH}, lane, Cm);
        float x[8];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          float a0 = 0.f, a1 = 0.f;
#pragma unroll
          for (int mt = 0; mt < MTS; ++mt) {
            if (mt == MTS - 1)
              weigh_last_tile(Cm[u][mt], last_lo, last_hi, aux_add, a0, a1);
            else
              weigh_tile(Cm[u][mt], olo[mt], ohi[mt], a0, a1);
          }
          x[2 * u] = a0;
          x[2 * u + 1] = a1;
        }
        const float uh = reduce8(x, lane);
        bool plat = false;  // TIE: every positive row of the key certified inactive
        if constexpr (TIE) {
          if (zp) {
            float miss[8];
#pragma unroll
            for (int u = 0; u < 4; ++u)
#pragma unroll
              for (int v = 0; v < 2; ++v) {
                // elements v, 2 + v of tile mt: rows g, g + 8 for key 8u + 2c + v of the batch
                const double rk = (double)sr[b * 32 + 8 * u + 2 * (lane & 3) + v];
                float m = 0.f;
#pragma unroll
                for (int mt = 0; mt < MTS; ++mt)
                  m += plateau_miss(Cm[u][mt][v], zlo[mt], rk) + plateau_miss(Cm[u][mt][2 + v], zhi[mt], rk);
                miss[2 * u + v] = m;
              }
            plat = reduce8(miss, lane) == 0.f;  // small integers: exact
          }
        }
        const int i = b * 32 + pos;
        const bool vis = i >= lo_i && i < hi_i;
        const float al = sa[i];
        const double U = guard_bound_ru(uh, sr[i], al, C, er, eps_out);
        if (Uout && vis) Uout[(long long)t * N + n0 + i] = U;
        const bool seed = i < shi_i || i >= llo_i || ((spm[b] >> pos) & 1u);
        const bool plain = (vis && !seed) && !(U < (double)tq);
        const bool p = DOSA_KEEP(TIE, plain, U, tq, plat, n0 + i, kjq);
        const uint32_t word = __reduce_or_sync(0xffffffffu, p ? (1u << pos) : 0u);
        if (lane == b) myword = word;
        if constexpr (TIE) {
          if (tcnt != nullptr) tie += __popc(__ballot_sync(0xffffffffu, plain && !p));
        }
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
    if constexpr (TIE) {
      if (tcnt != nullptr && lane == 0 && tie) atomicAdd(tcnt + t, tie);
    }
  }
}

// The screen kernels of one plan width: screen_mt<MTS> and screen_cert_mt<MTS> (TIE =
// false), screen_mt<MTS>_tie and screen_cert_mt<MTS>_tie (TIE = true; the extra arguments
// kj, zrow after tau and tcnt after Uout).  Parameter lists carry no __restrict__, like the
// other kernels'.
#define SCREEN_PARAMS_IN                                                                  \
  const uint8_t* rows, const float* om, const float* sig, const double* Cq,              \
      const double* eps_raw, double eps_out, const float* tau
#define SCREEN_PARAMS_KEYS                                                                \
  const uint8_t* kp, const float* alpha, const float* rho, const int* ks, const int* ke,  \
      int sinks, int window, const uint32_t* poolmask, int Qn, long long N, int QG,       \
      uint32_t* surv, double* Uout
#define SCREEN_ARGS_IN rows, om, sig, Cq, eps_raw, eps_out, tau
#define SCREEN_ARGS_KEYS kp, alpha, rho, ks, ke, sinks, window, poolmask, Qn, N, QG, surv, Uout
#define SCREEN_INST(MTS)                                                                        \
  extern "C" __global__ void __launch_bounds__(256) screen_mt##MTS(SCREEN_PARAMS_IN,             \
                                                                    SCREEN_PARAMS_KEYS) {         \
    screen_impl<MTS, false, false>(SCREEN_ARGS_IN, nullptr, nullptr, SCREEN_ARGS_KEYS, nullptr, \
                                   nullptr, nullptr, 0);                                        \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(256) screen_cert_mt##MTS(                         \
      SCREEN_PARAMS_IN, SCREEN_PARAMS_KEYS, unsigned int* ucnt, unsigned long long* urec,       \
      long long ucap) {                                                                         \
    screen_impl<MTS, true, false>(SCREEN_ARGS_IN, nullptr, nullptr, SCREEN_ARGS_KEYS, nullptr,  \
                                  ucnt, urec, ucap);                                            \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(256) screen_mt##MTS##_tie(                        \
      SCREEN_PARAMS_IN, const int* kj, const float* zrow, SCREEN_PARAMS_KEYS,                   \
      unsigned int* tcnt) {                                                                     \
    screen_impl<MTS, false, true>(SCREEN_ARGS_IN, kj, zrow, SCREEN_ARGS_KEYS, tcnt, nullptr,    \
                                  nullptr, 0);                                                  \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(256) screen_cert_mt##MTS##_tie(                   \
      SCREEN_PARAMS_IN, const int* kj, const float* zrow, SCREEN_PARAMS_KEYS,                   \
      unsigned int* tcnt, unsigned int* ucnt, unsigned long long* urec, long long ucap) {       \
    screen_impl<MTS, true, true>(SCREEN_ARGS_IN, kj, zrow, SCREEN_ARGS_KEYS, tcnt, ucnt, urec,  \
                                 ucap);                                                         \
  }
SCREEN_INST(1)
SCREEN_INST(2)

// ---------------------------------------------------------------------------------------
// Paired screen (opt-in `screen="pair"`, r ≤ 6; docs/records/notes.md "Paired screen"): two queries
// share one 16-row MMA tile, so each query costs half the MMAs, key-fragment loads and
// ReLU-weighted products of screen_mt1.  The host (screen.pair_plan) gathers from the
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
// The rest (guard, keep rule of the TIE variant and zero plateau, seeds, visibility,
// bitmask words) is screen_impl's, once per query; zrow is gathered like the rows here
// (screen.pair_gather): query a's plateau rows are the lanes' rows g < 6, query b's the rows
// g + 8, g < 6.  grid (ceil(N/TILE_N), ceil(ceil(Qn/2)/QG)); a missing b (odd Qn) sees nothing.
// ---------------------------------------------------------------------------------------
template <bool TIE>
struct PairQuery {  // one query's scalars and tile-relative spans (screen_impl's, per query)
  int t, lo_i, hi_i, shi_i, llo_i, kj;
  float sg, tq, z;  // TIE: z is this lane's plateau coefficient of the query's row
  bool zp;          // TIE: zero plateau on (warp-uniform)
  double C, er;
  uint32_t word;
  unsigned int tie;  // TIE: keys the strict rule keeps and the tie-aware rule rejects
  __device__ __forceinline__ void init(int t_, bool exists, const int* __restrict__ ks_,
                                       const int* __restrict__ ke_, const float* __restrict__ sig,
                                       const float* __restrict__ tau, const int* __restrict__ kj_,
                                       const double* __restrict__ Cq,
                                       const double* __restrict__ eps_raw, int sinks, int window,
                                       long long n0, int tile_n, float zr, float z_lane) {
    t = t_;
    word = 0u;
    if constexpr (TIE) tie = 0u;
    lo_i = hi_i = shi_i = llo_i = 0;
    if constexpr (TIE) kj = kNoKthId;
    sg = 0.f;
    tq = 0.f;
    if constexpr (TIE) {
      z = -1.f;
      zp = false;
    }
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
    if constexpr (TIE) {
      kj = kj_[t];
      zp = zr == zr && tq >= 0.f;
      z = z_lane;
    }
    C = Cq[t];
    er = eps_raw[t];
  }
  // TIE: whether every positive row of each of the lane's 8 keys passes (screen_impl's
  // plateau test; xs[u][v] = this query's logit of key 8u + 2c + v on the lane's row).
  __device__ __forceinline__ bool plateau(const float (&xs)[4][2], const float* sr, int b, int c,
                                          int lane) const {
    float miss[8];
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
      for (int v = 0; v < 2; ++v)
        miss[2 * u + v] = plateau_miss(xs[u][v], z, (double)sr[b * 32 + 8 * u + 2 * c + v]);
    return reduce8(miss, lane) == 0.f;
  }
  // Guard and bitmask word b (lane b keeps it): screen_impl's fp64 evaluation and rule.
  __device__ __forceinline__ void test(float uh, bool plat, int b, int i, int pos, int lane,
                                       float al, float sri, double eps_out, const uint32_t* spm,
                                       double* __restrict__ Uout, unsigned int* __restrict__ tcnt,
                                       long long N, long long n0) {
    const double U = guard_bound_ru(uh, sri, al, C, er, eps_out);
    const bool vis = i >= lo_i && i < hi_i;
    if (Uout && vis) Uout[(long long)t * N + n0 + i] = U;
    const bool seed = i < shi_i || i >= llo_i || ((spm[b] >> pos) & 1u);
    const bool plain = (vis && !seed) && !(U < (double)tq);
    const bool p = DOSA_KEEP(TIE, plain, U, tq, plat, n0 + i, kj);
    const uint32_t w = __reduce_or_sync(0xffffffffu, p ? (1u << pos) : 0u);
    if (lane == b) word = w;
    if constexpr (TIE) {
      if (tcnt != nullptr) tie += __popc(__ballot_sync(0xffffffffu, plain && !p));
    }
  }
};

template <bool TIE>
__device__ void screen_pair_impl(const uint8_t* __restrict__ rows_p, const float* __restrict__ om_p,
                const float* __restrict__ sig, const double* __restrict__ Cq,
                const double* __restrict__ eps_raw, double eps_out,
                const float* __restrict__ tau, const int* __restrict__ kj,
                const float* __restrict__ zrow, const uint8_t* __restrict__ kp,
                const float* __restrict__ alpha, const float* __restrict__ rho,
                const int* __restrict__ ks_, const int* __restrict__ ke_, int sinks, int window,
                const uint32_t* __restrict__ poolmask, int Qn, long long N, int QG,
                uint32_t* __restrict__ surv, double* __restrict__ Uout,
                unsigned int* __restrict__ tcnt) {
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
    PairQuery<TIE> qa, qb;
    // TIE: a's plateau rows are the lanes g < 6, row g; b's rows g + 8
    const float* zp_ = TIE ? zrow + (long long)p * 16 : nullptr;
    qa.init(2 * p, true, ks_, ke_, sig, tau, kj, Cq, eps_raw, sinks, window, n0, tile_n,
            TIE ? zp_[0] : 0.f, TIE && g < 6 ? zp_[g] : -1.f);
    qb.init(2 * p + 1, 2 * p + 1 < Qn, ks_, ke_, sig, tau, kj, Cq, eps_raw, sinks, window, n0,
            tile_n, TIE ? zp_[8] : 0.f, TIE && g < 6 ? zp_[g + 8] : -1.f);
    const bool va = qa.lo_i < qa.hi_i, vb = qb.lo_i < qb.hi_i;
    if (va || vb) {
      Scorer::Rows<1> A;
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
        Scorer::mma<1>(A, KeysSmem{sk + b * 32 * ROWH}, lane, Cm);
        float xa[8], xb[8];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
#pragma unroll
          for (int v = 0; v < 2; ++v) {
            // fmaf(1, y, x) = x + y (one rounding), fmaf(0, y, x) = x exactly for finite y.
            // y is the partner's row on lanes g < 6: a NaN there would erase this query's
            // term (fmaf(0, NaN, x) = NaN, fmaxf(NaN, 0) = 0), so screen.pair_plan zeroes
            // the rows of invalid plans — the only plans with NaN rows (plan.cu header) —
            // and every row here is finite.
            const float sa_ = fmaf(aux_a, Cm[u][0][2 + v], Cm[u][0][v]);
            const float sb_ = fmaf(aux_b, Cm[u][0][v], Cm[u][0][2 + v]);
            xa[2 * u + v] = wa * fmaxf(sa_, 0.f);
            xb[2 * u + v] = wb * fmaxf(sb_, 0.f);
          }
        }
        const float uha = reduce8(xa, lane), uhb = reduce8(xb, lane);
        bool pa = false, pb = false;
        if constexpr (TIE) {
          // Zero plateau (screen_impl): a's logits are the rows g (elements v), b's the rows
          // g + 8 (elements 2 + v); lanes g ≥ 6 hold aux rows (z = −1: no condition).
          if (qa.zp) {
            float xs[4][2];
#pragma unroll
            for (int u = 0; u < 4; ++u) xs[u][0] = Cm[u][0][0], xs[u][1] = Cm[u][0][1];
            pa = qa.plateau(xs, sr, b, lane & 3, lane);
          }
          if (qb.zp) {
            float xs[4][2];
#pragma unroll
            for (int u = 0; u < 4; ++u) xs[u][0] = Cm[u][0][2], xs[u][1] = Cm[u][0][3];
            pb = qb.plateau(xs, sr, b, lane & 3, lane);
          }
        }
        const int i = b * 32 + pos;
        const float al = sa[i], sri = sr[i];
        qa.test(uha, pa, b, i, pos, lane, al, sri, eps_out, spm, Uout, tcnt, N, n0);
        qb.test(uhb, pb, b, i, pos, lane, al, sri, eps_out, spm, Uout, tcnt, N, n0);
      }
    }
    if (lane < nb) surv[(long long)qa.t * NW + (n0 >> 5) + lane] = qa.word;
    if (lane < nb && 2 * p + 1 < Qn) surv[(long long)qb.t * NW + (n0 >> 5) + lane] = qb.word;
    if constexpr (TIE) {
      if (tcnt != nullptr && lane == 0 && qa.tie) atomicAdd(tcnt + qa.t, qa.tie);
      if (tcnt != nullptr && lane == 0 && qb.tie) atomicAdd(tcnt + qb.t, qb.tie);
    }
  }
}

extern "C" __global__ void __launch_bounds__(256) screen_pair(SCREEN_PARAMS_IN,
                                                              SCREEN_PARAMS_KEYS) {
  screen_pair_impl<false>(SCREEN_ARGS_IN, nullptr, nullptr, SCREEN_ARGS_KEYS, nullptr);
}
extern "C" __global__ void __launch_bounds__(256) screen_pair_tie(SCREEN_PARAMS_IN,
                                                                  const int* kj,
                                                                  const float* zrow,
                                                                  SCREEN_PARAMS_KEYS,
                                                                  unsigned int* tcnt) {
  screen_pair_impl<true>(SCREEN_ARGS_IN, kj, zrow, SCREEN_ARGS_KEYS, tcnt);
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

#endif  // DOSA_SCREEN_CU
