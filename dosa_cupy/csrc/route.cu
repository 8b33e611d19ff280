#ifndef DOSA_ROUTE_CU
#define DOSA_ROUTE_CU
#include "stage.cuh"

// ---------------------------------------------------------------------------------------
// The route stage's counts (docs/method.md §9 "Route choice"; dosa_cupy/route.py with
// route.COUNT_KERNELS) in one launch per read-back instead of ~25 array operations: the
// decision is host-bound (its profile, docs/records/benchmarks.md "the per-row constants'
// kernel, on an H100"), so each array operation it drops is host time it saves.  Counts only
// feed the cost model; every route returns the same ids.  Sums are 64-bit atomics per warp;
// every output starts zeroed by the host.
// ---------------------------------------------------------------------------------------

// Read-back 1 of route.route_stage for a chunk of Qn queries: out[0] = Σ_t (ke_t − ks_t),
// out[1] = Σ_t (ke_t − ks_t − cnt_t) (the keys left to screen past the default seeds),
// out[2] = 1 when tie_reject and some τ_t is ±0 (screen.tie_screen_flag), and with hist
// out[3 + h] = the queries with h positive weights among w[t, 0 .. Hp)
// (screen.positive_heads_hist).  out: int64 [3 + (hist ? Hp + 1 : 0)].  ks = null: the
// histogram alone, before the seeds exist (route.head_prefetch; ke, cnt and tau unread, out[0]
// to out[2] left as they are).
extern "C" __global__ void __launch_bounds__(256) route_head(
    const int* __restrict__ ks, const int* __restrict__ ke, const unsigned int* __restrict__ cnt,
    const float* __restrict__ tau, const float* __restrict__ w, int Qn, int Hp, int tie_reject,
    int hist, long long* __restrict__ out) {
  const int stride = gridDim.x * blockDim.x;
  long long vis = 0, scr = 0;
  bool tie = false;
  for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < Qn; t += stride) {
    if (ks) {
      const long long v = (long long)ke[t] - (long long)ks[t];
      vis += v;
      scr += v - (long long)cnt[t];
      tie |= tie_reject && (__float_as_uint(tau[t]) & 0x7fffffffu) == 0u;
    }
    if (hist) {
      int n = 0;
      for (int h = 0; h < Hp; ++h) n += dosa::positive_f32(__ldg(w + (long long)t * Hp + h));
      atomicAdd(reinterpret_cast<unsigned long long*>(out + 3 + n), 1ull);
    }
  }
  vis = dosa::warp_sum_xor(vis);
  scr = dosa::warp_sum_xor(scr);
  tie = __any_sync(0xffffffffu, tie);
  if ((threadIdx.x & 31) == 0) {
    if (vis) atomicAdd(reinterpret_cast<unsigned long long*>(out), (unsigned long long)vis);
    if (scr) atomicAdd(reinterpret_cast<unsigned long long*>(out + 1), (unsigned long long)scr);
    if (tie) atomicMax(reinterpret_cast<unsigned long long*>(out + 2), 1ull);
  }
}

// Read-back 2's part of one sampled candidate (route._sample): the n sampled queries' survivor
// bitmask surv uint32 [n, NW] and ranges ks, ke [n] (the sub-batch's), their rows idx [n]
// of the chunk (cnt: the chunk's default seed counts) and plan r [n]: out[0] = the set bits of
// surv, out[1] = Σ_i (ke_i − ks_i − cnt[idx_i]), out[2 + i] = ke_i − ks_i, out[2 + n + i] =
// r_i.  out: int64 [2 + 2n].
extern "C" __global__ void __launch_bounds__(256) route_sample(
    const unsigned int* __restrict__ surv, long long n, long long NW, const int* __restrict__ ks,
    const int* __restrict__ ke, const unsigned int* __restrict__ cnt,
    const long long* __restrict__ idx, const int* __restrict__ r, long long* __restrict__ out) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  const long long t0 = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  long long bits = 0, scr = 0;
  for (long long i = t0; i < n * NW; i += stride) bits += __popc(__ldg(surv + i));
  for (long long i = t0; i < n; i += stride) {
    const long long v = (long long)ke[i] - (long long)ks[i];
    scr += v - (long long)cnt[idx[i]];
    out[2 + i] = v;
    out[2 + n + i] = r[i];
  }
  bits = dosa::warp_sum_xor(bits);
  scr = dosa::warp_sum_xor(scr);
  if ((threadIdx.x & 31) == 0) {
    if (bits) atomicAdd(reinterpret_cast<unsigned long long*>(out), (unsigned long long)bits);
    if (scr) atomicAdd(reinterpret_cast<unsigned long long*>(out + 1), (unsigned long long)scr);
  }
}

// The gate in front of a timed sample (route._sample with route.SAMPLE_GATE; docs/method.md
// §9 "Route choice"): one thread waits until the host, having queued the timed launches,
// has written a count ≥ ticket into the page-locked word *opened (a host pointer, usable on
// the device under unified addressing), or until max_ns have passed — so the sample's start
// event is not recorded while an idle GPU waits for the host to queue the launches it times,
// a gap that the decision would scale 32-fold.  The limit keeps a gate the host never opens
// from holding the stream.  It times nothing itself and never changes an id.
extern "C" __global__ void route_gate(const volatile unsigned int* opened, unsigned int ticket,
                                      long long max_ns) {
  const uint64_t t0 = dosa::global_timer_ns();
  while ((int)(*opened - ticket) < 0 && dosa::global_timer_ns() - t0 < (uint64_t)max_ns)
    __nanosleep(2000);
}

// The runtime's device-side setter of a conditional graph node's value (CUDA ≥ 12.4).  nvcc
// declares it through cuda_runtime.h, which it includes in every translation unit; NVRTC
// includes no runtime header, and the one that declares it (cuda_device_runtime_api.h) needs
// the toolkit's crt headers, which a machine with CuPy's wheels alone lacks — so the NVRTC
// build declares it itself, as the runtime does: a builtin, not a symbol to link.
#if defined(__CUDACC_RTC__)
extern "C" __device__ __attribute__((cudart_builtin)) void cudaGraphSetConditional(
    unsigned long long handle, unsigned int value);
#endif

// The route of a captured prefill step (dosa_cupy/capture.py; docs/method.md §9 "A route
// chosen inside a graph"): the cost model's two predictions, each linear in the counts, from
// the chunk's ranges ks, ke [Qn] and its sample's counts (route_sample of the n sampled rows,
// seeded on their own: sample[0] survivors, sample[2 + i] row i's visible keys):
//   pairs     = Σ_t (ke_t − ks_t)                           the chunk's visible pairs
//   survivors = sample[0] · pairs / Σ_i sample[2 + i]       (0 for a sample that sees nothing)
//   DoSA  = rule[0] + rule[1]·survivors + rule[2]·min(survivors, rule[3]) + rule[4]·pairs
//   dense = rule[5] + rule[6]·pairs
// (cost.LinearRule, whose host twin evaluates the same operations in the same order, each
// rounded to nearest: no contraction into an FMA, so both sides take the same branch; the
// sums are exact 64-bit integers).  *pick = 1 when DoSA is predicted faster, else 0; cond ≠ 0:
// a conditional node's handle, set to *pick (the if/else node runs DoSA's body on 1, the
// dense route's on 0).  One block.  Only the time depends on it: both bodies return the same
// ids.
extern "C" __global__ void __launch_bounds__(256) route_pick(
    const int* __restrict__ ks, const int* __restrict__ ke, int Qn,
    const long long* __restrict__ sample, long long n, const double* __restrict__ rule,
    unsigned long long cond, long long* __restrict__ pick) {
  __shared__ long long part[2][8];
  long long vis = 0, svis = 0;
  for (int t = threadIdx.x; t < Qn; t += blockDim.x) vis += (long long)ke[t] - (long long)ks[t];
  for (long long i = threadIdx.x; i < n; i += blockDim.x) svis += sample[2 + i];
  vis = dosa::warp_sum_xor(vis);
  svis = dosa::warp_sum_xor(svis);
  const int warp = threadIdx.x >> 5;
  if ((threadIdx.x & 31) == 0) part[0][warp] = vis, part[1][warp] = svis;
  __syncthreads();
  if (threadIdx.x != 0) return;
  vis = svis = 0;
  for (int i = 0; i < (int)(blockDim.x >> 5); ++i) vis += part[0][i], svis += part[1][i];
  const double pairs = (double)vis;
  const double surv =
      svis > 0 ? __ddiv_rn(__dmul_rn((double)sample[0], pairs), (double)svis) : 0.0;
  double dosa = __dadd_rn(rule[0], __dmul_rn(rule[1], surv));
  dosa = __dadd_rn(dosa, __dmul_rn(rule[2], fmin(surv, rule[3])));
  dosa = __dadd_rn(dosa, __dmul_rn(rule[4], pairs));
  const double dense = __dadd_rn(rule[5], __dmul_rn(rule[6], pairs));
  const unsigned int take = dosa < dense ? 1u : 0u;
  *pick = take;
  if (cond) cudaGraphSetConditional(cond, take);
}

// The condition of a captured step's recovery node (dosa_cupy/capture.py RECOVER_ROWS;
// docs/serving.md "Prefill capture"): 1 where the step's status counts a flagged row
// (status[1] > 0), else 0, so a replay whose rows are all exact runs no dense rows.  One
// thread.
extern "C" __global__ void recover_pick(const long long* __restrict__ status,
                                        unsigned long long cond) {
  if (threadIdx.x == 0 && blockIdx.x == 0) cudaGraphSetConditional(cond, status[1] > 0 ? 1u : 0u);
}

#endif  // DOSA_ROUTE_CU
