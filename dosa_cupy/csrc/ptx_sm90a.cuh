// PTX wrappers of the Hopper-only instructions (sm_90a; docs/design.md "Kernel sources"):
// warpgroup MMA (f16 k16 with A from registers, e4m3 k32 with both operands in shared
// memory), the matrix descriptor of a 128-byte-swizzled K-major tile, mbarriers and the bulk
// tensor copy.  Compiled only for the sm_90a target (__CUDA_ARCH_FEAT_SM90_ALL): every other
// target sees an empty header, so the portable modules never emit these instructions.
#pragma once
#include "ptx.cuh"

namespace dosa {
// A CUtensorMap (the driver's 128-byte, 64-byte-aligned opaque tensor descriptor), encoded on
// the host (dosa_cupy/tma.py) and passed by value as a __grid_constant__ kernel parameter.
struct alignas(64) TensorMap {
  uint64_t w[16];
};
}  // namespace dosa

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace dosa {
namespace wg {

// Matrix descriptor of a 128-byte-swizzled K-major operand: start address, stride between
// 8-row core-matrix groups 1024 bytes (8 rows × 128 B), layout type 1 = 128B swizzle.
__device__ __forceinline__ uint64_t desc_sw128(uint32_t saddr) {
  return (uint64_t)((saddr & 0x3FFFFu) >> 4) | ((uint64_t)1u << 16) |
         ((uint64_t)(1024u >> 4) << 32) | ((uint64_t)1u << 62);
}

// desc_sw128 from its low word: shared addresses are below 2^18, so the step offsets (+2 per
// 32 bytes) never carry into the high word, a constant the compiler keeps out of the
// per-tile arithmetic (desc_of(desc_lo(a)) == desc_sw128(a)).
__device__ __forceinline__ uint32_t desc_lo(uint32_t saddr) {
  return ((saddr & 0x3FFFFu) >> 4) | 0x10000u;
}
__device__ __forceinline__ uint64_t desc_of(uint32_t lo) { return (0x40000040ull << 32) | lo; }

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads/writes across wgmma fences and waits.
template <int M>
__device__ __forceinline__ void pin(float (&d)[M]) {
#pragma unroll
  for (int i = 0; i < M; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int T, int M>
__device__ __forceinline__ void pin(float (&d)[T][M]) {
#pragma unroll
  for (int j = 0; j < T; ++j) pin(d[j]);
}

// Eight fp32 accumulator operands d[i..i+7] of a wgmma (read and written).
#define DOSA_WG_ACC8(d, i)                                                                  \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])

// D (64 × 64, fp32) += A (64 × 16, f16, registers) · B (16 × 64, f16, shared via desc).
__device__ __forceinline__ void mma_m64n64k16(float (&d)[32], uint32_t a0, uint32_t a1,
                                              uint32_t a2, uint32_t a3, uint64_t desc) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, 1, 1, 1, 0;\n"
      : DOSA_WG_ACC8(d, 0), DOSA_WG_ACC8(d, 8), DOSA_WG_ACC8(d, 16), DOSA_WG_ACC8(d, 24)
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
}
// D (64 × 32, fp32) += A (64 × 16, f16, registers) · B (16 × 32, f16, shared via desc): the
// two-tile build's chunk (same k-steps, half the keys).
__device__ __forceinline__ void mma_m64n32k16(float (&d)[16], uint32_t a0, uint32_t a1,
                                              uint32_t a2, uint32_t a3, uint64_t desc) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, 1, 1, 1, 0;\n"
      : DOSA_WG_ACC8(d, 0), DOSA_WG_ACC8(d, 8)
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
}

// D (64 × 64, fp32) = A (64 × 32, e4m3, shared via adesc) · B (32 × 64, e4m3, shared via
// bdesc) + (accumulate ? D : 0).  Both operands K-major (fp8 wgmma has no transpose).
__device__ __forceinline__ void mma_m64n64k32_e4m3(float (&d)[32], uint64_t adesc, uint64_t bdesc,
                                                   int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1;\n}\n"
      : DOSA_WG_ACC8(d, 0), DOSA_WG_ACC8(d, 8), DOSA_WG_ACC8(d, 16), DOSA_WG_ACC8(d, 24)
      : "l"(adesc), "l"(bdesc), "r"(accumulate));
}

// The same e4m3 step for 32 and 16 columns (keys or heads of one query; the probe checks
// that a column's result does not depend on N).
__device__ __forceinline__ void mma_m64n32k32_e4m3(float (&d)[16], uint64_t adesc, uint64_t bdesc,
                                                   int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1;\n}\n"
      : DOSA_WG_ACC8(d, 0), DOSA_WG_ACC8(d, 8)
      : "l"(adesc), "l"(bdesc), "r"(accumulate));
}
__device__ __forceinline__ void mma_m64n16k32_e4m3(float (&d)[8], uint64_t adesc, uint64_t bdesc,
                                                   int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1;\n}\n"
      : DOSA_WG_ACC8(d, 0)
      : "l"(adesc), "l"(bdesc), "r"(accumulate));
}
// The 64 accumulator operands of an N = 128 wgmma: their places %0 .. %63 in the
// instruction and the registers d[0 .. 63] (read and written).
#define DOSA_WG_D64                                                                   \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "           \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "   \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "   \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define DOSA_WG_ACC64(d)                                                                 \
  DOSA_WG_ACC8(d, 0), DOSA_WG_ACC8(d, 8), DOSA_WG_ACC8(d, 16), DOSA_WG_ACC8(d, 24),      \
      DOSA_WG_ACC8(d, 32), DOSA_WG_ACC8(d, 40), DOSA_WG_ACC8(d, 48), DOSA_WG_ACC8(d, 56)

// The same step for 128 columns (the heads of two queries of 64 or four of 32: half the
// shared-memory reads per product of N = 64, docs/design.md "The FP8 dense kernel").
__device__ __forceinline__ void mma_m64n128k32_e4m3(float (&d)[64], uint64_t adesc,
                                                    uint64_t bdesc, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      DOSA_WG_D64 ", "
      "%64, %65, p, 1, 1;\n}\n"
      : DOSA_WG_ACC64(d)
      : "l"(adesc), "l"(bdesc), "r"(accumulate));
}
// f16 with both operands in shared memory (screen_wgt.cu: keys as A, the plan rows of a
// query group as B): D (64 × 128, fp32) = A (64 × 16, f16, shared via da) · B (16 × 128,
// f16, shared via db) + (acc ? D : 0); both operands K-major (transpose flags 0).
__device__ __forceinline__ void mma_m64n128k16_ss(float (&d)[64], uint64_t da, uint64_t db,
                                                  int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      DOSA_WG_D64 ", "
      "%64, %65, p, 1, 1, 0, 0;\n}\n"
      : DOSA_WG_ACC64(d)
      : "l"(da), "l"(db), "r"(acc));
}

// m64nNk32 e4m3 for N = 128, 64, 32, 16 (N/2 accumulators per thread).
template <int N>
__device__ __forceinline__ void mma_e4m3(float (&d)[N / 2], uint64_t adesc, uint64_t bdesc,
                                         int accumulate) {
  if constexpr (N == 128) mma_m64n128k32_e4m3(d, adesc, bdesc, accumulate);
  else if constexpr (N == 64) mma_m64n64k32_e4m3(d, adesc, bdesc, accumulate);
  else if constexpr (N == 32) mma_m64n32k32_e4m3(d, adesc, bdesc, accumulate);
  else mma_m64n16k32_e4m3(d, adesc, bdesc, accumulate);
}

// Where accumulator 4j + r of a thread sits in a 64 × N fp32 wgmma result (the m16n8 layout
// per warp, warp w of the warpgroup on rows 16w..16w+15): row 16w + g + 8·(r/2), column
// 8j + 2c + r%2, with g = lane / 4, c = lane % 4.
__device__ __forceinline__ int acc_row(int warp, int lane, int r) {
  return 16 * warp + (lane >> 2) + 8 * (r >> 1);
}
__device__ __forceinline__ int acc_col(int lane, int j, int r) {
  return 8 * j + 2 * (lane & 3) + (r & 1);
}

// Byte offset of 16-byte chunk j of row r in a 128-byte-swizzled tile of 128-byte rows (the
// 1,024-byte atom of 8 rows; chunk j of row r sits at chunk position j ^ (r mod 8)).
__device__ __forceinline__ int sw128_offset(int r, int j) { return r * 128 + ((j ^ (r & 7)) << 4); }

// ---- mbarrier (shared-memory arrival counter with a transaction count) ----
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"((uint32_t)__cvta_generic_to_shared(bar)),
               "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                   (uint32_t)__cvta_generic_to_shared(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(
                   (uint32_t)__cvta_generic_to_shared(bar)) : "memory");
}
// Spins until the barrier's phase with parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"((uint32_t)__cvta_generic_to_shared(bar)), "r"(parity)
      : "memory");
}
// Makes the barrier initialisation visible to the async proxy (the copy engine).
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// ---- bulk copy: `bytes` contiguous bytes (a multiple of 16, both addresses 16-byte aligned)
// from global into shared memory, completion on `bar` (its transaction count) ----
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          (uint32_t)__cvta_generic_to_shared(dst)),
      "l"(src), "r"(bytes), "r"((uint32_t)__cvta_generic_to_shared(bar))
      : "memory");
}

// ---- bulk tensor copy (TMA): a 2-D box of the tensor map into shared memory ----
// `tmap`: the generic address of a CUtensorMap (a __grid_constant__ parameter or global
// memory); (x, y) the box origin in elements (x: innermost); completion on `bar`.
__device__ __forceinline__ void tma_load_2d(void* dst, const void* tmap, uint64_t* bar, int x, int y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%3, %4}], [%2];\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
      "l"(tmap), "r"((uint32_t)__cvta_generic_to_shared(bar)), "r"(x), "r"(y)
      : "memory");
}

}  // namespace wg
}  // namespace dosa
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
