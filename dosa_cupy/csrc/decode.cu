// DoSA decode kernels (docs/method.md §10) over a paged FP8 KV cache (the layout of DeepGEMM's
// fp8_paged_mqa_logits): payload e4m3 [num_blocks, 64, 128], scale fp32 [num_blocks, 64],
// block table int32 [B, max_blocks], a visible end ke[r] per query row r = b·next_n + j
// (query j of request b sees logical keys [0, ke[r]); dosa_cupy.decode computes ke).
//
// Every score is dosa::score_batch (common.cuh) on keys gathered into registers (KeysReg,
// the same fragments the prefill refinement uses) times the key's fp32 scale: one
// arithmetic for the dense decode route, the witness scoring and the fused DoSA scan, and
// the same arithmetic as the prefill dense route (a key's score depends only on that key).
//
// Kernels (MT = head tiles of 16; heads padded to 16·MT with zero payload and weight):
//   decode_logits_mt{MT}   dense paged logits out[r, i] (−inf where i ≥ ke[r])
//   decode_fused_mt{MT}    score every visible key, compact records with s ≥ tau[r]
//   decode_witness_mt{MT}  score the (distinct) witnesses of each row, records of the
//                          visible ones (τ is then their K-th record, select_kernel)
// Built by CuPy (RawModule, NVRTC, plain sm_90, -ftz=true) from dosa_cupy/decode.py and
// in CI by nvcc -arch=sm_90 (tests/test_cuda_build.py).
#include "common.cuh"

#define DEC_NEG_INF __int_as_float(0xff800000)
#define DEC_PAGE 64         // tokens per KV block (DeepGEMM paged layout)
#define DEC_WARP_KEYS 256   // logical keys per warp per row in the scans (8 batches of 32)
#define DEC_WIT_KEYS 256    // witness entries per warp per row

using namespace dosa;

// Physical row (block·64 + offset) of logical token `i` of a request (bt_row = its block
// table row).  Also the index of the token's fp32 scale.
__device__ __forceinline__ long long dec_phys(const int* __restrict__ bt_row, int i) {
  return (long long)__ldg(bt_row + (i >> 6)) * DEC_PAGE + (i & (DEC_PAGE - 1));
}

// Key fragments of 32 logical keys through the block table: lane (g, c) loads bytes
// [32c, 32c+32) of key my[u] of group u (my[u] < 0: zero payload, an exact +0 column).
// Same register layout as common.cuh gather_keys (candidate for common.cuh, with the
// address computation as a parameter).
__device__ __forceinline__ void dec_gather(const uint8_t* __restrict__ kv, const int* __restrict__ bt_row,
                                           const int (&my)[4], int lane, KeysReg& K) {
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    K.v[u][0] = make_uint4(0u, 0u, 0u, 0u);
    K.v[u][1] = K.v[u][0];
    if (my[u] >= 0) {
      const uint4* p = reinterpret_cast<const uint4*>(kv + dec_phys(bt_row, my[u]) * DOSA_D + 32 * (lane & 3));
      K.v[u][0] = __ldg(p);
      K.v[u][1] = __ldg(p + 1);
    }
  }
}

// ---------------------------------------------------------------------------------------
// Scan of every visible key of a row.  grid (ceil(L / (warps·DEC_WARP_KEYS)), rows);
// warp w of block x takes logical keys [c0, c0 + DEC_WARP_KEYS), c0 = (x·warps + w)·256.
// FUSED = false: dense logits, out[r·ld + i] for i < ld (−inf where i ≥ ke[r]).
// FUSED = true: records (code << 32 | ~id) of keys with s ≥ tau[r] to rec[r·cap + ·].
// ---------------------------------------------------------------------------------------
template <int MT, bool FUSED>
__device__ void dec_scan_impl(const uint8_t* __restrict__ q, const float* __restrict__ w,
                              const uint8_t* __restrict__ kv, const float* __restrict__ ksc,
                              const int* __restrict__ bt, int max_blocks, const int* __restrict__ ke_,
                              int next_n, long long ld, float* __restrict__ out,
                              const float* __restrict__ tau, unsigned int* __restrict__ count,
                              unsigned long long* __restrict__ rec, long long cap) {
  const int r = blockIdx.y;
  const int b = r / next_n;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const long long c0 = ((long long)blockIdx.x * nw + warp) * DEC_WARP_KEYS;
  const long long c1 = min(c0 + DEC_WARP_KEYS, ld);
  if (c0 >= c1) return;
  const long long hi = min((long long)ke_[r], c1);  // visible part of the span: [c0, hi)
  float* orow = FUSED ? nullptr : out + (long long)r * ld;
  if (c0 >= hi) {
    if (!FUSED)
      for (long long i = c0 + lane; i < c1; i += 32) orow[i] = DEC_NEG_INF;
    return;
  }
  const int* bt_row = bt + (long long)b * max_blocks;
  QRows<MT> A;
  float wlo[MT], whi[MT];
  A.load(q + (long long)r * (MT * 16) * DOSA_D, lane);
  load_weights<MT>(w + (long long)r * (MT * 16), wlo, whi, lane);
  const float tq = FUSED ? tau[r] : 0.f;
  const int g = lane >> 2, pos = batch_pos(lane);
  for (long long i0 = c0; i0 < c1; i0 += 32) {
    const long long id = i0 + pos;
    if (i0 >= hi) {  // warp-uniform: the rest of the span is not visible
      if (!FUSED && id < c1) orow[id] = DEC_NEG_INF;
      continue;
    }
    int my[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const long long x = i0 + 8 * u + g;
      my[u] = x < hi ? (int)x : -1;
    }
    KeysReg Kr;
    dec_gather(kv, bt_row, my, lane, Kr);
    const float sc = score_batch<MT>(A, Kr, wlo, whi, lane);
    const bool vis = id < hi;
    const float s = vis ? sc * __ldg(ksc + dec_phys(bt_row, (int)id)) : DEC_NEG_INF;
    if constexpr (FUSED) {
      warp_emit(vis && s >= tq, s, (int)id, lane, count + r, rec + (long long)r * cap, cap);
    } else {
      if (id < c1) orow[id] = s;
    }
  }
}

// ---------------------------------------------------------------------------------------
// Witness scoring.  wit [B, Wc] int32: per request the distinct witness ids (−1 = empty
// slot).  For row r = (b, j): every witness id in [0, ke[r]) is scored (same arithmetic
// as the scan) and its record appended to rec[r·Wc + ·] (count[r]; cap Wc: never full).
// grid (ceil(Wc / (warps·DEC_WIT_KEYS)), rows).
// ---------------------------------------------------------------------------------------
template <int MT>
__device__ void dec_witness_impl(const uint8_t* __restrict__ q, const float* __restrict__ w,
                                 const uint8_t* __restrict__ kv, const float* __restrict__ ksc,
                                 const int* __restrict__ bt, int max_blocks, const int* __restrict__ ke_,
                                 int next_n, const int* __restrict__ wit, int Wc,
                                 unsigned int* __restrict__ count, unsigned long long* __restrict__ rec) {
  const int r = blockIdx.y;
  const int b = r / next_n;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const long long j0 = ((long long)blockIdx.x * nw + warp) * DEC_WIT_KEYS;
  const long long j1 = min(j0 + DEC_WIT_KEYS, (long long)Wc);
  if (j0 >= j1) return;
  const int ke = ke_[r];
  const int* wrow = wit + (long long)b * Wc;
  // Skip the warp when none of its witnesses is visible (e.g. the empty first step).
  bool any = false;
  for (long long x = j0 + lane; x < j1; x += 32) {
    const int id = wrow[x];
    any |= id >= 0 && id < ke;
  }
  if (!__any_sync(0xffffffffu, any)) return;
  const int* bt_row = bt + (long long)b * max_blocks;
  QRows<MT> A;
  float wlo[MT], whi[MT];
  A.load(q + (long long)r * (MT * 16) * DOSA_D, lane);
  load_weights<MT>(w + (long long)r * (MT * 16), wlo, whi, lane);
  const int g = lane >> 2, pos = batch_pos(lane);
  for (long long x0 = j0; x0 < j1; x0 += 32) {
    int my[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const long long x = x0 + 8 * u + g;
      const int id = x < j1 ? wrow[x] : -1;
      my[u] = (id >= 0 && id < ke) ? id : -1;
    }
    const long long xp = x0 + pos;
    int id = xp < j1 ? wrow[xp] : -1;
    if (id >= ke) id = -1;
    if (!__any_sync(0xffffffffu, id >= 0)) continue;  // warp-uniform
    KeysReg Kr;
    dec_gather(kv, bt_row, my, lane, Kr);
    const float sc = score_batch<MT>(A, Kr, wlo, whi, lane);
    const float s = id >= 0 ? sc * __ldg(ksc + dec_phys(bt_row, id)) : 0.f;
    warp_emit(id >= 0, s, id, lane, count + r, rec + (long long)r * Wc, (long long)Wc);
  }
}

#define DEC_INST(MT)                                                                            \
  extern "C" __global__ void __launch_bounds__(256) decode_logits_mt##MT(                       \
      const uint8_t* q, const float* w, const uint8_t* kv, const float* ksc, const int* bt,    \
      int max_blocks, const int* ke, int next_n, long long ld, float* out) {                    \
    dec_scan_impl<MT, false>(q, w, kv, ksc, bt, max_blocks, ke, next_n, ld, out, nullptr,      \
                             nullptr, nullptr, 0);                                              \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(256) decode_fused_mt##MT(                        \
      const uint8_t* q, const float* w, const uint8_t* kv, const float* ksc, const int* bt,    \
      int max_blocks, const int* ke, int next_n, long long ld, const float* tau,               \
      unsigned int* count, unsigned long long* rec, long long cap) {                            \
    dec_scan_impl<MT, true>(q, w, kv, ksc, bt, max_blocks, ke, next_n, ld, nullptr, tau, count, \
                            rec, cap);                                                          \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(256) decode_witness_mt##MT(                      \
      const uint8_t* q, const float* w, const uint8_t* kv, const float* ksc, const int* bt,    \
      int max_blocks, const int* ke, int next_n, const int* wit, int Wc, unsigned int* count,  \
      unsigned long long* rec) {                                                                \
    dec_witness_impl<MT>(q, w, kv, ksc, bt, max_blocks, ke, next_n, wit, Wc, count, rec);      \
  }
DEC_INST(1)
DEC_INST(2)
DEC_INST(3)
DEC_INST(4)
