// DoSA kernels (docs/method.md §7–§9), one translation unit of per-stage files: CuPy builds
// this file alone (RawModule, plain sm_90; CuPy appends -ftz=true; _build.py), CI builds it
// and each stage file on its own with nvcc -arch=sm_90 (tests/test_cuda_build.py).  Every
// score goes through dosa::score_batch (scorer.cuh): one arithmetic for every route.  The
// include order is the definition order of the kernels in the module (it fixes the layout
// of the built cubin).
#include "prepare.cu"     // quantize_keys_kernel, key_rho_kernel, check_values: payload, scale, ρ (§8), input checks
#include "dense.cu"       // dense_logits_mt*: the canonical scorer over every visible key
#include "fused.cu"       // fused_mt*: the fused route (full-head scoring, online τ filter)
#include "seeds.cu"       // seed_score_mt*, pool_*: default seed records, the anchor pool (§2)
#include "screen.cu"      // screen_mt*, screen_cert_mt*, screen_pair, cert_clear_below_tau
#include "refine.cu"      // refine_mt*: the per-query refinement stream (§9)
#include "select.cu"      // select_kernel, tau_from_kth: exact selection (§7, §9)
#include "e4m3_round.cu"  // e4m3_round_f64: plan.build_plans' aux rows (the planner's specification on CuPy)
#include "seed_ids.cu"    // seed_ids_mt*: explicit and certificate seeds (§2)
#include "route.cu"       // route_head, route_sample, route_gate, route_pick, recover_pick: the route stage (§9)
