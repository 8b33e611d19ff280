// The transposed Hopper screen (opt-in screen="wgt"; docs/method.md §8–§9, docs/design.md
// "Kernel sources"): the contract of screen_wg_mt1 (screen_sm90a.cu) — same parameters, same
// outputs, same keep rules — with the MMA turned around so that the epilogue costs fewer
// instructions per (query, key) pair (the counts: docs/records/notes.md, sessions 16–17).
//
// Orientation (as csrc/dense_fp8.cu): keys are the wgmma M operand (64 keys per warpgroup),
// the plan rows of a group of queries the N operand (m64n128k16, f16, both operands K-major
// in 128-byte-swizzled shared memory; every e4m3 code converted exactly to f16).  The 128 dims
// run as 8 chained k16 steps in natural dim order, the first with scale-d = 0 (a fresh
// accumulator: the chain starts from nothing, i.e. from +0, and a zero accumulator term
// changes neither the alignment nor the sum of a step).  The dots need not equal the other
// screens' bits: only the f16 chain's error model (MMA_BITS = 17 bits per k16 step,
// plan.gamma_mma) enters the plan's allowance, and it does not depend on the order of the
// dims over the steps.
//
// Three builds by RQ, the plan rows per query in the N operand (Rows<RQ>):
//   RQ = 32 (screen_wgt_rows32): the whole mts = 2 plan (r ≤ 30, aux rows 23 and 31), 4
//            queries per group — the trained regime's r = 30 at H = 64;
//   RQ = 16 (screen_wgt_rows16): the whole mts = 1 plan (r ≤ 14), 8 queries per group;
//   RQ = 8  (screen_wgt_rows8):  a plan with r ≤ 6 — its retained rows 0..5 and the aux rows
//            7, 15, the rows screen_pair takes (screen.py PAIR_ROWS) — 16 queries per group:
//            half the MMA work and half the weight-and-ReLU work per (query, key) pair.
//            The plan's other rows are empty (zero rows, ω = 0, plateau coefficient −1), so
//            leaving them out drops only exact +0 terms; the host launches it only for plans
//            built with r ≤ 6 (screen.ScreenLaunch).
//
// Who holds what (ptx_sm90a.cuh acc_row / acc_col): lane (g = lane/4, qd = lane%4) of warp w
// holds M rows 16w + g (k = 0) and 16w + g + 8 (k = 1) and the columns 8j + 2qd + {0, 1},
// j = 0..15.  The N operand is laid out so that a lane holds WHOLE queries: query
// u = E·qd + e (E = Q / 4 queries per lane, Q per group) belongs to lane qd, and its list row
// i (plan row Rows::plan_row(i)) is column 2qd + i mod 2 of block E·(i / 2) + e.  So a
// (key, query) value is one lane's: no shuffles, no cross-lane sums, and the lanes of one qd
// hold the same queries for 8 keys × 2 halves (the survivor word's bits, below).
//
// Û of one (key, query) (docs/method.md §9), in fp32 round-to-nearest, from the lane's RQ
// values y_i (list order) and its weights W_i (ω of the plan row; −σ_a at the aux sum):
//   RQ = 8:   a = W_0[y_0]_+ ; a = fmaf(W_i, [y_i]_+, a) for i = 1..5 ;
//             a = fmaf(−σ_a, [y_6 + y_7]_+, a)                (y_6, y_7: rows 7, 15)
//   RQ = 16:  c_0 over rows 0..3, c_1 over 4, 5, 6, 8, c_2 over 9..12 (a product, then three
//             fmaf), c_3 = ω_13[y_13]_+, fmaf ω_14, fmaf(−σ_a, [y_7 + y_15]_+, c_3);
//             Û = (c_0 + c_1) + (c_2 + c_3).
//   RQ = 32:  eight such chains over rows 0..3, 4..7, 8..11, 12..15, 16..19, (20, 21, 22, 24),
//             25..28, (29, 30, then fmaf(−σ_a, [y_23 + y_31]_+, ·)), added as a tree of three
//             levels.
//   Roundings on any term's path: RQ = 8 ≤ 7 (the first row's product, five fmaf and the aux
//   fmaf; the aux sum and its fmaf: 2), RQ = 16 ≤ 6 (a chain of four, two tree additions),
//   RQ = 32 ≤ 7 (a chain of four, three tree additions) — ≤ 2·mts + 6 (8 for mts = 1, 10 for
//   mts = 2), the depth proofs/gpu_screen_epilogue.py checks for these orders (Higham's
//   Lemma 3.1 over the rounding factors of each term) and plan.py's g_scr = γ_mma +
//   γ_{2·mts+6}(1 + γ_mma) covers.  Then the lane evaluates guard_bound_ru (epilogue.cuh) in fp64 and the
//   keep rule (DOSA_KEEP; the tie-aware variant with common.cuh's zero-plateau test).
//
// Survivor words without shared memory: the key tile is stored permuted so that the 16 M rows
// of warp w in chunk c (c = 0, 1) of warpgroup v are the keys 128v + 32w + 16c + (0..15):
// warp w collects word 4v + w of the tile, bits 0..15 from chunk 0 and 16..31 from chunk 1
// (an OR-butterfly over the 8 lanes of a qd carries each query's 16 bits to every lane).
//
// Block: DOSA_WGT_GROUPS warpgroups, 128 keys each (tile = 128 · groups keys, converted to f16
// once per block); query groups (QG per block, any QG ≥ 1) are staged into one of two shared
// buffers while the other one feeds the MMAs.  Grid (ceil(N / tile), ceil(Qn / QG)).
//
// The ring build (screen_wgt_ring_rows*, after screen_wgt_image_rows*; screen.WGT_RING): the
// profile of the default build (docs/records/benchmarks.md, nineteenth session) shows it
// waiting on its staging — each group's rows loaded from L2 and converted on the block's
// critical path, the per-group block barrier keeping the three warpgroups in step — and its
// SASS spends ~a quarter of a group's instructions there.  The staging does not depend on the
// key tile except through the spans' frame, so it is done once per call: the image kernel
// writes each query group's buffer (rows, weights, plateau coefficients, QInfo) to global
// memory with the spans in the frame of the whole context ([0, N): stage_group's ABS), and
// the ring kernel brings the images by bulk copies (cp.async.bulk, completion on an
// mbarrier) into kRing slots.  A warp waits only for its group's slot; the last of the
// block's warps to finish reading a slot refills it (a count per slot), so the warpgroups
// drift apart and the tensor cores run one warpgroup's MMAs under another's epilogue.  In
// the context frame a key's tests read x = n0 + i against the same spans: for every key of
// the tile the two frames keep the same keys (the clipping to [0, kTile] or [0, N] changes
// no comparison with an offset inside the tile), so the words, U^num and tie counts are the
// default build's bit for bit (the same MMA operands in the same order, the same epilogue).
//
// The FP8 build (screen_wgt_fp8_ring_rows{32,16,8} after screen_wgt_fp8_image_rows*; screen
// .WGT_FP8; docs/error_model.md "An FP8 screen: fresh steps again"): the ring build with both
// operands as the e4m3 codes they are — the key tile and each image's rows one 128-byte-swizzled
// panel of 128-byte rows, nothing converted — and the dots of e4m3 wgmma m64n128k32 steps from
// fresh accumulators, added in k order in fp32 round-to-nearest (chunk_fp8: the canonical FP8
// scorer's dot, scorer_fp8.cuh fresh_steps): four MMAs per chunk where the f16 chain issues eight
// of the same tensor time (twice the products at twice the rate): half the MMA time, for three fp32
// adds per value on the CUDA cores — the 32-row build, whose registers do not hold a second array
// of 64, as two halves of 64 columns (chunk_fp8<true>, eight m64n64 MMAs, the same values).  Its
// error is plan.dot_allowance("fp8_fresh")'s (proofs/wgmma_fresh_step.py): a relative part that
// plan.py puts in g_scr and a constant per plan row, Σ_s 2^(eq_s)(1 + γ_3), that it adds to ε_raw
// weighted as Û weighs the rows — so the plan must be built for this screen (plan.build_plans(...,
// screen="fp8_fresh"); DevicePlan.screen), and the launch refuses any other.  Û, the guard and the
// keep rule are the epilogue above, unchanged (its depth 2·mts + 6 enters g_scr as before).  The
// plain rule only: the zero-plateau coefficients (screen.plateau_rows) cover the f16 chain's dots,
// and tie-aware chunks take the f16 ring.  The adds cost issue slots: the 8-row loop is 1,921
// instructions per warp per group against the f16 ring's 1,602 (cuobjdump, static), so the build
// wins only where the f16 ring waits on the tensor cores (docs/records/notes.md, sessions 20–21).
//
// The fp32 guard (screen_wgt_fp8_ring_rows*_g32; screen.WGT_GUARD32, the default): the FP8
// build with U^num from guard_bound_ru32 (epilogue.cuh) instead of the fp64 guard — four fp32
// operations rounded up, without flush to zero, on the query's C, ε_raw and ε_out rounded up
// to fp32 once, in place of a conversion and four fp64 operations per (query, key) pair on the
// fp64 pipe (half the fp32 rate on the H100 and the H200) — a shorter dependent chain for
// a screen that the records show latency-bound (docs/records/benchmarks.md
// "the lean screen kernels").  The same Û, a bound at least as large (each step ≥ its exact
// value; docs/error_model.md "The fp32 guard"), the words {candidates with U32 ≥ τ}; U^num is
// written as the double of U32.
//
// The interleaved epilogue (epilogue_g32, the fp32 guard's kernels): each chunk's epilogue
// as loads, then the lane's 2·E (key, query) pairs' Û and guards in one branch-free run, then
// the keep bits, then U^num where Uout is given.  Written as the fp64 guard's epilogue is —
// each pair its Û, guard and keep test in turn, U^num stored under a test of Uout — every pair
// is one dependent chain of about twelve fp32 operations (a product, six fmaf, the guard's
// five rounded-up steps; the cuobjdump of rows8 showed them back to back) and the tests split
// the pairs into separate blocks, so a warp waits out each operation's latency.  The same
// operations in the same order per pair, so the same U^num and words; on an H100 the 8-row
// kernel 1.13× faster (16.96 → 15.01 ms at 1M keys, H 64, one captured launch; 2.75
// instructions issued per cycle against 2.56), the 16- and 32-row ones 1.055× and 1.036×
// (docs/records/benchmarks.md "The FP8 screen's interleaved epilogue").
//
// The pipelined halves (screen_wgt_fp8_ring_rows{16,8}_g32p; screen.WGT_PIPE, the default;
// chunk_fp8_pipe): the fp32 guard's kernels with each chunk's fresh steps issued as two halves
// of 64 columns (m64n64, as the 32-row build's) whose steps overlap the other half's adds:
// the _g32 build issues steps 0 and 1, waits, adds, issues step 2, waits, adds, issues step 3,
// waits and adds — three waits per chunk with nothing of the warp's own to do under them; here
// the warp adds one half while the other half's next step runs, with the same registers (d
// and one buffer of 64) and the same values in them, bit for bit; and the chunk's descriptors
// kept in uniform registers (chunk_fp8_pipe: the key tile's descriptor, which the _g32
// kernels compute in each lane and move to a uniform register per MMA; the halves' extra
// MMAs take that back in the loop, ~1,176 instructions per group either way, cuobjdump).
// On an H100 1.017–1.028× the _g32 kernels on captured launches, the same words
// (docs/records/benchmarks.md "The raised extension and the pipelined halves").
// sm_90a only; every other target compiles this file to an empty module (NVRTC and nvcc).
#include "epilogue.cuh"
#include "ptx_sm90a.cuh"
#include "scorer_fp8.cuh"

#ifndef DOSA_WGT_GROUPS
#define DOSA_WGT_GROUPS 3  // warpgroups per block (one block per SM: 168 registers each)
#endif

namespace dosa {
namespace wgt {
constexpr int kGroups = DOSA_WGT_GROUPS;
constexpr int kThreads = 128 * kGroups;
// Two accumulators: chunk 1's MMAs are issued before chunk 0's epilogue, so the tensor cores
// work under it (one accumulator: MMA, epilogue, MMA, epilogue in turn within a warpgroup,
// and the per-group barrier keeps the three warpgroups in step).  64 more accumulator
// registers fit the 168 of three warpgroups without spills in the plain builds (ptxas -v:
// 158 / 161 / 168 for rows 8 / 16 / 32); the tie-aware builds would spill, so they keep one
// accumulator unless the block has at most two warpgroups.  DOSA_WGT_TWO_ACC=0 builds the
// one-accumulator schedule everywhere (a baseline to time against).
#ifndef DOSA_WGT_TWO_ACC
#define DOSA_WGT_TWO_ACC 1
#endif
// The staging of a query group's rows (stage_group).  16-dim items (DOSA_WGT_STAGE8=0, the
// default): a thread loads 16 e4m3 codes and stores two f16 chunks, the first eight threads
// of a warp cover both panels of one row, so each 16-byte store meets a second one on the
// same banks (a 2-way conflict; ncu at 66f9531: 34 % of the shared-store wavefronts are
// conflicts, docs/records/benchmarks.md, nineteenth session).  8-dim items
// (DOSA_WGT_STAGE8=1): a thread loads 8 codes and stores one chunk, eight threads one panel of
// one row — the eight chunk positions, no conflict.  The same bytes at the same addresses
// (stage8_same_layout, checked when the file compiles); built and checked on the CPU, not yet
// timed on a GPU, so not the default.  The two loops of stage_group stay separate until the
// GPU has measured them: one loop over the item width changes the default build's machine
// code, which the GPU tests have checked; the loser is deleted then.
#ifndef DOSA_WGT_STAGE8
#define DOSA_WGT_STAGE8 0
#endif
constexpr bool kStage8 = DOSA_WGT_STAGE8;

// The survivor words of a query group.  Default (DOSA_WGT_WORDS=0): lanes 0..3 of each warp
// store their queries' word of the tile, one uint32 per store (4 of a sector's 32 bytes;
// ncu at 66f9531).  DOSA_WGT_WORDS=1: the words go to shared memory (two buffers, with the
// queries' rows) and, after the group's barrier, the block writes each query's kTile / 32
// words as one run.  The same words; built and compiled on the CPU, not yet timed, so not
// the default.  Its shared memory is Rows::kSmemBytes + Rows::kWordsBytes.  The 32-row build
// keeps the default (its registers are full: the gathered words would spill).
#ifndef DOSA_WGT_WORDS
#define DOSA_WGT_WORDS 0
#endif
constexpr bool kGatherWords = DOSA_WGT_WORDS;

template <bool TIE>
struct TwoAcc {
  static constexpr bool value = DOSA_WGT_TWO_ACC && (!TIE || kGroups <= 2);
};
constexpr int kTile = 128 * kGroups;       // keys per block (screen.WGT_TILE)
constexpr int kKeyPanel = kTile * 128;     // bytes of one 64-dim panel of the key tile
constexpr int kRowPanel = 128 * 128;       // bytes of one 64-dim panel of a group's 128 rows
constexpr int kRing = 3;  // the ring build's group slots (header; screen.WGT_RING_SLOTS)
// A query of a group as the epilogue reads it (staged once per group): its visible span
// [lo, hi) and its candidates [clo, clo + cw) — the visible keys past the sinks and before
// the local window, screen_wg's `vis && !seed` without the anchor-pool bit — as tile offsets,
// kj, its row t (−1: no query), the zero-plateau switch, τ (fp64), C, ε_raw.  The FP8 build
// (plain rule: no kj, no plateau) holds the fp32 guard's C32, er32 and τ in their places
// (header "The fp32 guard").
struct QInfo {
  int lo, hi, clo, cw;
  union {
    int kj;
    float C32;
  };
  int t;
  union {
    int zp;
    float er32;
  };
  union {
    int pad;
    float tq32;
  };
  double tq, C, er;
};
static_assert(sizeof(QInfo) == 56, "QInfo: 56 bytes (screen.wgt_smem_bytes)");

// The N operand of RQ plan rows per query (header).
template <int RQ>
struct Rows {
  static_assert(RQ == 32 || RQ == 16 || RQ == 8,
                "RQ: 32 (r <= 30), 16 (r <= 14) or 8 (r <= 6) plan rows per query");
  static constexpr int kQ = 128 / RQ;  // queries per group (N = 128 columns)
  static constexpr int kE = kQ / 4;    // queries per lane
  static constexpr int kV = RQ / 4;    // float4 of weights (or plateau coefficients) per query
  static constexpr int kStride = RQ == 32 ? 32 : 16;  // plan rows per query: 16·mts
  // The plan's aux rows (plan.py row_slots: rows 7 and 15 of the last 16-row tile).
  static constexpr int kAuxRow0 = kStride - 9, kAuxRow1 = kStride - 1;
  // Plan row of list row i: all of them (RQ = 16, 32); rows 0..5, then the aux rows 7, 15
  // (RQ = 8).
  __host__ __device__ static constexpr int plan_row(int i) {
    return RQ != 8 ? i : (i < 6 ? i : (i == 6 ? 7 : 15));
  }
  // N column (B row) of list row i of query u = E·qd + e: block E·(i / 2) + e, column
  // 2qd + i mod 2 of the block (header).
  __host__ __device__ static constexpr int column(int u, int i) {
    return 8 * (kE * (i >> 1) + u % kE) + 2 * (u / kE) + (i & 1);
  }
  // The list positions of the aux rows: the first carries the aux sum's weight −σ_a, the
  // second 0.
  static constexpr int kAux = RQ == 8 ? 6 : kAuxRow0;
  static constexpr int kAux2 = RQ == 8 ? 7 : kAuxRow1;
  // Dynamic shared memory per buffer: the queries' weights and plateau coefficients (float4
  // [E][V][4]: query E·qd + e's rows 4m .. 4m + 3 at (e·V + m)·4 + qd, so the four qd of a
  // warp read 64 consecutive bytes) and the QInfo [Q].
  static constexpr int kMetaBytes = 2 * kQ * RQ * 4 + kQ * (int)sizeof(QInfo);
  static constexpr int kOffAlpha = 2 * kKeyPanel + 2 * 2 * kRowPanel;
  static constexpr int kOffRho = kOffAlpha + kTile * 8;
  static constexpr int kOffMeta = kOffRho + kTile * 8;
  static constexpr int kOffPool = kOffMeta + 2 * kMetaBytes;
  // the 1,024-byte alignment slack, the key tile (two panels), two row buffers (two panels
  // each), α and ρ as fp64, two meta buffers, the anchor-pool words of the tile
  static constexpr int kSmemBytes = 1024 + kOffPool + (kTile / 32) * 4;
  // DOSA_WGT_WORDS=1: two buffers of the group's words [Q][kTile / 32] and rows t [Q], after
  // the pool words (screen.wgt_smem_bytes does not count them: the caller adds them)
  static constexpr int kOffWords = kOffPool + (kTile / 32) * 4;
  static constexpr int kWordsBytes = 2 * (kQ * (kTile / 32) + kQ) * 4;
  static constexpr bool kGather = kGatherWords && RQ != 32;
  static_assert(kMetaBytes % 16 == 0, "float4-aligned meta buffers");
};

// The ring build's layout (screen_wgt_ring_rows*, after screen_wgt_image_rows*, header "The
// ring build"; FP8: screen_wgt_fp8_ring_rows*, header "The FP8 build"): a group's image — its
// 128 N rows (two 64-dim f16 panels, or FP8 one 128-dim e4m3 panel), then its meta buffer — as
// the image kernel writes it and one bulk copy brings it into a slot of kRing slots (each
// 1,024-byte aligned: the rows' swizzle); in shared memory the key tile (as many panels), the
// slots, α, ρ, the pool words, the slots' mbarriers and their reader counts.
template <int RQ, bool FP8 = false>
struct Ring {
  static constexpr int kPanels = FP8 ? 1 : 2;
  static constexpr int kImageBytes = kPanels * kRowPanel + Rows<RQ>::kMetaBytes;
  static constexpr int kSlotBytes = (kImageBytes + 1023) / 1024 * 1024;
  static constexpr int kOffAlpha = kPanels * kKeyPanel + kRing * kSlotBytes;
  static constexpr int kOffRho = kOffAlpha + kTile * 8;
  static constexpr int kOffPool = kOffRho + kTile * 8;
  static constexpr int kOffBar = kOffPool + (kTile / 32) * 4;
  static constexpr int kSmemBytes = 1024 + kOffBar + kRing * 8 + kRing * 4;
  static_assert(kImageBytes % 16 == 0 && kOffBar % 8 == 0, "bulk copies, mbarriers");
  // (three warpgroups at most: a fourth's key panels would not leave room for three slots)
  static_assert(kSmemBytes <= 227 * 1024, "the ring build fits an SM's shared memory");
};

// The layout's laws, checked when the file compiles: the columns of a group are a bijection
// onto 0..127, and lane qd's columns 2qd + h of block E·(i / 2) + e hold list row 2(i / 2) + h
// of query E·qd + e — what the epilogue reads; list rows kAux, kAux2 are the plan's aux rows.
template <int RQ>
__host__ __device__ constexpr bool layout_holds() {
  using L = Rows<RQ>;
  bool seen[128] = {};
  for (int u = 0; u < L::kQ; ++u)
    for (int i = 0; i < RQ; ++i) {
      const int c = L::column(u, i);
      if (c < 0 || c >= 128 || seen[c]) return false;
      seen[c] = true;
    }
  for (int qd = 0; qd < 4; ++qd)
    for (int e = 0; e < L::kE; ++e)
      for (int i = 0; i < RQ; ++i)
        if (L::column(L::kE * qd + e, i) != 8 * (L::kE * (i >> 1) + e) + 2 * qd + (i & 1))
          return false;
  return L::plan_row(L::kAux) == L::kAuxRow0 && L::plan_row(L::kAux2) == L::kAuxRow1;
}
static_assert(layout_holds<32>() && layout_holds<16>() && layout_holds<8>(),
              "the N operand's layout (header)");

// The byte address in a group's row buffer (two panels of 128 rows × 128 bytes) of the f16
// chunk holding dims 8c .. 8c + 7 of N row r: panel c / 8, 16-byte chunk c mod 8 of the row,
// 128-byte swizzled (ptx_sm90a.cuh sw128_offset).
__host__ __device__ constexpr int row_chunk_addr(int r, int c) {
  return (c >> 3) * kRowPanel + r * 128 + (((c & 7) ^ (r & 7)) << 4);
}

// The two stagings of stage_group write the same chunks at the same addresses: the 16-dim
// item (n, i) stores dims 16i .. 16i + 7 at panel i / 4, chunk 2(i mod 4), and dims 16i + 8
// .. 16i + 15 at chunk 2(i mod 4) + 1; the 8-dim item (n, c) dims 8c .. 8c + 7 at
// row_chunk_addr — and the 8-dim items cover every (row, chunk) once, each run of eight
// consecutive items in one row and one panel at eight distinct chunk positions (the
// conflict-free store of a quarter warp).
template <int RQ>
__host__ __device__ constexpr bool stage8_same_layout() {
  using L = Rows<RQ>;
  bool seen[2 * 128 * 8] = {};
  for (int n = 0; n < 128; ++n) {
    const int r = L::column(n / RQ, n % RQ);
    for (int i = 0; i < 8; ++i)
      for (int h = 0; h < 2; ++h) {
        const int old = (i >> 2) * kRowPanel + r * 128 + (((2 * (i & 3) + h) ^ (r & 7)) << 4);
        if (old != row_chunk_addr(r, 2 * i + h)) return false;
      }
    for (int c0 = 0; c0 < 16; c0 += 8) {
      bool pos[8] = {};
      for (int c = c0; c < c0 + 8; ++c) {
        const int a = row_chunk_addr(r, c);
        if (seen[a >> 4]) return false;
        seen[a >> 4] = true;
        const int p = (a >> 4) & 7;  // the 16-byte chunk position: banks 4p .. 4p + 3
        if (pos[p]) return false;
        pos[p] = true;
      }
    }
  }
  return true;
}
static_assert(stage8_same_layout<32>() && stage8_same_layout<16>() && stage8_same_layout<8>(),
              "the 8-dim staging writes today's layout, conflict-free (stage_group)");
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

// Shared-memory row of tile key n: warpgroup v = n / 128, and within its 128 keys key
// 32w + 16c + j is row j of warp w of chunk c (the survivor-word layout, header).
__device__ __forceinline__ int key_row(int n) {
  const int v = n >> 7, w = (n >> 5) & 3, c = (n >> 4) & 1, j = n & 15;
  return 128 * v + 64 * c + 16 * w + j;
}

// The key tile [n0, n0 + kTile) as f16 (zero past N), all loads issued before the first use;
// FP8: as the e4m3 codes, one 128-byte-swizzled panel (key n at row key_row(n) either way).
template <bool FP8 = false>
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
    const int r = key_row(it >> 3), i = it & 7;
    if constexpr (FP8) *reinterpret_cast<uint4*>(sk + sw128_offset(r, i)) = e[k];
    else store_f16(sk, kKeyPanel, r, i, e[k]);
  }
}

// The operands of the TIE variant (null / unused when TIE = false).
struct TieArgs {
  const int* __restrict__ kj;
  const float* __restrict__ zrow;
  unsigned int* __restrict__ tcnt;
};

// One buffer of a query group: its 128 f16 N rows, the queries' weights and plateau
// coefficients (float4 [E][V][4], Rows::kMetaBytes), the QInfo [Q].
template <int RQ>
struct Group {
  uint8_t* rows;
  float4* w;
  float4* z;
  QInfo* q;
  __device__ __forceinline__ Group(uint8_t* sm, int b) {
    using L = Rows<RQ>;
    rows = sm + 2 * kKeyPanel + b * 2 * kRowPanel;
    w = reinterpret_cast<float4*>(sm + L::kOffMeta + b * L::kMetaBytes);
    z = w + L::kQ * L::kV;
    q = reinterpret_cast<QInfo*>(z + L::kQ * L::kV);
  }
  // A group's image (the ring builds): the rows at `base` (`panels` row panels: Ring's
  // kPanels), the meta buffer after them — the same meta layout as a buffer above, in global
  // memory (the image kernels) or in a slot.
  __device__ __forceinline__ static Group image(uint8_t* base, int panels) {
    using L = Rows<RQ>;
    Group G;
    G.rows = base;
    G.w = reinterpret_cast<float4*>(base + panels * kRowPanel);
    G.z = G.w + L::kQ * L::kV;
    G.q = reinterpret_cast<QInfo*>(G.z + L::kQ * L::kV);
    return G;
  }
  Group() = default;
};

// Stage query group t0 .. t0 + Q − 1 (queries ≥ qend: zero rows, t = −1) into a buffer: its
// RQ plan rows per query as f16 at their columns (Rows::column) — FP8: as e4m3 codes, one
// 128-byte-swizzled panel (header "The FP8 build"); per query its weights in
// list order (ω of the plan row, −σ_a at kAux, 0 at the second aux row) and — TIE — its
// plateau coefficients (the plan row's; −1 everywhere where the plateau is off: no
// condition); and the QInfo of each query (screen_wg's per-query set-up).  Its spans are
// offsets in the frame [n0, n0 + tile_n) clipped to [0, F]: the block's key tile (F = kTile),
// or — ABS, a group's image — the whole context (n0 = 0, tile_n = F = N): for every key of a
// tile both frames keep the same keys (header "The ring build").
template <bool TIE, int RQ, bool ABS = false, bool FP8 = false>
__device__ __forceinline__ void stage_group(
    int t0, int qend, const Group<RQ>& G, const uint8_t* __restrict__ rows,
    const float* __restrict__ om, const float* __restrict__ sig, const double* __restrict__ Cq,
    const double* __restrict__ eps_raw, const float* __restrict__ tau, const TieArgs& X,
    const int* __restrict__ ks_, const int* __restrict__ ke_, int sinks, int window, long long n0,
    int tile_n) {
  using L = Rows<RQ>;
  constexpr int kQ = L::kQ, kE = L::kE, kV = L::kV;
  if constexpr (FP8) {  // the codes as they are: 16 per (N row, 16-dim chunk) item
    constexpr int kAll = 128 * 8;
    constexpr int kItems = (kAll + kThreads - 1) / kThreads;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const unsigned it = threadIdx.x + kThreads * k, n = it >> 3, i = it & 7;
      const int t = t0 + (int)(n / RQ);
      uint4 e = make_uint4(0u, 0u, 0u, 0u);
      if (it < kAll && t < qend) {
        const long long row = (long long)t * L::kStride + L::plan_row((int)(n % RQ));
        e = __ldg(reinterpret_cast<const uint4*>(rows + row * DOSA_D + 16 * i));
      }
      if (it < kAll)
        *reinterpret_cast<uint4*>(G.rows + sw128_offset(L::column(n / RQ, n % RQ), (int)i)) = e;
    }
  } else if constexpr (kStage8) {
    constexpr int kAll = 128 * 16;  // (N row, 8-dim chunk) items
    constexpr int kItems = (kAll + kThreads - 1) / kThreads;
    uint2 e[kItems];
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const unsigned it = threadIdx.x + kThreads * k, n = it >> 4, c = it & 15;
      const int t = t0 + (int)(n / RQ);
      e[k] = make_uint2(0u, 0u);
      if (it < kAll && t < qend) {
        const long long row = (long long)t * L::kStride + L::plan_row((int)(n % RQ));
        e[k] = __ldg(reinterpret_cast<const uint2*>(rows + row * DOSA_D + 8 * c));
      }
    }
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const unsigned it = threadIdx.x + kThreads * k, n = it >> 4;
      if (it < kAll)
        *reinterpret_cast<uint4*>(G.rows + row_chunk_addr(L::column(n / RQ, n % RQ), it & 15)) =
            make_uint4(f16x2_lo(e[k].x), f16x2_hi(e[k].x), f16x2_lo(e[k].y), f16x2_hi(e[k].y));
    }
  } else {
    constexpr int kAll = 128 * 8;  // (N row, 16-dim chunk) items
    constexpr int kItems = (kAll + kThreads - 1) / kThreads;
    uint4 e[kItems];
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      // (unsigned: n / RQ and n % RQ are a shift and a mask)
      const unsigned it = threadIdx.x + kThreads * k, n = it >> 3, i = it & 7;
      const int t = t0 + (int)(n / RQ);
      e[k] = make_uint4(0u, 0u, 0u, 0u);
      if (it < kAll && t < qend) {
        const long long row = (long long)t * L::kStride + L::plan_row((int)(n % RQ));
        e[k] = __ldg(reinterpret_cast<const uint4*>(rows + row * DOSA_D + 16 * i));
      }
    }
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const unsigned it = threadIdx.x + kThreads * k, n = it >> 3;
      if (it < kAll) store_f16(G.rows, kRowPanel, L::column(n / RQ, n % RQ), it & 7, e[k]);
    }
  }
  const int tid = threadIdx.x;
  if (tid < kQ * kV) {  // (query u, rows 4m .. 4m + 3): weights and plateau coefficients
    const unsigned u = (unsigned)tid / kV, m = (unsigned)tid % kV;
    const int t = t0 + (int)u;
    float wv[4] = {0.f, 0.f, 0.f, 0.f}, zv[4] = {-1.f, -1.f, -1.f, -1.f};
    if (t < qend) {
      const float* o = om + (long long)t * L::kStride;
      // TIE: screen_wg's zero-plateau switch: row 0 of zrow not NaN and τ ≥ 0 (screen.cu)
      const float* zq = TIE ? X.zrow + (long long)t * L::kStride : nullptr;
      const bool zon = TIE && zq[0] == zq[0] && tau[t] >= 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i = 4 * (int)m + j, pr = L::plan_row(i);
        wv[j] = i == L::kAux ? -sig[t] : (pr == L::kAuxRow0 || pr == L::kAuxRow1) ? 0.f : o[pr];
        if (zon) zv[j] = zq[pr];
      }
    }
    const unsigned slot = ((u % kE) * kV + m) * 4 + u / kE;  // (e·V + m)·4 + qd
    G.w[slot] = make_float4(wv[0], wv[1], wv[2], wv[3]);
    if constexpr (TIE) G.z[slot] = make_float4(zv[0], zv[1], zv[2], zv[3]);
  } else if (tid < kQ * kV + kQ) {  // query u: screen_wg's spans, τ, kj, C, ε
    const int u = tid - kQ * kV, t = t0 + u;
    QInfo q{0, 0, 0, 0, kNoKthId, -1, 0, 0, 0.0, 0.0, 0.0};
    if (t < qend) {
      const int ks = ks_[t], ke = ke_[t];
      const long long lo = max((long long)ks, n0), hi = min((long long)ke, n0 + tile_n);
      q.lo = (int)(lo - n0);
      q.hi = (int)(max(hi, lo) - n0);
      const int ns = min(sinks, ke - ks);
      const long long s_hi = (long long)ks + ns, loc_lo = max(s_hi, (long long)ke - window);
      const long long F = ABS ? tile_n : kTile;
      const int shi = (int)min(max(s_hi - n0, 0LL), F);
      const int llo = (int)min(max(loc_lo - n0, 0LL), F);
      q.clo = max(q.lo, shi);
      q.cw = max(min(q.hi, llo) - q.clo, 0);
      q.t = t;
      const float tq = tau[t];
      q.tq = (double)tq;
      if constexpr (TIE) {
        q.kj = X.kj[t];
        const float z0 = X.zrow[(long long)t * L::kStride];
        q.zp = z0 == z0 && tq >= 0.f;
      }
      q.C = Cq[t];
      q.er = eps_raw[t];
      if constexpr (FP8) {  // the fp32 guard's constants, rounded up once per call
        q.C32 = f32_ru_keep_subnormal(q.C), q.er32 = f32_ru_keep_subnormal(q.er);
        q.tq32 = tq;
      }
    }
    G.q[u] = q;
  }
}

// The 8 chained k16 steps of one chunk: 64 key rows (from row `a`'s byte address in panel 0)
// × the group's 128 N rows (`b`), dims in natural order, step 0 with scale-d = 0.  The pin
// keeps the previous chunk's reads of d above the fence (PTX: wgmma.fence between register
// accesses and the wgmma that writes them).
__device__ __forceinline__ void issue_chunk(float (&d)[64], uint32_t a, uint32_t b) {
  pin(d);
  fence();
#pragma unroll
  for (int s = 0; s < 8; ++s)
    mma_m64n128k16_ss(d, desc_sw128(a + (s >> 2) * kKeyPanel + (s & 3) * 32),
                      desc_sw128(b + (s >> 2) * kRowPanel + (s & 3) * 32), s > 0);
  commit();
}

// The FP8 build's dots of one chunk (header "The FP8 build"): 64 key rows (from row `a`'s byte
// address in the e4m3 key panel) × the group's 128 N rows (`b`, one e4m3 panel) by the
// canonical scorer's fresh steps (scorer_fp8.cuh fresh_steps: four e4m3 k32 steps from fresh
// accumulators, d = ((x_0 + x_1) + x_2) + x_3); x is scratch.  HALVES (the 32-row build,
// whose registers do not hold a second array of 64): the 128 columns as two halves of 64,
// m64n64 steps on N rows 64h .. 64h + 63 (8,192 bytes further) into d's registers 32h ..
// 32h + 31 — the m64n64 accumulators of columns 64h + 8j + 2qd + e are the m64n128 ones of
// block 8h + j, so d ends with the same values (each column's dot is the same four steps on
// the same operands, ptx_sm90a.cuh acc_col).
template <bool HALVES>
__device__ __forceinline__ void chunk_fp8(float (&d)[64], float (&x)[HALVES ? 32 : 64],
                                          uint32_t a, uint32_t b) {
  if constexpr (HALVES) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
      fp8::fresh_steps<64>(*reinterpret_cast<float(*)[32]>(&d[32 * h]), x, desc_sw128(a),
                           desc_sw128(b + h * 64 * 128), [] {});
  } else {
    fp8::fresh_steps<128>(d, x, desc_sw128(a), desc_sw128(b), [] {});
  }
}

// The FP8 build's dots of one chunk with the halves in a pipeline (PIPE; header "The
// pipelined halves"): chunk_fp8<false>'s values in the same registers (scorer_fp8.cuh
// fresh_steps_pipe: the halves' m64n64 steps on N rows 64h .. into d[32h ..], as
// chunk_fp8<true>'s).  The descriptors' low words pass through a shuffle from lane 0: the
// compiler then knows them to be the same in every lane and keeps them and their step
// offsets in uniform registers (as dense_fp8.cu's consumers do) instead of computing them in
// each lane and moving them there before each MMA (cuobjdump of the halves without it).
__device__ __forceinline__ void chunk_fp8_pipe(float (&d)[64], float (&x)[64], uint32_t a,
                                               uint32_t b) {
  const uint32_t alo = __shfl_sync(0xffffffffu, desc_lo(a), 0);
  const uint32_t blo = __shfl_sync(0xffffffffu, desc_lo(b), 0);
  fp8::fresh_steps_pipe<128>(d, x, desc_of(alo), desc_of(blo), desc_of(blo + ((64 * 128) >> 4)));
}

// The per-thread state of a query group for the lane's E queries E·qd + e: their survivor
// words (bits of chunk c at 16c..16c+15, valid in every lane after the butterfly) and — TIE —
// the keys the strict rule keeps and the tie-aware rule rejects.  (Their QInfo stays in
// shared memory, read where used: registers are the kernel's budget.)
template <int RQ>
struct Lane {
  uint32_t word[Rows<RQ>::kE];
  unsigned int tie[Rows<RQ>::kE];
};

// Û of one (key, query) from its RQ values y (list order) and weights W(i) (header's orders).
template <int RQ, class Wt>
__device__ __forceinline__ float u_hat(const float (&y)[RQ], Wt&& W) {
  auto r = [](float v) { return fmaxf(v, 0.f); };
  if constexpr (RQ == 8) {
    float a = W(0) * r(y[0]);
#pragma unroll
    for (int i = 1; i < 6; ++i) a = fmaf(W(i), r(y[i]), a);
    return fmaf(W(6), r(y[6] + y[7]), a);  // −σ_a [x_7 + x_15]_+
  } else {
    // the retained rows (every list row but the aux rows kAux, RQ − 1) in chains of four —
    // RQ = 16: (0..3), (4, 5, 6, 8), (9..12), (13, 14) —, the aux fmaf on the last chain,
    // then a pairwise tree: (c_0 + c_1) + (c_2 + c_3), and so on
    constexpr int kAux = Rows<RQ>::kAux, P = RQ / 4;
    auto row = [](int k) { return k < kAux ? k : k + 1; };  // k-th retained list row
    float c[P];
#pragma unroll
    for (int p = 0; p < P; ++p) {
      c[p] = W(row(4 * p)) * r(y[row(4 * p)]);
#pragma unroll
      for (int j = 1; j < 4; ++j)
        if (4 * p + j < RQ - 2) c[p] = fmaf(W(row(4 * p + j)), r(y[row(4 * p + j)]), c[p]);
    }
    c[P - 1] = fmaf(W(kAux), r(y[kAux] + y[RQ - 1]), c[P - 1]);  // −σ_a [x_aux0 + x_aux1]_+
#pragma unroll
    for (int st = 1; st < P; st *= 2)
#pragma unroll
      for (int p = 0; p + st < P; p += 2 * st) c[p] = c[p] + c[p + st];
    return c[0];
  }
}

// The OR over the 8 lanes of a qd (lanes qd + 4g) of chunk c's keep bits (bit 16(e mod 2) + g
// + 8k of bits[e / 2]): every lane then holds, for its queries E·qd + e, the 16 bits of the
// warp's keys 16c + 0..15 of its word, put into L.word.
template <int RQ>
__device__ __forceinline__ void merge_bits(uint32_t (&bits)[(Rows<RQ>::kE + 1) / 2], int c,
                                           Lane<RQ>& L) {
  constexpr int kE = Rows<RQ>::kE;
#pragma unroll
  for (int h = 0; h < (kE + 1) / 2; ++h) {
    bits[h] |= __shfl_xor_sync(0xffffffffu, bits[h], 4);
    bits[h] |= __shfl_xor_sync(0xffffffffu, bits[h], 8);
    bits[h] |= __shfl_xor_sync(0xffffffffu, bits[h], 16);
  }
#pragma unroll
  for (int e = 0; e < kE; ++e) L.word[e] |= ((bits[e >> 1] >> (16 * (e & 1))) & 0xffffu) << (16 * c);
}

// The epilogue of chunk c of the calling warp: Û (header), the guard and the keep rule for
// the lane's keys 128v + 32w + 16c + g + 8k (k = 0, 1) and queries E·qd + e, U^num into Uout
// (visible keys) and the survivor bits into L.word.
template <bool TIE, int RQ, bool ABS = false>
__device__ __forceinline__ void epilogue(const float (&d)[64], int c, const Group<RQ>& G,
                                         const double* dsa, const double* dsr,
                                         const uint32_t* spm, Lane<RQ>& L, double eps_out,
                                         long long N, long long n0, double* __restrict__ Uout,
                                         int lane, int v, int w) {
  using L_ = Rows<RQ>;
  constexpr int kE = L_::kE, kV = L_::kV;
  const int qd = lane & 3, g = lane >> 2;
  const int i0 = 128 * v + 32 * w + 16 * c + g;  // tile offset of the lane's key k = 0
  const uint32_t pool = spm[4 * v + w] >> (16 * c + g);  // bit 8k: key k in the pool
  double al[2], rh[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) al[k] = dsa[i0 + 8 * k], rh[k] = dsr[i0 + 8 * k];
  uint32_t bits[(kE + 1) / 2] = {};  // bit 16(e mod 2) + g + 8k of bits[e / 2]: key k, query E·qd + e
#pragma unroll
  for (int e = 0; e < kE; ++e) {
    // the query's weights in registers, except in the tie-aware 32-row build, which reads
    // them where used (its registers are the plateau test's: no spills)
    constexpr bool kRegW = !(TIE && RQ == 32);
    float W[kRegW ? RQ : 1];
#pragma unroll
    for (int m = 0; m < (kRegW ? kV : 0); ++m) {
      const float4 a = G.w[(e * kV + m) * 4 + qd];
      W[4 * m] = a.x, W[4 * m + 1] = a.y, W[4 * m + 2] = a.z, W[4 * m + 3] = a.w;
    }
    const float* ws = reinterpret_cast<const float*>(G.w);
    auto weight = [&](int i) -> float {
      if constexpr (kRegW) return W[i];
      else return ws[((e * kV + (i >> 2)) * 4 + qd) * 4 + (i & 3)];
    };
    const QInfo& Q = G.q[kE * qd + e];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      // list row i: accumulator 4j + 2k + (i mod 2) of block j = E·(i / 2) + e
      float y[RQ];
#pragma unroll
      for (int i = 0; i < RQ; ++i) y[i] = d[4 * (kE * (i >> 1) + e) + 2 * k + (i & 1)];
      const float uh = u_hat<RQ>(y, weight);
      // x: the key in the frame of Q's spans (unsigned: past MAX_KEYS a padding key wraps
      // below every span instead of overflowing)
      const int i = i0 + 8 * k, x = ABS ? (int)((unsigned)n0 + (unsigned)i) : i;
      // the store, then the candidate test: in the other order (U < τ decided first) the
      // machine code of these builds changes, which the records measured (python -m
      // dosa_cupy.sass --compare)
      const double U = guard_bound_ru(uh, rh[k], al[k], Q.C, Q.er, eps_out);
      if (Uout && x >= Q.lo && x < Q.hi) Uout[(long long)Q.t * N + n0 + i] = U;
      const bool cand = (unsigned)(x - Q.clo) < (unsigned)Q.cw && !((pool >> (8 * k)) & 1u);
      const bool plain = cand && !(U < Q.tq);  // vis && !seed, U ≥ τ
      bool pl = false;  // TIE: a certified zero-plateau key (every positive row's test holds)
      if constexpr (TIE) {  // the coefficients read where used: registers are the budget
        float miss = 0.f;
#pragma unroll
        for (int m = 0; m < kV; ++m) {
          const float4 z = G.z[(e * kV + m) * 4 + qd];
          miss += plateau_miss(y[4 * m], z.x, rh[k]) + plateau_miss(y[4 * m + 1], z.y, rh[k]) +
                  plateau_miss(y[4 * m + 2], z.z, rh[k]) + plateau_miss(y[4 * m + 3], z.w, rh[k]);
        }
        pl = Q.zp && miss == 0.f;
      }
      const bool p = DOSA_KEEP(TIE, plain, U, Q.tq, pl, n0 + i, Q.kj);
      bits[e >> 1] |= (p ? 1u : 0u) << (16 * (e & 1) + g + 8 * k);
      if constexpr (TIE) L.tie[e] += (plain && !p) ? 1u : 0u;
    }
  }
  merge_bits<RQ>(bits, c, L);
}

// The fp32 guard's epilogue (G32, the plain rule; header "The fp32 guard", "The interleaved
// epilogue"): the loads first, then the lane's 2·E pairs' Û and guards as one run without a
// branch (independent chains, so the scheduler interleaves them), then the keep bits, and
// U^num stored after them where Uout is given.
template <int RQ, bool ABS>
__device__ __forceinline__ void epilogue_g32(const float (&d)[64], int c, const Group<RQ>& G,
                                             const double* dsa, const double* dsr,
                                             const uint32_t* spm, Lane<RQ>& L, double eps_out,
                                             long long N, long long n0,
                                             double* __restrict__ Uout, int lane, int v, int w) {
  using L_ = Rows<RQ>;
  constexpr int kE = L_::kE, kV = L_::kV;
  const int qd = lane & 3, g = lane >> 2;
  const int i0 = 128 * v + 32 * w + 16 * c + g;  // tile offset of the lane's key k = 0
  const uint32_t pool = spm[4 * v + w] >> (16 * c + g);  // bit 8k: key k in the pool
  const float eo32 = f32_ru_keep_subnormal(eps_out);
  float al32[2], rh32[2];
#pragma unroll
  for (int k = 0; k < 2; ++k)
    al32[k] = f32_of_f32_value(dsa[i0 + 8 * k]), rh32[k] = f32_of_f32_value(dsr[i0 + 8 * k]);
  // the lane's queries: weights (E·RQ = 32 registers in every build) and constants
  float W[kE][RQ], C32[kE], er32[kE], tq32[kE];
  int clo[kE], cw[kE];
#pragma unroll
  for (int e = 0; e < kE; ++e) {
#pragma unroll
    for (int m = 0; m < kV; ++m) {
      const float4 a = G.w[(e * kV + m) * 4 + qd];
      W[e][4 * m] = a.x, W[e][4 * m + 1] = a.y, W[e][4 * m + 2] = a.z, W[e][4 * m + 3] = a.w;
    }
    const QInfo& Q = G.q[kE * qd + e];
    C32[e] = Q.C32, er32[e] = Q.er32, tq32[e] = Q.tq32, clo[e] = Q.clo, cw[e] = Q.cw;
  }
  float U32[kE][2];
#pragma unroll
  for (int e = 0; e < kE; ++e)
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      float y[RQ];  // list row i: accumulator 4j + 2k + (i mod 2) of block j = E·(i / 2) + e
#pragma unroll
      for (int i = 0; i < RQ; ++i) y[i] = d[4 * (kE * (i >> 1) + e) + 2 * k + (i & 1)];
      const float uh = u_hat<RQ>(y, [&](int i) { return W[e][i]; });
      U32[e][k] = guard_bound_ru32(uh, rh32[k], al32[k], C32[e], er32[e], eo32);
    }
  uint32_t bits[(kE + 1) / 2] = {};  // bit 16(e mod 2) + g + 8k of bits[e / 2]: key k, query E·qd + e
#pragma unroll
  for (int e = 0; e < kE; ++e)
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int i = i0 + 8 * k, x = ABS ? (int)((unsigned)n0 + (unsigned)i) : i;
      const bool cand = (unsigned)(x - clo[e]) < (unsigned)cw[e] && !((pool >> (8 * k)) & 1u);
      const bool p = cand && !less_keep_subnormal(U32[e][k], tq32[e]);
      bits[e >> 1] |= (p ? 1u : 0u) << (16 * (e & 1) + g + 8 * k);
    }
  if (Uout) {
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      const QInfo& Q = G.q[kE * qd + e];
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int i = i0 + 8 * k, x = ABS ? (int)((unsigned)n0 + (unsigned)i) : i;
        if (x >= Q.lo && x < Q.hi) Uout[(long long)Q.t * N + n0 + i] = (double)U32[e][k];
      }
    }
  }
  merge_bits<RQ>(bits, c, L);
}

// The calling warp's part of one query group in the ring build: the two chunks' MMAs on the
// group's rows and their epilogues into L (zeroed here); TWO: chunk 1's MMAs issued before
// chunk 0's epilogue (TwoAcc), else in turn.  The default build keeps this body
// inline with the next group's staging after chunk 0's MMAs are issued (written there, its
// machine code is the one the GPU has measured: as a call with the staging passed in, ptxas
// allocates 3 more registers, and the 32-row build spills).
template <bool TIE, int RQ, bool ABS, bool TWO, bool FP8 = false, bool G32 = false,
          bool PIPE = false>
__device__ __forceinline__ void screen_group(const Group<RQ>& G, uint32_t sk_addr, Lane<RQ>& L,
                                             const double* dsa, const double* dsr,
                                             const uint32_t* spm, double eps_out, long long N,
                                             long long n0, double* __restrict__ Uout, int lane,
                                             int v, int w) {
  const uint32_t rows_addr = (uint32_t)__cvta_generic_to_shared(G.rows);
  if constexpr (FP8) {  // each chunk's four steps, then its epilogue (header "The FP8 build")
#pragma unroll
    for (int e = 0; e < Rows<RQ>::kE; ++e) L.word[e] = L.tie[e] = 0u;
    float acc[64], x[RQ == 32 ? 32 : 64];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      // (the 32-row build keeps its halves in turn: its registers do not hold a second 32)
      const uint32_t a = sk_addr + 128 * (128 * v + 64 * c);
      if constexpr (PIPE && RQ != 32) chunk_fp8_pipe(acc, x, a, rows_addr);
      else chunk_fp8<RQ == 32>(acc, x, a, rows_addr);
      if constexpr (G32) {
        static_assert(!TIE, "the fp32 guard: the plain rule (the FP8 build)");
        epilogue_g32<RQ, ABS>(acc, c, G, dsa, dsr, spm, L, eps_out, N, n0, Uout, lane, v, w);
      } else {
        epilogue<TIE, RQ, ABS>(acc, c, G, dsa, dsr, spm, L, eps_out, N, n0, Uout, lane, v, w);
      }
    }
  } else {
    float acc[64];
    issue_chunk(acc, sk_addr + 128 * (128 * v), rows_addr);
#pragma unroll
    for (int e = 0; e < Rows<RQ>::kE; ++e) L.word[e] = L.tie[e] = 0u;
    if constexpr (TWO) {  // chunk 1's MMAs run under chunk 0's epilogue
      float acc1[64];
      issue_chunk(acc1, sk_addr + 128 * (128 * v + 64), rows_addr);
      wait<1>();
      pin(acc);
      epilogue<TIE, RQ, ABS>(acc, 0, G, dsa, dsr, spm, L, eps_out, N, n0, Uout, lane, v, w);
      wait<0>();
      pin(acc1);
      epilogue<TIE, RQ, ABS>(acc1, 1, G, dsa, dsr, spm, L, eps_out, N, n0, Uout, lane, v, w);
    } else {
      wait<0>();
      pin(acc);
      epilogue<TIE, RQ, ABS>(acc, 0, G, dsa, dsr, spm, L, eps_out, N, n0, Uout, lane, v, w);
      issue_chunk(acc, sk_addr + 128 * (128 * v + 64), rows_addr);
      wait<0>();
      pin(acc);
      epilogue<TIE, RQ, ABS>(acc, 1, G, dsa, dsr, spm, L, eps_out, N, n0, Uout, lane, v, w);
    }
  }
}

// Word `word` (= 4v + w) of the tile for the lane's queries E·qd + e, written to surv by lanes
// 0..3 (words past the tile's nb skipped).
template <int RQ>
__device__ __forceinline__ void store_words(const Group<RQ>& G, const Lane<RQ>& L,
                                            uint32_t* __restrict__ surv, long long NW,
                                            long long n0, int nb, int word, int lane) {
  constexpr int kE = Rows<RQ>::kE;
  const int qd = lane & 3;
#pragma unroll
  for (int e = 0; e < kE; ++e) {
    const int t = G.q[kE * qd + e].t;
    if (lane < 4 && t >= 0 && word < nb) surv[(long long)t * NW + (n0 >> 5) + word] = L.word[e];
  }
}

// TIE: the warp's tie counts of the lane's queries added to tcnt (where given).
template <bool TIE, int RQ>
__device__ __forceinline__ void add_ties(const Group<RQ>& G, const Lane<RQ>& L,
                                         unsigned int* __restrict__ tcnt, int lane) {
  constexpr int kE = Rows<RQ>::kE;
  const int qd = lane & 3;
  if constexpr (TIE) {
    if (tcnt != nullptr) {
#pragma unroll
      for (int e = 0; e < kE; ++e) {
        unsigned int n = L.tie[e];
        n += __shfl_xor_sync(0xffffffffu, n, 4);
        n += __shfl_xor_sync(0xffffffffu, n, 8);
        n += __shfl_xor_sync(0xffffffffu, n, 16);
        const int t = G.q[kE * qd + e].t;
        if (lane < 4 && n && t >= 0) atomicAdd(tcnt + t, n);
      }
    }
  }
}

// The block's set-up shared by every build: its key tile (load_keys: f16, FP8 the e4m3
// codes), α and ρ as fp64 and the tile's anchor-pool words.
template <bool FP8 = false>
__device__ __forceinline__ void load_tile(const uint8_t* __restrict__ kp,
                                          const float* __restrict__ alpha,
                                          const float* __restrict__ rho,
                                          const uint32_t* __restrict__ poolmask, long long N,
                                          long long n0, uint8_t* sk, double* dsa, double* dsr,
                                          uint32_t* spm) {
  load_keys<FP8>(kp, N, n0, sk);
  for (int i = threadIdx.x; i < kTile; i += kThreads) {
    dsa[i] = n0 + i < N ? (double)__ldg(alpha + n0 + i) : 0.0;
    dsr[i] = n0 + i < N ? (double)__ldg(rho + n0 + i) : 0.0;
  }
  if (threadIdx.x < kTile / 32)
    spm[threadIdx.x] = n0 + 32 * threadIdx.x < N ? __ldg(poolmask + (n0 >> 5) + threadIdx.x) : 0u;
}

}  // namespace wgt
}  // namespace dosa
#endif

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// screen_wg_mt1's contract (screen_sm90a.cu, screen.cu "The keep rule"): for every query
// t < Qn of the block's QG and the block's key tile, the survivor words surv[t, ·] of the
// tile, U^num into Uout[t, i] for every visible key (where Uout is given), TIE: the keys the
// strict rule keeps and the tie-aware rule rejects added to tcnt[t] (where given).
template <bool TIE, int RQ>
__device__ __forceinline__ void screen_wgt(SCREEN_WG_PARAMS_IN, const int* __restrict__ kj,
                                           const float* __restrict__ zrow, SCREEN_WG_PARAMS_KEYS,
                                           unsigned int* __restrict__ tcnt) {
  using namespace dosa;
  using namespace dosa::wg;
  using namespace dosa::wgt;
  using L_ = Rows<RQ>;
  constexpr int kQ = L_::kQ, kE = L_::kE;
  extern __shared__ uint8_t smem_raw[];
  uint32_t dyn;  // the launch must give the layout below (screen.wgt_smem_bytes)
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
  if (dyn < (uint32_t)(L_::kSmemBytes + (L_::kGather ? L_::kWordsBytes : 0))) __trap();
  const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
  uint8_t* sm = smem_raw + ((1024u - (raw & 1023u)) & 1023u);
  uint8_t* sk = sm;
  double* dsa = reinterpret_cast<double*>(sm + L_::kOffAlpha);
  double* dsr = reinterpret_cast<double*>(sm + L_::kOffRho);
  uint32_t* spm = reinterpret_cast<uint32_t*>(sm + L_::kOffPool);
  const TieArgs X{kj, zrow, tcnt};

  const long long n0 = (long long)blockIdx.x * kTile;
  const int tile_n = (int)min((long long)kTile, N - n0), nb = (tile_n + 31) >> 5;
  const long long NW = (N + 31) >> 5;
  const int q0 = blockIdx.y * QG, qend = min(Qn, q0 + QG);
  const int ngroups = (qend - q0 + kQ - 1) / kQ;  // the same for every thread of the block

  load_tile(kp, alpha, rho, poolmask, N, n0, sk, dsa, dsr, spm);
  if (ngroups > 0)
    stage_group<TIE, RQ>(q0, qend, Group<RQ>(sm, 0), rows, om, sig, Cq, eps_raw, tau, X, ks_,
                         ke_, sinks, window, n0, tile_n);
  // ordinary stores above, read by wgmma (the async proxy) below
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, w = warp & 3, v = warp >> 2;
  const int qd = lane & 3;
  const uint32_t sk_addr = (uint32_t)__cvta_generic_to_shared(sk);
#pragma unroll 1
  for (int gi = 0; gi < ngroups; ++gi) {
    const Group<RQ> G(sm, gi & 1);
    const uint32_t rows_addr = (uint32_t)__cvta_generic_to_shared(G.rows);
    float acc[64];
    issue_chunk(acc, sk_addr + 128 * (128 * v), rows_addr);
    // the next group into the other buffer while the tensor cores work (its last readers
    // finished before the barrier that ended the previous group)
    if (gi + 1 < ngroups)
      stage_group<TIE, RQ>(q0 + kQ * (gi + 1), qend, Group<RQ>(sm, (gi + 1) & 1), rows, om, sig,
                           Cq, eps_raw, tau, X, ks_, ke_, sinks, window, n0, tile_n);
    Lane<RQ> L;
#pragma unroll
    for (int e = 0; e < kE; ++e) L.word[e] = L.tie[e] = 0u;
    if constexpr (TwoAcc<TIE>::value) {  // chunk 1's MMAs run under chunk 0's epilogue
      float acc1[64];
      issue_chunk(acc1, sk_addr + 128 * (128 * v + 64), rows_addr);
      wait<1>();
      pin(acc);
      epilogue<TIE, RQ>(acc, 0, G, dsa, dsr, spm, L, eps_out, N, n0, Uout, lane, v, w);
      wait<0>();
      pin(acc1);
      epilogue<TIE, RQ>(acc1, 1, G, dsa, dsr, spm, L, eps_out, N, n0, Uout, lane, v, w);
    } else {
      wait<0>();
      pin(acc);
      epilogue<TIE, RQ>(acc, 0, G, dsa, dsr, spm, L, eps_out, N, n0, Uout, lane, v, w);
      issue_chunk(acc, sk_addr + 128 * (128 * v + 64), rows_addr);
      wait<0>();
      pin(acc);
      epilogue<TIE, RQ>(acc, 1, G, dsa, dsr, spm, L, eps_out, N, n0, Uout, lane, v, w);
    }
    // word 4v + w of the tile for the lane's queries E·qd + e (lanes 0..3 store)
    const int word = 4 * v + w;
    constexpr int kW = kTile / 32;
    uint32_t* sw = reinterpret_cast<uint32_t*>(sm + L_::kOffWords) + (gi & 1) * (kQ * kW + kQ);
    if constexpr (L_::kGather) {  // to shared memory; written out after the barrier
#pragma unroll
      for (int e = 0; e < kE; ++e)
        if (lane < 4) sw[(kE * qd + e) * kW + word] = L.word[e];
      if (threadIdx.x < kQ) sw[kQ * kW + threadIdx.x] = (uint32_t)G.q[threadIdx.x].t;
    } else {
      store_words<RQ>(G, L, surv, NW, n0, nb, word, lane);
    }
    add_ties<TIE, RQ>(G, L, tcnt, lane);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    if constexpr (L_::kGather) {
      // each query's words as one run (this buffer is next written two groups on, after
      // the next group's barrier, which every thread reaches only after these stores)
      for (int x = threadIdx.x; x < kQ * kW; x += kThreads) {
        const int t = (int)sw[kQ * kW + x / kW], wd = x % kW;
        if (t >= 0 && wd < nb) surv[(long long)t * NW + (n0 >> 5) + wd] = sw[x];
      }
    }
  }
}

// The ring build's first kernel: the image of query group blockIdx.x (queries kQ·blockIdx.x
// .. kQ·blockIdx.x + kQ − 1, past Qn: zero rows, t = −1) at image + blockIdx.x·kImageBytes —
// what stage_group writes into a buffer (FP8: e4m3 rows, Ring<RQ, true>), its spans in the
// frame of the whole context.  Grid ceil(Qn / kQ), block kThreads.
template <bool TIE, int RQ, bool FP8>
__device__ __forceinline__ void screen_wgt_image(SCREEN_WG_PARAMS_IN, const int* __restrict__ kj,
                                                 const float* __restrict__ zrow,
                                                 SCREEN_WG_PARAMS_KEYS,
                                                 unsigned int* __restrict__ tcnt,
                                                 uint8_t* __restrict__ image) {
  using namespace dosa::wgt;
  using L_ = Rows<RQ>;
  using R_ = Ring<RQ, FP8>;
  const int t0 = L_::kQ * (int)blockIdx.x;
  if (t0 >= Qn) return;
  const TieArgs X{kj, zrow, tcnt};
  const Group<RQ> G = Group<RQ>::image(image + (long long)blockIdx.x * R_::kImageBytes, R_::kPanels);
  stage_group<TIE, RQ, true, FP8>(t0, Qn, G, rows, om, sig, Cq, eps_raw, tau, X, ks_, ke_, sinks,
                             window, 0, (int)N);
}

// The ring build (header "The ring build"): screen_wgt's contract, its groups' images
// (screen_wgt_image) brought by bulk copies into kRing slots.  No block barrier after the
// set-up: a warp waits for its group's slot to fill, and the last of the block's warps to
// finish reading a slot refills it with the group kRing further on — so the warpgroups drift
// apart by up to two groups and one's epilogue runs under another's MMAs.  QG must be a
// multiple of the build's group (whole images per block).  FP8: the e4m3 operands and the
// fresh-step dots (header "The FP8 build"), the plain rule only.  BARRIER: the racecheck
// control (screen_wgt[_fp8]_ring_rows8_barrier, tests only) — a block barrier after each
// group, then thread 0 refills the slot: the ordering racecheck models, the same words.
template <bool TIE, int RQ, bool FP8, bool BARRIER = false, bool G32 = false, bool PIPE = false>
__device__ __forceinline__ void screen_wgt_ring(SCREEN_WG_PARAMS_IN, const int* __restrict__ kj,
                                                const float* __restrict__ zrow,
                                                SCREEN_WG_PARAMS_KEYS,
                                                unsigned int* __restrict__ tcnt,
                                                const uint8_t* __restrict__ image) {
  using namespace dosa;
  using namespace dosa::wg;
  using namespace dosa::wgt;
  using L_ = Rows<RQ>;
  using R_ = Ring<RQ, FP8>;
  // FP8: no tie-aware build (the plateau coefficients cover the f16 chain's dots, screen.py
  // plateau_rows)
  static_assert(!FP8 || !TIE, "the FP8 build: the plain rule");
  constexpr int kQ = L_::kQ, kWarps = kThreads / 32;
  extern __shared__ uint8_t smem_raw[];
  uint32_t dyn;  // the launch must give the layout below (screen.wgt_ring_smem_bytes)
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
  if (dyn < (uint32_t)R_::kSmemBytes || QG % kQ != 0) __trap();
  const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
  uint8_t* sm = smem_raw + ((1024u - (raw & 1023u)) & 1023u);
  uint8_t* sk = sm;
  uint8_t* slots = sm + R_::kPanels * kKeyPanel;
  double* dsa = reinterpret_cast<double*>(sm + R_::kOffAlpha);
  double* dsr = reinterpret_cast<double*>(sm + R_::kOffRho);
  uint32_t* spm = reinterpret_cast<uint32_t*>(sm + R_::kOffPool);
  uint64_t* full = reinterpret_cast<uint64_t*>(sm + R_::kOffBar);
  unsigned int* readers = reinterpret_cast<unsigned int*>(full + kRing);

  const long long n0 = (long long)blockIdx.x * kTile;
  const int tile_n = (int)min((long long)kTile, N - n0), nb = (tile_n + 31) >> 5;
  const long long NW = (N + 31) >> 5;
  const int q0 = blockIdx.y * QG, qend = min(Qn, q0 + QG);
  const int ngroups = (qend - q0 + kQ - 1) / kQ;  // the same for every thread of the block
  const uint8_t* img = image + (long long)(q0 / kQ) * R_::kImageBytes;  // the block's group 0
  auto fill = [&](int s, int gi) {  // one thread: group gi's image into slot s
    mbar_expect_tx(&full[s], R_::kImageBytes);
    bulk_load(slots + s * R_::kSlotBytes, img + (long long)gi * R_::kImageBytes,
              R_::kImageBytes, &full[s]);
  };

  if (threadIdx.x == 0) {
    for (int s = 0; s < kRing; ++s) {
      mbar_init(&full[s], 1);
      readers[s] = 0u;
    }
    fence_barrier_init();
    for (int s = 0; s < kRing && s < ngroups; ++s) fill(s, s);  // the slots start empty
  }
  load_tile<FP8>(kp, alpha, rho, poolmask, N, n0, sk, dsa, dsr, spm);
  // ordinary stores above (the key tile), read by wgmma (the async proxy) below; the barrier
  // also publishes the mbarriers' initialisation and the reader counts
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, w = warp & 3, v = warp >> 2;
  const uint32_t sk_addr = (uint32_t)__cvta_generic_to_shared(sk);
#pragma unroll 1
  for (int gi = 0; gi < ngroups; ++gi) {
    const int s = gi % kRing;
    const unsigned int use = (unsigned int)(gi / kRing);  // the slot's fills before this one
    // a warp is never a whole use ahead of the slot's phase: the slot is refilled only after
    // every warp has read it, so parity names the phase
    mbar_wait(&full[s], use & 1u);
    __syncwarp();  // the lanes leave the spin together: the wgmma below is .sync.aligned
    const Group<RQ> G = Group<RQ>::image(slots + s * R_::kSlotBytes, R_::kPanels);
    Lane<RQ> L;
    // the 32-row build in turn: with the ring's state, two accumulators would spill
    screen_group<TIE, RQ, true, TwoAcc<TIE>::value && RQ != 32, FP8, G32, PIPE>(
        G, sk_addr, L, dsa, dsr, spm, eps_out, N, n0, Uout, lane, v, w);
    store_words<RQ>(G, L, surv, NW, n0, nb, 4 * v + w, lane);
    add_ties<TIE, RQ>(G, L, tcnt, lane);
    // this warp has read the slot: its MMAs completed (wait<0> in screen_group), its loads of
    // the meta buffer returned (their values are used above); the last reader refills it
    if constexpr (BARRIER) {
      __syncthreads();
      if (threadIdx.x == 0 && gi + kRing < ngroups) {
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        fill(s, gi + kRing);
      }
      continue;
    }
    __syncwarp();
    if (lane == 0) {
      // acq_rel: each warp's count releases its reads of the slot, the last count acquires
      // every other warp's (PTX ISA "Memory Consistency Model"; one atom, no SC fence)
      unsigned int before;
      asm volatile("atom.acq_rel.cta.shared::cta.add.u32 %0, [%1], 1;\n"
                   : "=r"(before)
                   : "r"((uint32_t)__cvta_generic_to_shared(&readers[s]))
                   : "memory");
      if (before == kWarps * (use + 1) - 1 && gi + kRing < ngroups) {
        // the generic reads of the meta buffer before the copy engine's writes (async proxy)
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        fill(s, gi + kRing);
      }
    }
  }
}

#define DOSA_WGT_CALL(TIE, RQ, ...) screen_wgt<TIE, RQ>(__VA_ARGS__)
#define DOSA_WGT_RING_CALL(TIE, RQ, FP8, ...) screen_wgt_ring<TIE, RQ, FP8>(__VA_ARGS__)
#define DOSA_WGT_G32_CALL(RQ, PIPE, ...) \
  screen_wgt_ring<false, RQ, true, false, true, PIPE>(__VA_ARGS__)
#define DOSA_WGT_RING_BARRIER_CALL(FP8, ...) screen_wgt_ring<false, 8, FP8, true>(__VA_ARGS__)
#define DOSA_WGT_IMAGE_CALL(TIE, RQ, FP8, ...) screen_wgt_image<TIE, RQ, FP8>(__VA_ARGS__)
#else
#define DOSA_WGT_CALL(TIE, RQ, ...)
#define DOSA_WGT_RING_CALL(TIE, RQ, FP8, ...)
#define DOSA_WGT_G32_CALL(RQ, PIPE, ...)
#define DOSA_WGT_RING_BARRIER_CALL(FP8, ...)
#define DOSA_WGT_IMAGE_CALL(TIE, RQ, FP8, ...)
#endif

// The kernels screen_wgt_rows{32,16,8} (TIE = false) and their _tie variants (kj and zrow after
// tau, tcnt after Uout) — screen_wg_mt1's parameter lists (screen.ScreenLaunch passes the
// same arguments).  Block dosa::wgt::kThreads, dynamic shared memory Rows<RQ>::kSmemBytes
// (screen.wgt_smem_bytes).
#define DOSA_WGT_KERNELS(RQ)                                                                  \
  extern "C" __global__ void __launch_bounds__(dosa::wgt::kThreads, 1)                        \
      screen_wgt_rows##RQ(SCREEN_WG_PARAMS_IN, SCREEN_WG_PARAMS_KEYS) {                       \
    DOSA_WGT_CALL(false, RQ, SCREEN_WG_ARGS_IN, nullptr, nullptr, SCREEN_WG_ARGS_KEYS, nullptr); \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(dosa::wgt::kThreads, 1)                        \
      screen_wgt_rows##RQ##_tie(SCREEN_WG_PARAMS_IN, const int* __restrict__ kj,              \
                                const float* __restrict__ zrow, SCREEN_WG_PARAMS_KEYS,        \
                                unsigned int* __restrict__ tcnt) {                            \
    DOSA_WGT_CALL(true, RQ, SCREEN_WG_ARGS_IN, kj, zrow, SCREEN_WG_ARGS_KEYS, tcnt);          \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(dosa::wgt::kThreads, 1)                        \
      screen_wgt_ring_rows##RQ(SCREEN_WG_PARAMS_IN, SCREEN_WG_PARAMS_KEYS,                    \
                               const uint8_t* __restrict__ image) {                           \
    DOSA_WGT_RING_CALL(false, RQ, false, SCREEN_WG_ARGS_IN, nullptr, nullptr, SCREEN_WG_ARGS_KEYS,   \
                       nullptr, image);                                                       \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(dosa::wgt::kThreads, 1)                        \
      screen_wgt_ring_rows##RQ##_tie(SCREEN_WG_PARAMS_IN, const int* __restrict__ kj,         \
                                     const float* __restrict__ zrow, SCREEN_WG_PARAMS_KEYS,   \
                                     unsigned int* __restrict__ tcnt,                         \
                                     const uint8_t* __restrict__ image) {                     \
    DOSA_WGT_RING_CALL(true, RQ, false, SCREEN_WG_ARGS_IN, kj, zrow, SCREEN_WG_ARGS_KEYS, tcnt, image); \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(dosa::wgt::kThreads)                           \
      screen_wgt_image_rows##RQ(SCREEN_WG_PARAMS_IN, SCREEN_WG_PARAMS_KEYS,                   \
                                uint8_t* __restrict__ image) {                                \
    DOSA_WGT_IMAGE_CALL(false, RQ, false, SCREEN_WG_ARGS_IN, nullptr, nullptr, SCREEN_WG_ARGS_KEYS,  \
                        nullptr, image);                                                      \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(dosa::wgt::kThreads)                           \
      screen_wgt_image_rows##RQ##_tie(SCREEN_WG_PARAMS_IN, const int* __restrict__ kj,        \
                                      const float* __restrict__ zrow, SCREEN_WG_PARAMS_KEYS,  \
                                      unsigned int* __restrict__ tcnt,                        \
                                      uint8_t* __restrict__ image) {                          \
    DOSA_WGT_IMAGE_CALL(true, RQ, false, SCREEN_WG_ARGS_IN, kj, zrow, SCREEN_WG_ARGS_KEYS, tcnt,      \
                        image);                                                               \
  }
DOSA_WGT_KERNELS(32)
DOSA_WGT_KERNELS(16)
DOSA_WGT_KERNELS(8)

// The FP8 build (header "The FP8 build"): screen_wgt_fp8_image_rows{32,16,8}, then
// screen_wgt_fp8_ring_rows{32,16,8} — the ring kernels' parameter lists, the plain rule only —
// and screen_wgt_fp8_ring_rows{32,16,8}_g32, the same with the fp32 guard and its
// interleaved epilogue (headers "The fp32 guard", "The interleaved epilogue"), and
// screen_wgt_fp8_ring_rows{32,16,8}_g32p, those with the pipelined halves (header "The
// pipelined halves"; the 32-row one the _g32 kernel's code).
#define DOSA_WGT_FP8_KERNELS(RQ)                                                              \
  extern "C" __global__ void __launch_bounds__(dosa::wgt::kThreads, 1)                        \
      screen_wgt_fp8_ring_rows##RQ(SCREEN_WG_PARAMS_IN, SCREEN_WG_PARAMS_KEYS,                \
                                   const uint8_t* __restrict__ image) {                       \
    DOSA_WGT_RING_CALL(false, RQ, true, SCREEN_WG_ARGS_IN, nullptr, nullptr,                  \
                       SCREEN_WG_ARGS_KEYS, nullptr, image);                                  \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(dosa::wgt::kThreads)                           \
      screen_wgt_fp8_image_rows##RQ(SCREEN_WG_PARAMS_IN, SCREEN_WG_PARAMS_KEYS,               \
                                    uint8_t* __restrict__ image) {                            \
    DOSA_WGT_IMAGE_CALL(false, RQ, true, SCREEN_WG_ARGS_IN, nullptr, nullptr,                 \
                        SCREEN_WG_ARGS_KEYS, nullptr, image);                                 \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(dosa::wgt::kThreads, 1)                        \
      screen_wgt_fp8_ring_rows##RQ##_g32(SCREEN_WG_PARAMS_IN, SCREEN_WG_PARAMS_KEYS,          \
                                         const uint8_t* __restrict__ image) {                 \
    DOSA_WGT_G32_CALL(RQ, false, SCREEN_WG_ARGS_IN, nullptr, nullptr, SCREEN_WG_ARGS_KEYS,    \
                      nullptr, image);                                                        \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(dosa::wgt::kThreads, 1)                        \
      screen_wgt_fp8_ring_rows##RQ##_g32p(SCREEN_WG_PARAMS_IN, SCREEN_WG_PARAMS_KEYS,         \
                                          const uint8_t* __restrict__ image) {                \
    DOSA_WGT_G32_CALL(RQ, true, SCREEN_WG_ARGS_IN, nullptr, nullptr, SCREEN_WG_ARGS_KEYS,     \
                      nullptr, image);                                                        \
  }
DOSA_WGT_FP8_KERNELS(32)
DOSA_WGT_FP8_KERNELS(16)
DOSA_WGT_FP8_KERNELS(8)

// The racecheck control of the ring builds' slot protocol (tests/test_gpu_screen_wgt.py
// test_wgt_ring_barrier_control): the 8-row ring kernels with the refill after a block
// barrier (screen_wgt_ring's BARRIER); the images of screen_wgt[_fp8]_image_rows8.
#define DOSA_WGT_RING_BARRIER_KERNEL(NAME, FP8)                                               \
  extern "C" __global__ void __launch_bounds__(dosa::wgt::kThreads, 1)                        \
      NAME(SCREEN_WG_PARAMS_IN, SCREEN_WG_PARAMS_KEYS, const uint8_t* __restrict__ image) {   \
    DOSA_WGT_RING_BARRIER_CALL(FP8, SCREEN_WG_ARGS_IN, nullptr, nullptr, SCREEN_WG_ARGS_KEYS, \
                               nullptr, image);                                               \
  }
DOSA_WGT_RING_BARRIER_KERNEL(screen_wgt_ring_rows8_barrier, false)
DOSA_WGT_RING_BARRIER_KERNEL(screen_wgt_fp8_ring_rows8_barrier, true)
