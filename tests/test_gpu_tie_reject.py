"""The tie-aware rejection rule and the zero-plateau bound on the GPU (docs/method.md §7
"Tie-aware rejection and zero plateaus"; proofs/gpu_zero_plateau.py).

CPU tests: the host helpers (``select.kth_ids``, ``screen.pair_gather``,
``screen.plateau_rows`` on numpy plans), the option, and the proof's witnesses and mutants.
GPU tests (marked ``gpu``, skipped without CuPy / a GPU; ``screen="wg"`` also needs sm_90a):
ids equal ``dense_topk`` bitwise with ``tie_reject`` on and off for every screen on the
"ties", "equal" and a crafted zero-plateau workload. Only the plateau workload (τ = 0 in
every query) runs the tie-aware variants (``screen.tie_screen_wanted``); there the rule must
cut the survivors (survivors(on) ⊊ survivors(off), bit for bit, and ``tie_rejected``
accounts for the difference). Not covered: the tie variants of screen_mt2 / screen_cert_mt2
("fp64" runs at r = 14), a chunk mixing τ = 0 and τ ≠ 0 queries, and U = τ with i > j at
τ ≠ 0.
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_support import cp, gpu, needs_sm90a

import dosa_cupy
from dosa_cupy import sm90a
from dosa_cupy.options import check_options
from dosa_cupy.plan import build_plans, gamma_mma, row_tiles
from dosa_cupy.screen import PAIR_ROWS, pair_gather, plateau_rows
from dosa_cupy.select import NO_KTH_ID, kth_ids
from dosa_ref.fp8 import e4m3_bits, e4m3_values
from proofs import gpu_zero_plateau as proof

# ---------------------------------------------------------------------------------------
# CPU: host helpers
# ---------------------------------------------------------------------------------------


def test_kth_ids_decodes_records_and_marks_missing():
    ids = np.array([0, 5, 2**31 - 2, 123456], dtype=np.int64)
    rec = (np.uint64(0xBF800000) << np.uint64(32)) | ((~ids) & 0xFFFFFFFF).astype(np.uint64)
    rec[1] = 0  # fewer than K seeds: no K-th record
    got = kth_ids(rec, np)
    assert got.dtype == np.int32
    assert got.tolist() == [0, NO_KTH_ID, 2**31 - 2, 123456]


@pytest.mark.parametrize("Qn", [1, 2, 5])
def test_pair_gather_follows_pair_rows(Qn):
    x = np.arange(Qn * 16, dtype=np.float32).reshape(Qn, 16)
    got = pair_gather(x, np.nan, np)
    assert got.shape == ((Qn + 1) // 2, 16)
    for p in range(got.shape[0]):
        for i, (who, j) in enumerate(PAIR_ROWS):
            t = 2 * p + who
            want = x[t, j] if t < Qn else np.nan
            assert got[p, i] == want or (np.isnan(want) and np.isnan(got[p, i]))
    assert got.flags.c_contiguous  # a kernel argument
    with pytest.raises(ValueError, match="^x:"):
        pair_gather(np.zeros((Qn, 15), np.float32), np.nan, np)


def _e4m3_problem(rng, Qn, Hp, n_pos, n_neg):
    qf = rng.standard_normal((Qn, Hp, 128)).astype(np.float32)
    q = e4m3_bits(qf)
    w = np.zeros((Qn, Hp), np.float32)
    w[:, :n_pos] = rng.uniform(0.1, 1.0, (Qn, n_pos))
    w[:, n_pos : n_pos + n_neg] = -rng.uniform(0.1, 1.0, (Qn, n_neg))
    kp = e4m3_bits(rng.standard_normal((64, 128)).astype(np.float32))
    return q, w, kp


@pytest.mark.parametrize("n_pos,r", [(0, 14), (3, 14), (3, 6), (9, 6), (20, 14), (20, 30)])
def test_plateau_rows(n_pos, r):
    """Rows of positive heads get z ≥ 2γ_mma√D‖q̄‖, every other row −1; a query with an
    omitted positive head (|H+| > r) gets NaN rows (no plateau)."""
    rng = np.random.default_rng(n_pos + r)
    Hp = 32
    q, w, kp = _e4m3_problem(rng, 3, Hp, n_pos, 4)
    mts = row_tiles(r)
    plan = build_plans(q, w, kp, None, r, mts, 17, xp=np)
    z = plateau_rows(plan, w, 17, np)
    assert z.dtype == np.float32 and z.shape == (3, 16 * mts)
    if n_pos > r:
        assert np.isnan(z).all()
        return
    assert not np.isnan(z).any()
    rows = e4m3_values(plan.rows)
    norm = np.sqrt((rows * rows).sum(axis=2))
    pos = plan.omega > 0
    assert (pos.sum(axis=1) == n_pos).all()
    assert (z[~pos] == -1).all()
    need = 2 * gamma_mma(17) * np.sqrt(128) * norm
    assert (z[pos] >= need[pos]).all()
    # and no looser than that (every unit of z costs pruning): fp32 round-up plus (1 + MU)²
    assert (z[pos] <= need[pos] * (1 + 2.0**-22)).all()


def test_plateau_rows_margin_holds_on_many_rows():
    """z ≥ 2γ_mma√D‖q̄‖ on thousands of rows: the fp64 evaluation's (1 + MU) margins are
    what keep the fp32 round-up above the bound when an fp32 value lies just below it
    (about 2 % of rows lie within 2^-29 of one)."""
    rng = np.random.default_rng(7)
    q, w, kp = _e4m3_problem(rng, 768, 16, 6, 4)
    plan = build_plans(q, w, kp, None, 14, 1, 17, xp=np)
    z = plateau_rows(plan, w, 17, np)
    rows = e4m3_values(plan.rows)
    need = 2 * gamma_mma(17) * np.sqrt(128) * np.sqrt((rows * rows).sum(axis=2))
    pos = plan.omega > 0
    assert pos.sum() == 768 * 6
    assert (z[pos] >= need[pos]).all()


@pytest.mark.parametrize(
    "path,plain,tie",
    [
        ("screen.cu", r"\bscreen_mt##MTS", r"\bscreen_mt##MTS##_tie"),
        ("screen.cu", r"\bscreen_cert_mt##MTS", r"\bscreen_cert_mt##MTS##_tie"),
        ("screen.cu", r"\bscreen_pair", r"\bscreen_pair_tie"),
        ("screen_sm90a.cu", r"DOSA_WG_CAT\(screen_wg_mt, 1\)",
         r"DOSA_WG_CAT\(DOSA_WG_CAT\(screen_wg_mt, 1\), _tie\)"),
    ],
)  # fmt: skip
def test_tie_variant_signature_is_the_plain_one_plus_kj_zrow_tcnt(path, plain, tie):
    """The tie-aware variant (name + _tie) of each screen kernel takes the plain kernel's
    parameters with kj (int) and zrow (float) after tau and tcnt (uint32) after Uout: the
    order ``ScreenLaunch`` passes them in (screen.py)."""
    from pathlib import Path

    from cuda_signatures import params, read_source

    src = read_source(Path(__file__).resolve().parents[1] / "dosa_cupy" / "csrc" / path)
    p, t = params(src, plain), params(src, tie)
    names = [n for _, n in p]
    i, j = names.index("tau") + 1, names.index("Uout") + 1
    want = p[:i] + [(np.int32, "kj"), (np.float32, "zrow")] + p[i:j] + [(np.uint32, "tcnt")] + p[j:]
    assert t == want


def test_tie_reject_option():
    assert check_options({})["tie_reject"] is True
    assert check_options({"tie_reject": False})["tie_reject"] is False
    with pytest.raises(ValueError, match="^tie_reject"):
        check_options({"tie_reject": "yes"})


def test_proof_witnesses_and_mutants():
    assert proof.check_boundary().ok
    assert proof.check_records().ok
    wit = proof.zero_dot_witness()
    assert proof.check(**wit).ok
    assert not proof.check(**wit, mutate="no_allowance").ok
    rng = np.random.default_rng(1)
    q, w, kp = proof.plateau_problem(rng, 2, 16, 24, 2, 0.3)
    assert proof.check(q=q, w=w, kp=kp).ok
    assert not proof.check(q=q, w=w, kp=kp, mutate="uncertified").ok


# ---------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------


def plateau_workload(Qn: int = 16, N: int = 8192, H: int = 16, hot: float = 0.02, seed: int = 0):
    """A crafted zero plateau: every head (2 positive, 3 negative) points along +e_0 and the
    keys against it, except a ``hot`` share along it — ReLU zeroes every head on the other
    keys, so their score is exactly 0, and with K above the number of hot keys the K-th
    score is 0.  Positive weights dominate, so hot keys score > 0.  Returns the
    ``make_gpu_workload`` dict (device arrays, every key visible)."""
    from dosa_cupy.prepare import quantize_keys
    from dosa_cupy.workload import quantize_queries

    rs = np.random.default_rng(seed)
    kf = 0.25 * rs.standard_normal((N, 128))
    kf[:, 0] = -rs.uniform(1.0, 3.0, N)
    kf[rs.random(N) < hot, 0] = rs.uniform(1.0, 3.0)
    qf = 0.1 * rs.standard_normal((Qn, H, 128))
    qf[:, :5, 0] = rs.uniform(1.5, 3.0, (Qn, 5))
    wf = np.zeros((Qn, H))
    wf[:, :2] = rs.uniform(2.0, 3.0, (Qn, 2))
    wf[:, 2:5] = -rs.uniform(0.1, 0.5, (Qn, 3))
    kp, ksc, _ = quantize_keys(cp.asarray(kf, dtype=cp.float32))
    q, w = quantize_queries(cp.asarray(qf, dtype=cp.float32), cp.asarray(wf, dtype=cp.float32))
    ks = cp.zeros(Qn, dtype=cp.int32)
    ke = cp.full(Qn, N, dtype=cp.int32)
    return dict(q=q, w=w, k_payload=kp, k_scale=ksc, ks=ks, ke=ke)


def _args(wl, K):
    return (wl["q"], wl["w"], wl["k_payload"], wl["k_scale"], K, wl["ks"], wl["ke"])


def _workload(regime):
    from dosa_cupy.workload import make_gpu_workload

    if regime == "plateau":
        return plateau_workload(), 512
    if regime == "ties":
        return make_gpu_workload("ties", 32, 8192, 32, seed=3), 256
    return make_gpu_workload("equal", 32, 4100, 32, seed=3), 256


SCREENS = [
    ("fp64", {}),
    ("pair", {"r": 6}),
    ("wg", {}),
    ("wg-r30", {"r": 30}),
    ("fp64-cert", {"cert_seeds": 256}),
]


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("screen,extra", SCREENS, ids=[s for s, _ in SCREENS])
@pytest.mark.parametrize("regime", ["plateau", "ties", "equal"])
@gpu
def test_gpu_tie_reject_ids_equal_dense(regime, screen, extra, tie):
    if screen.startswith("wg") and not sm90a.available():
        pytest.skip("screen='wg' needs a compute-capability-9.0 GPU and nvcc")
    wl, K = _workload(regime)
    args = _args(wl, K)
    dense = cp.asnumpy(dosa_cupy.dense_topk(*args))
    opt = dict(extra, screen=screen.split("-")[0], tie_reject=tie, return_stats=True)
    ids, st = dosa_cupy.dosa_topk(*args, **opt)
    ids = cp.asnumpy(ids)
    print(
        f"\n[tie-reject] {regime} {screen} tie={tie}: survivors={int(st.survivors.sum())} "
        f"tie_rejected={int(st.tie_rejected.sum())} kept={int(st.kept.sum())}"
    )
    assert np.array_equal(ids, dense), f"{int((ids != dense).sum())} ids differ"
    if not tie:
        assert int(st.tie_rejected.sum()) == 0
    elif regime == "plateau":  # τ = 0 everywhere: the tie variant ran and rejected keys
        assert int(st.tie_rejected.sum()) > 0


@pytest.mark.parametrize("screen,extra", SCREENS[:4], ids=[s for s, _ in SCREENS[:4]])
@gpu
def test_gpu_plateau_cuts_survivors(screen, extra):
    """On the crafted plateau (τ = 0 for every query) the tie-aware rule with the zero
    plateau bound keeps strictly fewer survivors than the plain rule, a subset of them bit
    for bit, and survivors(on) + tie_rejected(on) = survivors(off) per query."""
    if screen == "wg" and not sm90a.available():
        pytest.skip("screen='wg' needs a compute-capability-9.0 GPU and nvcc")
    from dosa_cupy.options import resolved, start
    from dosa_cupy.plan import plan_stage
    from dosa_cupy.prepare import key_rho
    from dosa_cupy.refine import popcount_rows
    from dosa_cupy.screen import auto_screen, screen_stage
    from dosa_cupy.seeds import seed_stage

    wl, K = _workload("plateau")
    args = _args(wl, K)
    name = screen.split("-")[0]
    surv, counts, tie_rej = {}, {}, {}
    for tie in (True, False):
        opt = dict(extra, screen=name, tie_reject=tie, return_stats=True)
        o, _, _, b, _ = start(*args, opt)
        seeds = seed_stage(b, o)
        assert np.all(cp.asnumpy(seeds.tau) == 0.0), "the crafted case must have τ = 0"
        scr, r = auto_screen(o["screen"], int(o["r"]), int(o["cert_seeds"]), b.w, cp)
        o = resolved(o, screen=scr)
        plan = plan_stage(b, seeds.pool, r, o, seeds.pcount)
        assert int(plan.omitted_positive.sum()) == 0  # P = ∅: the plateau applies
        screened = screen_stage(b, plan, seeds, key_rho(b.kp), o)
        surv[tie] = cp.asnumpy(screened.surv)
        counts[tie] = cp.asnumpy(popcount_rows(screened.surv, cp))
        _, st = dosa_cupy.dosa_topk(*args, **opt)
        assert np.array_equal(st.survivors, counts[tie])
        tie_rej[tie] = np.asarray(st.tie_rejected)
    assert not tie_rej[False].any()
    assert np.all(surv[True] & ~surv[False] == 0), "survivors(on) ⊄ survivors(off)"
    assert counts[True].sum() < counts[False].sum()
    assert np.array_equal(counts[True] + tie_rej[True], counts[False])
    print(f"\n[plateau] {screen}: survivors on={counts[True].sum()} off={counts[False].sum()}")


@needs_sm90a
@gpu
def test_gpu_wg_tie_survivors_equal_screen_mt1():
    """screen="wg" applies the same rule as screen_mt1: the same survivors bit for bit."""
    for regime in ("plateau", "ties"):
        wl, K = _workload(regime)
        args = _args(wl, K)
        _, a = dosa_cupy.dosa_topk(*args, screen="wg", return_stats=True)
        _, b = dosa_cupy.dosa_topk(*args, screen="fp64", return_stats=True)
        assert np.array_equal(a.survivors, b.survivors)
        assert np.array_equal(a.tie_rejected, b.tie_rejected)


@gpu
def test_tau_from_kth_writes_the_kth_ids():
    """select.cu tau_from_kth with an ids array (``select.tau_of_seeds`` with want_id): τ as
    without it, and the ids ``kth_ids``'s (NO_KTH_ID for the empty record 0)."""
    from dosa_cupy.select import score_of_records

    rs = np.random.RandomState(5)
    rec = rs.randint(0, 2**63, size=1000, dtype=np.int64).astype(np.uint64) << np.uint64(1)
    rec[::9] = 0
    ids = np.array([0, 1, 2**31 - 2, 77], dtype=np.int64)
    rec[:4] = (np.uint64(0x3F800000) << np.uint64(32)) | ((~ids) & 0xFFFFFFFF).astype(np.uint64)
    kth = cp.asarray(rec)
    got = cp.empty(kth.shape[0], dtype=cp.int32)
    tau = score_of_records(kth, got)
    assert bool((tau.view(cp.uint32) == score_of_records(kth).view(cp.uint32)).all())
    assert cp.array_equal(got, kth_ids(kth, cp))
    assert cp.asnumpy(got[:4]).tolist() == [0, 1, 2**31 - 2, 77]
