// Fused planner (docs/method.md §3–§6, §8): one CUDA block per query builds the whole screening
// plan of `plan.build_plans` — retained heads R, anchor projection and folded weights,
// positive allowance E, negative aggregate a_A with its two e4m3 aux rows, coordinate
// envelope J and the RMS coefficient C — in shared memory and registers.  Host code and
// its CPU emulation: dosa_cupy/plan.py build_plans_fused, tests/test_plan_fused.py.
//
// SPECIFICATION: dosa_cupy/plan.py `build_plans`.  Every formula below is that code's
// formula with the same float64 operations and the same outward allowances ((1+MU),
// MU·mplan, MU·amag, MU·(|w|+fold)); only the *summation order* of the reductions differs
// (warp trees instead of CuPy's einsum/sum kernels, whose order is unspecified anyway).
// That is legal by the plan's rounding argument (plan.py docstring): every float64
// quantity is a sum/product tree with ≤ 2^14 successive roundings (u = 2^-53), whose error
// in ANY evaluation order is covered by the relative allowance MU = 2^-30 of its magnitude
// sum.  Exact-by-construction pieces: the Gram entries q_h·q_j and ‖q_h‖² are sums of
// ≤ 128 products of e4m3 values (multiples of 2^-18, |sum| < 2^25: < 43 bits) and are
// therefore EXACT in float64 in every order — so ‖q‖, the anchor choice and β equal the
// CuPy values bit for bit (β uses q_j*q_j where CuPy writes q_j**2; both are one rounding
// of the same real for the values that occur, and any β ≥ 0 is valid, Prop. 1).
//
// Choices that only affect efficiency (docs/method.md §3, §5: the bound holds for ANY R, any
// anchor, any A):
//  * activation frequencies p_h: fp32 dots x = q·k over the sample keys (products of e4m3
//    values are exact in fp32; the sum runs over d = 0..127 in order with fmaf, one valid
//    fp32 order — CuPy's einsum order is unspecified, so a dot within rounding of 0 may
//    land on the other side of 0 and change p_h by 1/ns);
//  * the priority sort of _choose_R: rank = #{j : key_j > key_h} + #{j < h : key_j ==
//    key_h}, i.e. a STABLE descending sort by (key, head index), the same order as
//    plan._choose_R's stable argsort (any R is valid; equal tie rules make the two
//    planners comparable field by field, tests/test_plan_fused.py).
//  * argmax of the anchor ratio: the first maximum (lowest head index), as cupy.argmax.
// NaN inputs (e4m3 NaN codes, NaN weights) make J and C NaN, so `valid` is false and the
// query takes the full-domain recovery (docs/method.md §7 C.3); the kernel keeps every index
// in range for them (NaN priority keys are mapped to −1) but does not mirror CuPy's NaN
// ordering.
//
// Launch: grid (Qn), block PLAN_THREADS = 256, dynamic shared memory
// plan_smem_bytes(Hp) = Hp·128·4 (q as fp32) + max(Hp·128·8 (u_h), 128·PLAN_KC·4 (sample
// key chunk)) bytes — 96 KB at Hp = 64 (the host raises the opt-in limit).
// Heads are padded to Hp = 16·MT (pad_heads: zero rows, zero weights).
#include <cuda_fp8.h>

#include "common.cuh"

#define PLAN_THREADS 256
#define PLAN_WARPS 8
#define PLAN_KC 64  // sample keys per chunk of the activation-frequency pass
#define PLAN_HMAX 64
#define PLAN_I8_BLOCKS 3  // plan_i8_mt*: blocks per SM (≤ 85 registers; shared memory fits 3)
#define PLAN_ACT_STRIDE 160  // bytes per row of the activation images (conflict-free uint2 loads)

namespace {

constexpr double MU = 0x1p-30;     // plan.MU
constexpr double ONE_MU = 1.0 + 0x1p-30;

// Exact value of an e4m3 code (NaN for S.1111.111): (8+m)·2^(e−10), subnormals m·2^-9.
__device__ __forceinline__ float e4m3_val(uint32_t b) {
  const uint32_t e = (b >> 3) & 15u, m = b & 7u;
  float v;
  if (e == 15u && m == 7u) {
    v = __int_as_float(0x7fc00000);
  } else if (e == 0u) {
    v = (float)m * 0x1p-9f;
  } else {
    v = (float)(8u + m) * __int_as_float((int)(e - 10u + 127u) << 23);
  }
  return (b & 0x80u) ? -v : v;
}

// plan.py's e4m3 rounding (e4m3_round.cu e4m3_round_f64): double → float (RN) → e4m3
// satfinite RN.
__device__ __forceinline__ uint8_t e4m3_round(double x) {
  return (uint8_t)__nv_cvt_float_to_fp8((float)x, __NV_SATFINITE, __NV_E4M3);
}

__device__ __forceinline__ double warp_sum(double x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = __dadd_rn(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// The exponent field of one k32 step of an e4m3 row — its 32 codes in c0, c1 (plan.step_exponents
// on the bytes): the largest field of its nonzero codes, a subnormal's counted as 1; 0 for a
// step of zeros (no term).  The step's power of two is 2^(field − 7).
__device__ __forceinline__ int step_field(uint4 c0, uint4 c1) {
  const uint32_t wd[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
  int fmax = 0;
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const uint32_t b = (wd[i >> 2] >> (8 * (i & 3))) & 0xffu;
    const int f = (b & 0x7fu) ? max((int)((b >> 3) & 15u), 1) : 0;
    fmax = max(fmax, f);
  }
  return fmax;
}

// The activation pass's integer image of one row of e4m3 codes (plan.activation_image_trunc;
// docs/method.md §2 "activation frequency"): with e' = max(e, 1) the exponent field of a
// nonzero finite code (S its significand, 8 + m or m for a subnormal) and F the largest e'
// of the row, the code's magnitude S·2^(e'−10) times 2^(13−F), truncated toward zero:
// (S << 3) >> (F − e') ∈ [0, 120], the sign kept; zero and NaN codes give 0.  Four lanes
// 4i .. 4i+3 of one warp hold one row, 32 codes each (c0, c1), and write its 32 bytes to dst.
__device__ __forceinline__ void activation_image_quarter(uint4 c0, uint4 c1, uint8_t* dst) {
  const uint32_t wd[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
  int F = 0;
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const uint32_t a = (wd[i >> 2] >> (8 * (i & 3))) & 0x7fu;
    if (a != 0u && a != 0x7fu) F = max(F, max((int)(a >> 3), 1));
  }
  F = max(F, __shfl_xor_sync(0xffffffffu, F, 1));
  F = max(F, __shfl_xor_sync(0xffffffffu, F, 2));
  uint32_t out[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    uint32_t packed = 0u;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t b = (wd[j] >> (8 * i)) & 0xffu, a = b & 0x7fu, e = a >> 3;
      const int ef = e ? (int)e : 1;
      const uint32_t S = e ? 8u + (a & 7u) : (a & 7u);
      const int mag = (a != 0u && a != 0x7fu) ? (int)((S << 3) >> (F - ef)) : 0;
      packed |= ((uint32_t)((b & 0x80u) ? -mag : mag) & 0xffu) << (8 * i);
    }
    out[j] = packed;
  }
  reinterpret_cast<uint4*>(dst)[0] = make_uint4(out[0], out[1], out[2], out[3]);
  reinterpret_cast<uint4*>(dst)[1] = make_uint4(out[4], out[5], out[6], out[7]);
}

// Quarter `part` (32 codes) of sample key s of the activation pass into v0, v1 — zeros past
// the sample's ns keys (their dots are 0: not active).
__device__ __forceinline__ void sample_quarter(const uint8_t* __restrict__ kp,
                                               const int* __restrict__ sample, int ns, int s,
                                               int part, uint4& v0, uint4& v1) {
  v0 = v1 = make_uint4(0u, 0u, 0u, 0u);
  if (s < ns) {
    const uint4* src = reinterpret_cast<const uint4*>(kp + (long long)sample[s] * DOSA_D + 32 * part);
    v0 = src[0];
    v1 = src[1];
  }
}

// Dot of two head vectors held as 4 dims per lane (lane owns dims 4·lane .. 4·lane+3).
__device__ __forceinline__ double dot4(const double (&a)[4], const double (&b)[4]) {
  double s = __dmul_rn(a[0], b[0]);
  s = __dadd_rn(s, __dmul_rn(a[1], b[1]));
  s = __dadd_rn(s, __dmul_rn(a[2], b[2]));
  s = __dadd_rn(s, __dmul_rn(a[3], b[3]));
  return warp_sum(s);
}

__device__ __forceinline__ void load4(const float* __restrict__ row, int lane, double (&v)[4]) {
  const float4 f = *reinterpret_cast<const float4*>(row + 4 * lane);
  v[0] = f.x; v[1] = f.y; v[2] = f.z; v[3] = f.w;
}

// NaN-propagating min (cupy.minimum).
__device__ __forceinline__ double nan_min(double a, double b) {
  return (a != a || b != b) ? __longlong_as_double(0x7ff8000000000000ll) : (a < b ? a : b);
}

}  // namespace

// Per-query plan.  Outputs (row t of each): rows uint8 [16·mts, 128], omega fp32 [16·mts],
// sigma fp32, C fp64, valid uint8 (bool), counts int32 [3] = (|R|, |P|, |A|), inR / inA
// uint8 [Hp], w_fold fp64 [Hp], a_A fp64 [128], E fp64, eps_raw fp64.
// g_scr, g_ref: the screening / reference arithmetic coefficients of plan.py (host);
// eps_base, a_step, a_epi: ε_raw's constant part and the factors of the canonical scorer's
// per-head constant (plan.allowance_factors; a_step = 0 for the f16 chain, which has none).
template <int MT, bool I8>
__device__ void plan_impl(const uint8_t* __restrict__ q, const float* __restrict__ w,
                          const uint8_t* __restrict__ kp, const int* __restrict__ sample, int ns,
                          int r, int mts, double g_scr, double g_ref, uint8_t* __restrict__ rows,
                          float* __restrict__ omega, float* __restrict__ sigma_out,
                          double* __restrict__ C_out, uint8_t* __restrict__ valid_out,
                          int* __restrict__ counts, uint8_t* __restrict__ inR_out,
                          uint8_t* __restrict__ inA_out, double* __restrict__ wfold_out,
                          double* __restrict__ aA_out, double* __restrict__ E_out,
                          double eps_base, double a_step, double a_epi,
                          double* __restrict__ epsraw_out) {
  constexpr int Hp = 16 * MT;
  constexpr int TH = Hp / PLAN_WARPS;  // heads per warp in the activation pass
  static_assert(PLAN_THREADS == 32 * PLAN_WARPS && PLAN_THREADS == 4 * PLAN_KC, "layout");
  static_assert(Hp <= PLAN_HMAX && PLAN_THREADS >= 2 * DOSA_D, "layout");
  const int t = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  extern __shared__ __align__(16) unsigned char plan_smem[];
  float* qs = reinterpret_cast<float*>(plan_smem);                        // [Hp][128]
  double* us = reinterpret_cast<double*>(plan_smem + Hp * DOSA_D * 4);    // [Hp][128]
  float* ks = reinterpret_cast<float*>(us);                               // [128][KC]
  // I8: no u_h rows (recomputed where read); the activation images of q and of one chunk of
  // sample keys, int8 [Hp + KC][PLAN_ACT_STRIDE], follow q
  uint8_t* qi = plan_smem + Hp * DOSA_D * 4;
  uint8_t* ki = qi + Hp * PLAN_ACT_STRIDE;

  __shared__ double wf[Hp], qn[Hp], pf[Hp], key[Hp], beta[Hp], wt[Hp], dn[Hp], gbest[Hp];
  __shared__ int order[Hp], jstar[Hp], plist[Hp];
  __shared__ unsigned char inR[Hp], isP[Hp], isA[Hp], use[Hp];
  __shared__ double aA[DOSA_D], amag[DOSA_D], eA[DOSA_D], v0f[DOSA_D], v1f[DOSA_D];
  __shared__ __align__(16) uint8_t v0b[DOSA_D];
  __shared__ __align__(16) uint8_t v1b[DOSA_D];
  __shared__ double red[PLAN_WARPS], gram_part[PLAN_WARPS], eps_part[PLAN_WARPS];
  __shared__ double sig_s, E_s;
  __shared__ int nR_s, nP_s, nA_s;

  // ---- Load: e4m3 payload → exact fp32 in shared memory; weights → float64. ----
  const uint8_t* qt = q + (long long)t * Hp * DOSA_D;
  for (int i = tid; i < Hp * DOSA_D / 4; i += PLAN_THREADS) {
    const uint32_t b = reinterpret_cast<const uint32_t*>(qt)[i];
    reinterpret_cast<float4*>(qs)[i] =
        make_float4(e4m3_val(b & 0xffu), e4m3_val((b >> 8) & 0xffu), e4m3_val((b >> 16) & 0xffu),
                    e4m3_val(b >> 24));
  }
  if (tid < Hp) wf[tid] = (double)w[(long long)t * Hp + tid];

  // ---- The canonical scorer's per-head constant (plan.scorer_allowance, dot_allowance):
  // a_h = ((Σ_s 2^(eq_s))·a_step·a_epi)·(1 + MU), eq_s the largest exponent of head h's
  // nonzero codes in k32 step s (plan.step_exponents: on the bytes, subnormal field 1),
  // and ε_raw = eps_base + (Σ_h |w_h|·a_h)·(1 + MU).  Thread 4h + s reads step s of head
  // h; the four powers of two (exponents −6..8) add exactly in any order; the sum over heads
  // runs in another order than CuPy's (covered by MU, header).  ----
  {
    const int h = tid >> 2, s = tid & 3;
    double term = 0.0;
    if (h < Hp) {  // whole warps (Hp·4 = 64·MT): the shuffles below see every lane
      const uint4* src = reinterpret_cast<const uint4*>(qt + h * DOSA_D + 32 * s);
      if constexpr (I8) activation_image_quarter(src[0], src[1], qi + h * PLAN_ACT_STRIDE + 32 * s);
      const int fmax = step_field(src[0], src[1]);
      double p = fmax > 0 ? ldexp(1.0, fmax - 7) : 0.0;
      p = __dadd_rn(p, __shfl_xor_sync(0xffffffffu, p, 1));  // lanes 4h .. 4h + 3: one warp
      p = __dadd_rn(p, __shfl_xor_sync(0xffffffffu, p, 2));
      const double a = __dmul_rn(__dmul_rn(__dmul_rn(p, a_step), a_epi), ONE_MU);
      if (s == 0) term = __dmul_rn(fabs((double)w[(long long)t * Hp + h]), a);
    }
    const double sum = warp_sum(term);
    if (lane == 0) eps_part[warp] = sum;
  }
  __syncthreads();

  // ---- Norms ‖q_h‖ (exact sum of squares, then one sqrt: = CuPy bit for bit). ----
  for (int h = warp; h < Hp; h += PLAN_WARPS) {
    double a[4];
    load4(qs + h * DOSA_D, lane, a);
    const double s = dot4(a, a);
    if (lane == 0) qn[h] = sqrt(s);
  }

  // ---- Activation frequencies p_h over the sample keys (docs/method.md §3, §5). ----
  if constexpr (I8) {
    // The integer images' dots on the s8 tensor cores (exact in any order: plan.ACTIVATION_I8):
    // warp w takes keys 8w .. 8w+7 of each chunk of KC = 64 and every head tile; lane (g, c)
    // loads bytes 32s + 8c .. +7 of head rows g, g+8 and of key g for k32 step s — logical k
    // 4c..4c+3 ↔ the first four, 16+4c.. ↔ the last four, in A and B alike.
    __shared__ int cnt_s[Hp];
    if (tid < Hp) cnt_s[tid] = 0;
    const int g = lane >> 2, c = lane & 3;
    int cnt[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) cnt[mt][0] = cnt[mt][1] = 0;
    for (int c0 = 0; c0 < ns; c0 += PLAN_KC) {
      __syncthreads();  // previous chunk consumed (the first: q's images written)
      {
        const int kk = tid >> 2, part = tid & 3;
        uint4 v0, v1;
        sample_quarter(kp, sample, ns, c0 + kk, part, v0, v1);
        activation_image_quarter(v0, v1, ki + kk * PLAN_ACT_STRIDE + 32 * part);
      }
      __syncthreads();
      int acc[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0;
#pragma unroll
      for (int st = 0; st < 4; ++st) {
        const uint2 b =
            *reinterpret_cast<const uint2*>(ki + (8 * warp + g) * PLAN_ACT_STRIDE + 32 * st + 8 * c);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const uint8_t* qa = qi + (16 * mt + g) * PLAN_ACT_STRIDE + 32 * st + 8 * c;
          const uint2 lo = *reinterpret_cast<const uint2*>(qa);
          const uint2 hi = *reinterpret_cast<const uint2*>(qa + 8 * PLAN_ACT_STRIDE);
          dosa::mma_s8(acc[mt], lo.x, hi.x, lo.y, hi.y, b.x, b.y);
        }
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        cnt[mt][0] += (acc[mt][0] > 0) + (acc[mt][1] > 0);  // head 16mt + g, keys 2c, 2c+1
        cnt[mt][1] += (acc[mt][2] > 0) + (acc[mt][3] > 0);  // head 16mt + g + 8
      }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        int v = cnt[mt][half];
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        if (c == 0 && v) atomicAdd(&cnt_s[16 * mt + 8 * half + g], v);
      }
    __syncthreads();
    // cupy.mean of a bool array = count / ns in float64 (one rounding); no sample: 0.5
    if (tid < Hp) pf[tid] = ns > 0 ? (double)cnt_s[tid] / (double)ns : 0.5;
  } else {
  // Warp w owns heads [w·TH, w·TH + TH); lane owns keys 2·lane, 2·lane+1 of each chunk of
  // KC = 64 keys, stored transposed ks[d][key] (conflict-free float2 loads; q broadcast).
  {
    int cnt[TH];
#pragma unroll
    for (int i = 0; i < TH; ++i) cnt[i] = 0;
    for (int c0 = 0; c0 < ns; c0 += PLAN_KC) {
      __syncthreads();  // previous chunk consumed
      {
        const int kk = tid >> 2, part = tid & 3;  // 64 keys × 4 quarters of 32 bytes
        uint4 v0, v1;
        sample_quarter(kp, sample, ns, c0 + kk, part, v0, v1);
        const uint32_t wd[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
        for (int i = 0; i < 32; ++i)
          ks[(32 * part + i) * PLAN_KC + kk] = e4m3_val((wd[i >> 2] >> (8 * (i & 3))) & 0xffu);
      }
      __syncthreads();
      float acc[TH][2];
#pragma unroll
      for (int i = 0; i < TH; ++i) acc[i][0] = acc[i][1] = 0.f;
#pragma unroll 2
      for (int d = 0; d < DOSA_D; d += 4) {
        float2 kv[4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
          kv[j] = reinterpret_cast<const float2*>(ks + (d + j) * PLAN_KC)[lane];
#pragma unroll
        for (int i = 0; i < TH; ++i) {
          const float4 qv = *reinterpret_cast<const float4*>(qs + (warp * TH + i) * DOSA_D + d);
          acc[i][0] = fmaf(qv.x, kv[0].x, acc[i][0]);
          acc[i][1] = fmaf(qv.x, kv[0].y, acc[i][1]);
          acc[i][0] = fmaf(qv.y, kv[1].x, acc[i][0]);
          acc[i][1] = fmaf(qv.y, kv[1].y, acc[i][1]);
          acc[i][0] = fmaf(qv.z, kv[2].x, acc[i][0]);
          acc[i][1] = fmaf(qv.z, kv[2].y, acc[i][1]);
          acc[i][0] = fmaf(qv.w, kv[3].x, acc[i][0]);
          acc[i][1] = fmaf(qv.w, kv[3].y, acc[i][1]);
        }
      }
#pragma unroll
      for (int i = 0; i < TH; ++i) cnt[i] += (acc[i][0] > 0.f) + (acc[i][1] > 0.f);
    }
#pragma unroll
    for (int i = 0; i < TH; ++i) {
      const int c = dosa::warp_sum_xor(cnt[i]);
      // cupy.mean of a bool array = count / ns in float64 (one rounding); no sample: 0.5
      if (lane == 0) pf[warp * TH + i] = ns > 0 ? (double)c / (double)ns : 0.5;
    }
  }
  }
  __syncthreads();

  // ---- R (docs/method.md §3, plan._choose_R): key = class + x/(1+x), stable descending. ----
  if (tid < Hp) {
    const int h = tid;
    int npos = 0, nneg = 0;
    for (int j = 0; j < Hp; ++j) {
      npos += wf[j] > 0.0;
      nneg += wf[j] < 0.0;
    }
    const bool few = npos <= r;
    const double wh = wf[h];
    const bool pos = wh > 0.0, neg = wh < 0.0;
    const double prio = __dmul_rn(__dmul_rn(fabs(wh), qn[h]), fmin(pf[h], 1.0 - pf[h]));
    const double prim = pos ? 2.0 : ((neg && few) ? 1.0 : 0.0);
    const double sec = pos ? (few ? 0.0 : __dmul_rn(wh, qn[h])) : ((neg && few) ? prio : 0.0);
    double k = __dadd_rn(prim, __ddiv_rn(sec, __dadd_rn(1.0, sec)));
    if (k != k) k = -1.0;  // NaN input: any permutation (the plan is invalid, see above)
    key[h] = k;
    if (h == 0) nR_s = min(npos + (few ? nneg : 0), r);  // min(#{prim > 0}, r)
  }
  __syncthreads();
  if (tid < Hp) {
    const int h = tid;
    const double k = key[h];
    int rk = 0;
    for (int j = 0; j < Hp; ++j) rk += (key[j] > k) || (key[j] == k && j < h);
    order[rk] = h;
    // The first |R| = min(#{prim > 0}, r) heads of the order are retained: a head with
    // prim > 0 has key ≥ 1 > every class-0 key (= 0), so they are all of class 1 or 2.
    const bool R = rk < nR_s;
    inR[h] = R;
    isP[h] = wf[h] > 0.0 && !R;
    isA[h] = wf[h] < 0.0 && !R && pf[h] >= 0.5;
  }
  __syncthreads();
  if (tid == 0) {
    int nP = 0, nA = 0;
    for (int h = 0; h < Hp; ++h) {
      if (isP[h]) plist[nP++] = h;
      nA += isA[h];
    }
    nP_s = nP;
    nA_s = nA;
  }
  __syncthreads();

  // ---- Anchor projection (docs/method.md §4, Prop. 1) for h ∈ P: warp per head. ----
  // ratio_j = [q_h·q_j]_+/‖q_j‖ for j ∈ R with ‖q_j‖ > 0, else −1; j* = first argmax;
  // use = rmax > 0; β = [q_h·q_j*]_+/‖q_j*‖²; d = q_h − β q_j*; u = w_h d.
  const int nP = nP_s;
  for (int ip = warp; ip < nP; ip += PLAN_WARPS) {
    const int h = plist[ip];
    double a[4];
    load4(qs + h * DOSA_D, lane, a);
    double best = -1.0, bestG = 0.0;
    int jb = 0;
    for (int j = 0; j < Hp; ++j) {
      double ratio = -1.0, Gp = 0.0;
      if (inR[j] && qn[j] > 0.0) {
        double b[4];
        load4(qs + j * DOSA_D, lane, b);
        const double G = dot4(a, b);  // exact
        Gp = G > 0.0 ? G : 0.0;
        ratio = __ddiv_rn(Gp, qn[j]);
      }
      if (j == 0 || ratio > best) {
        best = ratio;
        bestG = Gp;
        jb = j;
      }
    }
    const bool u_ = best > 0.0;
    const double qj = qn[jb];
    const double bt = u_ ? __ddiv_rn(bestG, __dmul_rn(qj, qj)) : 0.0;
    double dv[4];
    if (u_) {
      double b[4];
      load4(qs + jb * DOSA_D, lane, b);
#pragma unroll
      for (int i = 0; i < 4; ++i) dv[i] = __dsub_rn(a[i], __dmul_rn(bt, b[i]));
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) dv[i] = a[i];  // q_h − 0·q_j* (q_j* finite)
    }
    const double dnh = sqrt(dot4(dv, dv));
    const double wp = wf[h];
    if constexpr (!I8) {
#pragma unroll
      for (int i = 0; i < 4; ++i) us[h * DOSA_D + 4 * lane + i] = __dmul_rn(wp, dv[i]);
    }
    if (lane == 0) {
      jstar[h] = jb;
      use[h] = u_;
      beta[h] = bt;
      dn[h] = dnh;
      gbest[h] = qj;  // ‖q_j*‖ (for mplan)
    }
  }
  __syncthreads();

  // u_h's coordinate d, w_h·(q_h − β_h q_j*) — the anchor projection's operations again (I8
  // keeps no u_h rows, for occupancy: docs/method.md §2 "activation frequency").
  auto u_coord = [&](int h, int d) -> double {
    const double a = (double)qs[h * DOSA_D + d];
    const double dv = use[h] ? __dsub_rn(a, __dmul_rn(beta[h], (double)qs[jstar[h] * DOSA_D + d])) : a;
    return __dmul_rn(wf[h], dv);
  };

  // ---- Folded weights w̃_j = w_j + Σ_{h∈P, j*_h=j} w_h β_h (h ascending). ----
  if (tid < Hp) {
    const int j = tid;
    double fold = 0.0;
    for (int ip = 0; ip < nP; ++ip) {
      const int h = plist[ip];
      if (use[h] && jstar[h] == j) fold = __dadd_rn(fold, __dmul_rn(wf[h], beta[h]));
    }
    wt[j] = __dadd_rn(wf[j], fold);
    key[j] = fold;  // reuse: fold_j for the J envelope
  }

  // ---- E_joint's Gram term Σ_{h,l∈P} |u_h·u_l| (pairs h ≤ l, off-diagonal counted twice:
  // ×2 is exact); usum = ‖Σ_h u_h‖. ----
  {
    double part = 0.0;
    const int npair = nP * (nP + 1) / 2;
    for (int pi = warp; pi < npair; pi += PLAN_WARPS) {
      // pair index → (a ≤ b): row a holds nP − a pairs
      int a = 0, rem = pi;
      while (rem >= nP - a) {
        rem -= nP - a;
        ++a;
      }
      const int b = a + rem;
      double ubuf[8];  // I8: u_h's coordinates recomputed (no u_h rows)
      const double* ua = ubuf;
      const double* ub = ubuf + 4;
      if constexpr (!I8) {
        ua = us + plist[a] * DOSA_D + 4 * lane;
        ub = us + plist[b] * DOSA_D + 4 * lane;
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          ubuf[i] = u_coord(plist[a], 4 * lane + i);
          ubuf[4 + i] = u_coord(plist[b], 4 * lane + i);
        }
      }
      double s = __dmul_rn(ua[0], ub[0]);
      s = __dadd_rn(s, __dmul_rn(ua[1], ub[1]));
      s = __dadd_rn(s, __dmul_rn(ua[2], ub[2]));
      s = __dadd_rn(s, __dmul_rn(ua[3], ub[3]));
      s = fabs(warp_sum(s));
      part = __dadd_rn(part, a == b ? s : 2.0 * s);
    }
    __syncthreads();
    if (lane == 0) gram_part[warp] = part;
  }
  if (tid < DOSA_D) {
    double s = 0.0;
    for (int ip = 0; ip < nP; ++ip)
      s = __dadd_rn(s, I8 ? u_coord(plist[ip], tid) : us[plist[ip] * DOSA_D + tid]);
    const double sq = warp_sum(__dmul_rn(s, s));
    if (lane == 0) red[warp] = sq;
  }
  __syncthreads();
  if (tid == 0) {
    double ugram = 0.0;
    for (int i = 0; i < PLAN_WARPS; ++i) ugram = __dadd_rn(ugram, gram_part[i]);
    const double usum = sqrt(__dadd_rn(__dadd_rn(red[0], red[1]), __dadd_rn(red[2], red[3])));
    double E_tri = 0.0, mplan = 0.0;
    for (int ip = 0; ip < nP; ++ip) {
      const int h = plist[ip];
      E_tri = __dadd_rn(E_tri, __dmul_rn(wf[h], dn[h]));
      mplan = __dadd_rn(mplan, __dmul_rn(wf[h], __dadd_rn(qn[h], __dmul_rn(beta[h], gbest[h]))));
    }
    const double E_joint = __dmul_rn(0.5, __dadd_rn(usum, sqrt(ugram)));
    E_s = __dadd_rn(__dmul_rn(nan_min(E_tri, E_joint), ONE_MU), __dmul_rn(MU, mplan));
  }

  // ---- Negative aggregate a_A = Σ_{h∈A} |w_h| q_h and amag = Σ_{h∈A} |w_h||q_h|
  // (docs/method.md §5, Prop. 2): threads 0..127 / 128..255, one coordinate each. ----
  {
    const int d = tid & (DOSA_D - 1);
    const bool mag = tid >= DOSA_D;
    double s = 0.0;
    for (int h = 0; h < Hp; ++h)
      if (isA[h]) {
        const double x = (double)qs[h * DOSA_D + d];
        s = __dadd_rn(s, __dmul_rn(fabs(wf[h]), mag ? fabs(x) : x));
      }
    if (mag) {
      amag[d] = s;
    } else {
      aA[d] = s;
      double m = fabs(s);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) m = fmax(m, __shfl_xor_sync(0xffffffffu, m, o));
      if (lane == 0) red[4 + warp] = m;  // warps 0..3 (red[0..3] hold the usum parts)
    }
  }
  __syncthreads();
  // σ = the least power of two ≥ amax/448 (plan.py: frexp/ldexp), then the aux rows
  // (docs/method.md §8): z = a/σ, v0 = e4m3(z), v1 = e4m3(z − v0), e_A = (z − v0 − v1)·σ.
  if (tid == 0) {
    const double amax = fmax(fmax(red[4], red[5]), fmax(red[6], red[7]));
    int e;
    const double m = frexp(amax > 0.0 ? amax / 448.0 : 1.0, &e);
    sig_s = ldexp(1.0, m == 0.5 ? e - 1 : e);
  }
  __syncthreads();
  const double sig = sig_s;
  if (tid < DOSA_D) {
    const int d = tid;
    const double z = aA[d] / sig;
    const uint8_t b0 = e4m3_round(z);
    const double r1 = __dsub_rn(z, (double)e4m3_val(b0));
    const uint8_t b1 = e4m3_round(r1);
    const double f1 = (double)e4m3_val(b1);
    eA[d] = __dmul_rn(__dsub_rn(r1, f1), sig);
    v0b[d] = b0;
    v1b[d] = b1;
    v0f[d] = (double)e4m3_val(b0);
    v1f[d] = f1;
  }
  __syncthreads();

  // ---- Plan rows and folded weights: slot i ← head order[i] (i < |R|), rows 16(mts−1)+7
  // and +15 ← v0, v1 (row_slots: slot i sits in row i, or i+1 from row last+7 on). ----
  const int nR = nR_s;
  const int nrow = 16 * mts, last = 16 * (mts - 1);
  for (int idx = tid; idx < nrow * 8; idx += PLAN_THREADS) {
    const int row = idx >> 3, c = idx & 7;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (row == last + 7 || row == last + 15) {
      v = reinterpret_cast<const uint4*>(row == last + 7 ? v0b : v1b)[c];
    } else {
      const int slot = row < last + 7 ? row : row - 1;
      if (slot < nR)
        v = reinterpret_cast<const uint4*>(qt + order[slot] * DOSA_D)[c];
    }
    reinterpret_cast<uint4*>(rows + ((long long)t * nrow + row) * DOSA_D)[c] = v;
  }
  if (tid < nrow) {
    const int row = tid;
    float om = 0.f;
    if (row != last + 7 && row != last + 15) {
      const int slot = row < last + 7 ? row : row - 1;
      if (slot < nR) om = (float)wt[order[slot]];
    }
    omega[(long long)t * nrow + row] = om;
  }

  // ---- Coordinate envelope J (docs/method.md §8) and C = √D (E + ‖J‖(1+MU)) (1+MU). ----
  // om_d = fp32(w̃) for j ∈ R (the stored ω); dom = |w̃ − om_d| + MU(|w| + fold).
  if (tid < DOSA_D) {
    const int d = tid;
    double t1 = 0.0, t2 = 0.0, t3 = 0.0;
    for (int h = 0; h < Hp; ++h) {
      const double aq = fabs((double)qs[h * DOSA_D + d]);
      if (inR[h]) {
        const double omd = (double)(float)wt[h];
        const double dom =
            __dadd_rn(fabs(__dsub_rn(wt[h], omd)), __dmul_rn(MU, __dadd_rn(fabs(wf[h]), key[h])));
        t1 = __dadd_rn(t1, __dmul_rn(dom, aq));
        t2 = __dadd_rn(t2, __dmul_rn(fabs(omd), aq));
      }
      t3 = __dadd_rn(t3, __dmul_rn(fabs(wf[h]), aq));
    }
    double J = __dadd_rn(fabs(eA[d]), __dmul_rn(MU, amag[d]));
    J = __dadd_rn(J, t1);
    J = __dadd_rn(J, __dmul_rn(g_scr, __dadd_rn(t2, __dmul_rn(sig, __dadd_rn(fabs(v0f[d]),
                                                                              fabs(v1f[d]))))));
    J = __dadd_rn(J, __dmul_rn(g_ref, t3));
    const double sq = warp_sum(__dmul_rn(J, J));
    if (lane == 0) red[warp] = sq;
    aA_out[(long long)t * DOSA_D + d] = aA[d];
  }
  if (tid < Hp) {
    const int h = tid;
    inR_out[(long long)t * Hp + h] = inR[h];
    inA_out[(long long)t * Hp + h] = isA[h];
    wfold_out[(long long)t * Hp + h] = wt[h];
  }
  __syncthreads();
  if (tid == 0) {
    const double Jn =
        __dmul_rn(sqrt(__dadd_rn(__dadd_rn(red[0], red[1]), __dadd_rn(red[2], red[3]))), ONE_MU);
    const double E = E_s;
    const double C = __dmul_rn(__dmul_rn(sqrt(128.0), __dadd_rn(E, Jn)), ONE_MU);
    C_out[t] = C;
    E_out[t] = E;
    double S = 0.0;  // Σ_h |w_h|·a_h: the warps' sums in order
    for (int i = 0; i < PLAN_WARPS; ++i) S = __dadd_rn(S, eps_part[i]);
    epsraw_out[t] = __dadd_rn(eps_base, __dmul_rn(S, ONE_MU));
    sigma_out[t] = (float)sig;
    // σ is stored as fp32 (plan.py: the same test): an fp32 overflow would make the screen
    // weigh the aux rows by −inf, so such a plan is invalid (query-level recovery)
    valid_out[t] = isfinite(C) && isfinite(sig) && isfinite((float)sig);
    counts[3 * t + 0] = nR;
    counts[3 * t + 1] = nP_s;
    counts[3 * t + 2] = nA_s;
  }
}

// The planner's kernels: plan_mt<MT> (fp32 activation dots, in order) and plan_i8_mt<MT> (the
// activation images' dots on the s8 tensor cores: plan.ACTIVATION_I8).
#define PLAN_BOUNDS __launch_bounds__(PLAN_THREADS)
#define PLAN_BOUNDS_I8 __launch_bounds__(PLAN_THREADS, PLAN_I8_BLOCKS)
#define PLAN_KERNEL(NAME, MT, I8, BOUNDS)                                                      \
  extern "C" __global__ void BOUNDS NAME(                                                      \
      const uint8_t* __restrict__ q, const float* __restrict__ w,                              \
      const uint8_t* __restrict__ kp, const int* __restrict__ sample, int ns, int r, int mts,  \
      double g_scr, double g_ref, uint8_t* __restrict__ rows, float* __restrict__ omega,      \
      float* __restrict__ sigma, double* __restrict__ C, uint8_t* __restrict__ valid,         \
      int* __restrict__ counts, uint8_t* __restrict__ inR, uint8_t* __restrict__ inA,         \
      double* __restrict__ w_fold, double* __restrict__ a_A, double* __restrict__ E,         \
      double eps_base, double a_step, double a_epi, double* __restrict__ eps_raw) {           \
    plan_impl<MT, I8>(q, w, kp, sample, ns, r, mts, g_scr, g_ref, rows, omega, sigma, C,       \
                      valid, counts, inR, inA, w_fold, a_A, E, eps_base, a_step, a_epi,        \
                      eps_raw);                                                                \
  }
#define PLAN_INST(MT) \
  PLAN_KERNEL(plan_mt##MT, MT, false, PLAN_BOUNDS)                \
  PLAN_KERNEL(plan_i8_mt##MT, MT, true, PLAN_BOUNDS_I8)
PLAN_INST(1)
PLAN_INST(2)
PLAN_INST(3)
PLAN_INST(4)

// The FP8 screen's per-row constants (plan.screen_row_constants, "fp8_fresh"; docs/error_model.md
// "An FP8 screen"), one kernel instead of ~25 array operations after the planner
// (plan.ROW_CONSTANTS_KERNEL).  One warp per query t, lane j ≤ nrow its plan row j:
// a_j = (Σ_s 2^(e_s)) · a_step over the row's four k32 steps (e_s: the largest exponent of the
// step's nonzero codes, a subnormal's −6; no term for a step of zeros: plan.step_exponents),
// then out[t] = ((Σ_j |ω_j| a_j + σ_t (a_{last+7} + a_{last+15})) · lift) · (1 + MU) with
// lift = 1 + γ_{2·mts+6}.  The powers of two of one row add exactly and a_j is one rounding,
// as in the specification; the sum over rows is a warp tree where CuPy's order is unspecified
// (the header's rounding argument: MU covers any order).  Launch: grid ⌈Qn / 8⌉, block 256.
extern "C" __global__ void __launch_bounds__(PLAN_THREADS)
    screen_row_constants_fresh(const uint8_t* __restrict__ rows, const float* __restrict__ omega,
                               const double* __restrict__ sigma, int Qn, int nrow,
                               double a_step, double lift, double* __restrict__ out) {
  const int lane = threadIdx.x & 31;
  const int t = blockIdx.x * PLAN_WARPS + (threadIdx.x >> 5);
  if (t >= Qn || nrow > 32) return;  // a whole warp leaves together
  double a = 0.0;
  if (lane < nrow) {
    const uint4* row = reinterpret_cast<const uint4*>(rows + ((long long)t * nrow + lane) * DOSA_D);
    double steps = 0.0;
    for (int s = 0; s < 4; ++s) {
      const int fmax = step_field(row[2 * s], row[2 * s + 1]);
      if (fmax > 0) steps = __dadd_rn(steps, ldexp(1.0, fmax - 7));
    }
    a = __dmul_rn(steps, a_step);
  }
  const double term =
      warp_sum(lane < nrow ? __dmul_rn(fabs((double)omega[(long long)t * nrow + lane]), a) : 0.0);
  const int last = nrow - 16;
  const double a7 = __shfl_sync(0xffffffffu, a, last + 7);
  const double a15 = __shfl_sync(0xffffffffu, a, last + 15);
  if (lane == 0) {
    const double tot = __dadd_rn(term, __dmul_rn(sigma[t], __dadd_rn(a7, a15)));
    out[t] = __dmul_rn(__dmul_rn(tot, lift), ONE_MU);
  }
}
