// Probe of the native e4m3 warpgroup MMA's accumulator (docs/numerics.md "The e4m3 wgmma
// accumulator"; dosa_cupy/bench/fp8_probe.py): the raw fp32 results of chained
// wgmma.m64n64k32.e4m3 steps on crafted operands, so the host can test bit-exact models of
// the hardware sum (dosa_ref.mma_model) — the error model is established on crafted inputs,
// never fitted to random data (docs/error_model.md).  Built as an sm_90a cubin; every other
// target compiles this file to an empty module.
#include "ptx_sm90a.cuh"

// One block of 128 threads (one warpgroup) per case c:
//   a [cases, 64, 128], b [cases, 64, 128]: e4m3 payloads, row-major (K-major operands);
//   c0 [cases, 64, 64] fp32: the accumulators before the first step;
//   order [cases, 4]: step s multiplies dims [32·order[s], 32·order[s] + 32) of every row;
//   steps [cases]: chained k32 steps (1..4), each on the accumulators of the step before;
//   d [cases, 64, 64] fp32: d[m, n] after the last step = c0[m, n] + Σ over the steps of
//   Σ_k a[m, k] b[n, k] as the tensor core sums it.
// NC: the columns of the MMA (64, 32 or 16): the kernels fp8_wgmma_probe (64),
// fp8_wgmma_probe_n32 and fp8_wgmma_probe_n16 take the same cases and write d [cases, 64, 64]
// with the columns they compute (the first NC; the rest untouched).
template <int NC>
__device__ __forceinline__ void wgmma_probe(const uint8_t* __restrict__ a,
                                            const uint8_t* __restrict__ b,
                                            const float* __restrict__ c0,
                                            const int* __restrict__ order,
                                            const int* __restrict__ steps, float* __restrict__ d) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace dosa::wg;
  __shared__ __align__(1024) uint8_t sa[64 * 128];
  __shared__ __align__(1024) uint8_t sb[64 * 128];
  const long long cs = blockIdx.x;
  const int t = threadIdx.x;
  // 64 rows × 8 chunks of 16 bytes per operand: 4 chunks of each per thread, swizzled.
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int it = t + 128 * i, r = it >> 3, j = it & 7;
    const uint4 va = __ldg(reinterpret_cast<const uint4*>(a + cs * 8192 + r * 128 + 16 * j));
    const uint4 vb = __ldg(reinterpret_cast<const uint4*>(b + cs * 8192 + r * 128 + 16 * j));
    *reinterpret_cast<uint4*>(sa + sw128_offset(r, j)) = va;
    *reinterpret_cast<uint4*>(sb + sw128_offset(r, j)) = vb;
  }
  // Shared memory written by ordinary stores and read by the tensor cores (async proxy).
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  const int warp = t >> 5, lane = t & 31;
  float acc[NC / 2];
#pragma unroll
  for (int j = 0; j < NC / 8; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      acc[4 * j + r] = c0[cs * 4096 + acc_row(warp, lane, r) * 64 + acc_col(lane, j, r)];
    }
  const uint64_t da = desc_sw128((uint32_t)__cvta_generic_to_shared(sa));
  const uint64_t db = desc_sw128((uint32_t)__cvta_generic_to_shared(sb));
  const int ns = steps[cs];
  for (int s = 0; s < ns; ++s) {
    const int kc = order[cs * 4 + s];  // + (32·kc bytes >> 4) in the start-address field
    pin(acc);
    fence();
    mma_e4m3<NC>(acc, da + (uint64_t)(2 * kc), db + (uint64_t)(2 * kc), 1);
    commit();
    wait<0>();
    pin(acc);
  }
#pragma unroll
  for (int j = 0; j < NC / 8; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      d[cs * 4096 + acc_row(warp, lane, r) * 64 + acc_col(lane, j, r)] = acc[4 * j + r];
    }
#endif
}

#define DOSA_WGMMA_PROBE(NAME, NC)                                                              \
  extern "C" __global__ void __launch_bounds__(128, 1) NAME(                                    \
      const uint8_t* __restrict__ a, const uint8_t* __restrict__ b, const float* __restrict__ c0, \
      const int* __restrict__ order, const int* __restrict__ steps, float* __restrict__ d) {    \
    wgmma_probe<NC>(a, b, c0, order, steps, d);                                                 \
  }
DOSA_WGMMA_PROBE(fp8_wgmma_probe, 64)
DOSA_WGMMA_PROBE(fp8_wgmma_probe_n32, 32)
DOSA_WGMMA_PROBE(fp8_wgmma_probe_n16, 16)

// Bulk tensor copy probe (dosa_cupy/tma.py): block i copies the box of 64 rows × 128 bytes at
// row 64·i of the tensor map's 2-D uint8 tensor into shared memory (128-byte swizzle) and
// writes the shared bytes unchanged to out[i, 8192], so the host sees both the copy and the
// swizzle.  The map is read from the by-value parameter (from_global = 0: a
// __grid_constant__ parameter) or from global memory (1).
extern "C" __global__ void __launch_bounds__(128, 1) tma_probe(
    const __grid_constant__ dosa::TensorMap tmap, const dosa::TensorMap* __restrict__ gmap,
    int from_global, uint8_t* __restrict__ out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace dosa::wg;
  __shared__ __align__(1024) uint8_t tile[64 * 128];
  __shared__ __align__(8) uint64_t bar;
  if (threadIdx.x == 0) {
    mbar_init(&bar, 1);
    fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbar_expect_tx(&bar, 64 * 128);
    tma_load_2d(tile, from_global ? (const void*)gmap : (const void*)&tmap, &bar, 0, 64 * blockIdx.x);
  }
  mbar_wait(&bar, 0);
  for (int i = threadIdx.x; i < 512; i += 128)
    reinterpret_cast<uint4*>(out + (long long)blockIdx.x * 8192)[i] = reinterpret_cast<const uint4*>(tile)[i];
#endif
}
