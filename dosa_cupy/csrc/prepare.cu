#ifndef DOSA_PREPARE_CU
#define DOSA_PREPARE_CU
#include "stage.cuh"

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

// The square of an e4m3 code's value in units of 2^-18, the value that e4m3_value gives (a
// NaN code's too: (8 + 7)·2^5): normal ((8 + m)·2^(e−10))² = (8 + m)²·2^(2e−2) units,
// subnormal (m·2^-9)² = m² units.  At most 15²·2^28 < 2^36.
__device__ __forceinline__ unsigned long long e4m3_sq_units(uint32_t b) {
  const uint32_t e = (b >> 3) & 15u, m = b & 7u;
  return e ? (unsigned long long)((8u + m) * (8u + m)) << (2u * e - 2u)
           : (unsigned long long)(m * m);
}

// key_rho_kernel's ρ with eight lanes per token (a lane's 16 codes by one 16-byte load) and
// the squares summed as integers (docs/method.md §8 "ρ from integer squares"): a key's 128
// squares are < 2^43 units, so their sum is exact in int64 and converts to fp64 exactly —
// the fp64 sum key_rho_kernel forms (exact in every order), so the same ρ bit for bit.
// Launch: ⌈8N / 256⌉ blocks of 256 (whole warps; a lane past the last token loads nothing);
// payload 16-byte aligned (prepare.key_rho checks).
extern "C" __global__ void key_rho_int_kernel(const uint8_t* __restrict__ payload, long long N,
                                              float* __restrict__ rho) {
  const long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;  // 16-byte chunk
  const bool ok = (c >> 3) < N;
  const uint4 v = ok ? reinterpret_cast<const uint4*>(payload)[c] : make_uint4(0u, 0u, 0u, 0u);
  unsigned long long s = 0ull;
  const uint32_t w4[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 16; ++i) s += e4m3_sq_units((w4[i >> 2] >> (8 * (i & 3))) & 0xffu);
#pragma unroll
  for (int o = 4; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);  // the token's 8
  if (ok && (c & 7) == 0) rho[c >> 3] = rho_of_sumsq((double)s * 0x1p-18);
}

// ---------------------------------------------------------------------------------------
// The value checks of prepare.check_inputs (docs/design.md "Public contract") in one pass, so a
// call reads them back with one synchronization.  Bits of *flags:
// 1 q has an e4m3 NaN code, 2 k_payload has one, 4 w is not finite, 8 ks outside [0, N],
// 16 ke outside [0, N], 32 some ks > ke (the order of prepare._VALUE_ERRORS, then
// prepare.CHECK_ORDER).  q and kp are read as uint4 (16 codes); a byte b is
// a NaN code iff b & 0x7F == 0x7F, i.e. iff (b & 0x7F) + 1 carries into bit 7 — per byte of
// a word, without carries between bytes (at most 0x7F + 1 = 0x80).  Reference:
// dosa_ref.stages.check_values.
// ---------------------------------------------------------------------------------------
__device__ __forceinline__ bool has_nan_code(uint32_t x) {
  return (((x & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u) != 0u;
}

__device__ __forceinline__ bool has_nan_code4(uint4 v) {
  return has_nan_code(v.x) | has_nan_code(v.y) | has_nan_code(v.z) | has_nan_code(v.w);
}

// The ranges are also written clamped to int32 (ks' = clamp(ks, 0, N), ke' = clamp(ke, ks', N)):
// a call may launch its work on them before it reads the flags back (prepare.ValueCheck), and
// clamped ranges keep every kernel in bounds until the call raises.
template <typename I>
__device__ __forceinline__ void check_values_impl(
    const uint4* __restrict__ q, long long nq, const float* __restrict__ w, long long nw,
    const uint4* __restrict__ kp, long long nk, const I* __restrict__ ks, const I* __restrict__ ke,
    long long Qn, long long N, unsigned int* __restrict__ flags, int* __restrict__ ks_out,
    int* __restrict__ ke_out) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  const long long t0 = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  unsigned int f = 0u;
  for (long long i = t0; i < nq; i += stride)
    if (has_nan_code4(__ldg(q + i))) f |= 1u;
  for (long long i = t0; i < nk; i += stride)
    if (has_nan_code4(__ldg(kp + i))) f |= 2u;
  for (long long i = t0; i < nw; i += stride)
    if ((__float_as_uint(__ldg(w + i)) & 0x7f800000u) == 0x7f800000u) f |= 4u;
  for (long long i = t0; i < Qn; i += stride) {
    const long long a = ks[i], b = ke[i];
    if (a < 0 || a > N) f |= 8u;
    if (b < 0 || b > N) f |= 16u;
    if (a > b) f |= 32u;
    const long long a1 = min(max(a, 0ll), N);
    ks_out[i] = (int)a1;
    ke_out[i] = (int)min(max(b, a1), N);
  }
  f = __reduce_or_sync(0xffffffffu, f);
  if ((threadIdx.x & 31) == 0 && f) atomicOr(flags, f);
}

#define CHECK_INST(NAME, I)                                                                       \
  extern "C" __global__ void __launch_bounds__(256) NAME(                                          \
      const uint4* q, long long nq, const float* w, long long nw, const uint4* kp, long long nk,   \
      const I* ks, const I* ke, long long Qn, long long N, unsigned int* flags, int* ks_out,       \
      int* ke_out) {                                                                               \
    check_values_impl<I>(q, nq, w, nw, kp, nk, ks, ke, Qn, N, flags, ks_out, ke_out);              \
  }
CHECK_INST(check_values_i32, int)
CHECK_INST(check_values_i64, long long)

// ---------------------------------------------------------------------------------------
// The scale and envelope checks of prepare.ValueCheck (prepare.SCALE_CHECK_KERNEL) in one
// launch instead of ~15 array operations (the prepare stage's largest line in the profile,
// docs/records/benchmarks.md "the per-row constants' kernel, on an H100"):
// scale_bit when some α is not in [0, FLT_MAX] (scorer.valid_scales), env_bit when some
// query's fp64 Σ_h |w_h| times dot_bound · max(α_max, 1) exceeds envelope_max
// (prepare.envelope_queries with its _DOT_BOUND and ENVELOPE_MAX, α_max over the valid
// scales; never with N = 0).  Since a rounded product is monotone in its factor, "some
// query" is the largest sum's test, so the blocks only reduce two maxima: the valid scales'
// bits (a nonnegative float orders as its bits; −0 counts as +0, bits 0) and the query sums'
// bits (nonnegative doubles likewise) into acc[0], acc[1]; the last block to count itself
// into acc[2] tests them.  A query's sum runs over h in order — another order than CuPy's,
// which can move the test only within a rounding of envelope_max, 8× below FLT_MAX, so either
// order proves the same scores finite (docs/method.md §1 "The scorer's domain").
// acc: uint64 [3], zero.
// ---------------------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(256) check_scales(
    const float* __restrict__ ksc, long long N, const float* __restrict__ w, long long Qn, int H,
    double dot_bound, double envelope_max, unsigned long long* __restrict__ acc,
    unsigned int* __restrict__ flags, unsigned int env_bit, unsigned int scale_bit) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  const long long t0 = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  unsigned int amax = 0u;  // bits of the largest valid α seen
  bool bad = false;
  for (long long i = t0; i < N; i += stride) {
    // 0 ≤ α ≤ FLT_MAX on the bits, as IEEE compares them (a kernel built with -ftz would
    // take a negative subnormal for −0): +0 up to FLT_MAX, or −0
    const unsigned int b = __float_as_uint(__ldg(ksc + i));
    if (b < 0x7f800000u)
      amax = max(amax, b);
    else if (b != 0x80000000u)
      bad = true;
  }
  unsigned long long wmax = 0ull;  // bits of the largest Σ_h |w_h| seen
  for (long long t = t0; t < Qn; t += stride) {
    double s = 0.0;
    for (int h = 0; h < H; ++h) s += fabs((double)__ldg(w + t * H + h));
    if (s > 0.0) wmax = max(wmax, (unsigned long long)__double_as_longlong(s));
  }
  amax = __reduce_max_sync(0xffffffffu, amax);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) wmax = max(wmax, __shfl_xor_sync(0xffffffffu, wmax, o));
  const bool any_bad = __any_sync(0xffffffffu, bad);
  if ((threadIdx.x & 31) == 0) {
    if (amax) atomicMax(acc, (unsigned long long)amax);
    if (wmax) atomicMax(acc + 1, wmax);
    if (any_bad) atomicOr(flags, scale_bit);
  }
  __threadfence();  // this block's maxima are visible before it counts itself done
  __syncthreads();
  if (threadIdx.x == 0 && atomicAdd(acc + 2, 1ull) == gridDim.x - 1) {
    __threadfence();
    const volatile unsigned long long* v = acc;
    const double a = (double)__uint_as_float((unsigned int)v[0]);
    const double ws = __longlong_as_double((long long)v[1]);
    if (N > 0 && ws * (dot_bound * fmax(a, 1.0)) > envelope_max) atomicOr(flags, env_bit);
  }
}

#endif  // DOSA_PREPARE_CU
