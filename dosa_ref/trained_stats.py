"""Where the trained regime's Top-K sits in the encoder's windows (docs/workloads.md §1.2).

A check that the Top-K of a trained workload is not an artifact of how its hidden states
were made: for chosen queries, the exact Top-K (``topk_ids(index_scores(...))``) is binned
by each selected key's offset in its source window, and by two classes of window-start
tokens, and every bin's share of the Top-K is divided by its *uniform share* (the share of
the query's visible keys in that bin).  A ratio of 1 is what a Top-K blind to window
positions gives; the done-when of the continuous construction is a ratio of at most
``LIMIT`` (3) in every bin, for every query checked.

- **Offsets**: bins 0 … WINDOW − 1 of ``src_offset`` (the offset of a key in the window its
  state was taken from).  The windowed construction's artifact shows up as offset 0 (every
  window's first token, a sink) and the query's own offset (in-window positions repeat
  with period WINDOW).
- **Classes**: ``window start`` (a token that is the first of some encoded window of the
  plan: for the windowed construction the tokens at offset 0; for the continuous one
  tokens whose own state comes from another window, where they are not first) and
  ``offset 0`` (a token whose state *is* a window's first row: for the continuous
  construction only the first token of the held-out half, the context's one sink).

A bin whose uniform expectation (K · uniform share) is below ``min_expected`` keys gets no
ratio (NaN): one selected key in a bin of a handful would read as a large ratio by chance
(for the continuous construction, the held-out half's first 128 tokens are such bins).
Such bins still count in ``sparse_selected``, and ``offset0_selected`` counts the selected
keys at offset 0 whatever their bin's size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "LIMIT",
    "TopKDistribution",
    "format_topk_distribution",
    "topk_distribution",
    "trained_topk_distribution",
    "workload_topk_distribution",
]

LIMIT = 3.0  # the done-when: no bin above 3× its uniform share (docs/workloads.md §1.2)
CLASSES = ("window start", "offset 0")


@dataclass(frozen=True)
class TopKDistribution:
    """The Top-K's distribution over source-window bins for R queries (§1.2).

    rows int64 [R]: the queries' rows in the workload; K int64 [R]: selected keys per query;
    offset_ratio float64 [R, WINDOW]: per offset bin, (share of the Top-K) / (share of the
    visible keys), NaN for sparse bins; offset_selected int64 [R, WINDOW]: selected keys
    per bin; own_offset int64 [R]: the query token's own offset; class_ratio float64
    [R, 2] and class_selected / class_visible int64 [R, 2]: the two classes of ``CLASSES``;
    offset0_selected int64 [R]; sparse_selected int64 [R]: selected keys in sparse offset
    bins; ``params``: the workload's (construction, N, H, …)."""

    rows: np.ndarray
    K: np.ndarray
    offset_ratio: np.ndarray
    offset_selected: np.ndarray
    own_offset: np.ndarray
    class_ratio: np.ndarray
    class_selected: np.ndarray
    class_visible: np.ndarray
    offset0_selected: np.ndarray
    sparse_selected: np.ndarray
    params: dict

    @property
    def max_offset_ratio(self) -> np.ndarray:
        """float64 [R]: the largest offset-bin ratio of each query (NaN: none dense)."""
        r = self.offset_ratio
        return np.where(np.isnan(r).all(1), np.nan, np.nanmax(np.nan_to_num(r, nan=-1.0), 1))

    @property
    def argmax_offset(self) -> np.ndarray:
        """int64 [R]: the offset bin holding that ratio."""
        return np.argmax(np.nan_to_num(self.offset_ratio, nan=-1.0), axis=1)

    @property
    def own_offset_ratio(self) -> np.ndarray:
        """float64 [R]: the ratio of the bin of the query's own offset."""
        return self.offset_ratio[np.arange(self.rows.size), self.own_offset]

    @property
    def max_ratio(self) -> np.ndarray:
        """float64 [R]: the largest ratio of any offset bin or class, per query."""
        both = np.concatenate([self.offset_ratio, self.class_ratio], axis=1)
        return np.nanmax(np.nan_to_num(both, nan=-1.0), axis=1)

    @property
    def checked(self) -> bool:
        """Every query has at least one dense bin (a ratio to compare with ``LIMIT``)."""
        both = np.concatenate([self.offset_ratio, self.class_ratio], axis=1)
        return bool(self.rows.size) and bool(np.all((~np.isnan(both)).any(axis=1)))

    @property
    def passed(self) -> bool:
        """Checked, and no offset bin and no class above ``LIMIT`` × its uniform share, for
        every query."""
        return self.checked and bool(np.all(self.max_ratio <= LIMIT))


def _ratio(sel, vis, k, n_vis, min_expected):
    """(sel / k) / (vis / n_vis), NaN where the uniform expectation k·vis/n_vis is below
    ``min_expected``; sel, vis int [..., B], k, n_vis int [...]."""
    k = np.asarray(k, dtype=np.float64)[..., None]
    n_vis = np.asarray(n_vis, dtype=np.float64)[..., None]
    expected = k * vis / np.maximum(n_vis, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = sel / np.maximum(expected, 1e-300)
    return np.where(expected >= min_expected, r, np.nan)


def topk_distribution(
    ids,
    ks,
    ke,
    src_offset,
    window_start,
    own,
    *,
    min_expected: float = 5.0,
    rows=None,
    params: dict | None = None,
    window: int = 256,
) -> TopKDistribution:
    """The distribution of Top-K ``ids`` over source-window bins (module docstring).

    ids int [R, K] (−1 padding ignored): the Top-K of R queries; ks, ke int [R]: their
    visible ranges [ks, ke); src_offset int [N]: each key's offset in its source window
    (0 … window − 1); window_start bool [N]: the ``window start`` class; own int [R]: each
    query's own offset (src_offset of its token); ``rows`` int [R] (default 0 … R − 1)
    and ``params`` are carried into the result.  The ``offset 0`` class is
    ``src_offset == 0``."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.ndim != 2:
        raise ValueError(f"ids: expected [R, K], got shape {ids.shape}")
    R = ids.shape[0]
    off = np.asarray(src_offset, dtype=np.int64)
    if off.size and (off.min() < 0 or off.max() >= window):
        raise ValueError(f"src_offset: offsets outside [0, {window})")
    cls = np.stack([np.asarray(window_start, dtype=bool), off == 0], axis=1)  # [N, 2]
    ks, ke = np.asarray(ks, dtype=np.int64), np.asarray(ke, dtype=np.int64)
    vis = np.zeros((R, window), dtype=np.int64)
    sel = np.zeros((R, window), dtype=np.int64)
    cvis = np.zeros((R, 2), dtype=np.int64)
    csel = np.zeros((R, 2), dtype=np.int64)
    K = np.zeros(R, dtype=np.int64)
    for r in range(R):
        a, b = int(ks[r]), int(ke[r])
        vis[r] = np.bincount(off[a:b], minlength=window)
        cvis[r] = cls[a:b].sum(0)
        got = ids[r][ids[r] >= 0]
        if got.size and (got.min() < a or got.max() >= b):
            raise ValueError(f"ids: row {r} selects keys outside its visible range [{a}, {b})")
        K[r] = got.size
        sel[r] = np.bincount(off[got], minlength=window)
        csel[r] = cls[got].sum(0)
    n_vis = ke - ks
    ratio = _ratio(sel, vis, K, n_vis, min_expected)
    return TopKDistribution(
        rows=np.arange(R, dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64),
        K=K,
        offset_ratio=ratio,
        offset_selected=sel,
        own_offset=np.asarray(own, dtype=np.int64),
        class_ratio=_ratio(csel, cvis, K, n_vis, min_expected),
        class_selected=csel,
        class_visible=cvis,
        offset0_selected=sel[:, 0].copy(),
        sparse_selected=np.where(np.isnan(ratio), sel, 0).sum(1),
        params=dict(params or {}),
    )


def _host(a) -> np.ndarray:
    return np.asarray(a.get() if hasattr(a, "get") else a)


def workload_topk_distribution(wl, K: int = 2048, rows=None, **kw) -> TopKDistribution:
    """``topk_distribution`` of a trained workload: ``wl`` a dict of
    ``make_trained_workload`` / ``make_windowed_workload`` (arrays of numpy or cupy) or a
    ``dosa_ref.workloads.Workload`` of the trained regime (its sources rebuilt from its
    ``params``).  The Top-K of queries ``rows`` (default: the first, middle and last of
    the chunk) is the exact one, ``topk_ids(index_scores(...))`` on the host."""
    from .scorer import index_scores, topk_ids
    from .trained import sources_of

    get = wl.get if isinstance(wl, dict) else lambda k: getattr(wl, k)
    params = get("params")
    q, w, k, ks, ke = (_host(get(n)) for n in ("q", "w", "k", "ks", "ke"))
    Qn = q.shape[0]
    rows = np.unique([0, Qn // 2, Qn - 1]) if rows is None else np.asarray(rows, dtype=np.int64)
    src = sources_of(params)
    ids = topk_ids(index_scores(q[rows], w[rows], k, ks[rows], ke[rows]), K)
    own_pos = np.asarray(params["N"] - Qn + rows, dtype=np.int64)  # query t's token position
    return topk_distribution(
        ids, ks[rows], ke[rows], src.offset, src.at_window_start(), src.offset[own_pos],
        rows=rows, params=params, **kw,
    )  # fmt: skip


def trained_topk_distribution(
    Qn: int = 32,
    N: int = 65536,
    H: int | None = None,
    seed: int = 0,
    K: int = 2048,
    rows=None,
    *,
    construction: str = "continuous",
    indexer=None,
    **kw,
) -> TopKDistribution:
    """Build a trained workload (``construction`` "continuous" or "windowed"; H default
    64; ``indexer`` default the shipped one) and check its Top-K (``rows`` default: the
    first, middle and last query).  ``dosa calibrate --regime trained`` prints it."""
    from . import trained

    H = 64 if H is None else int(H)
    make = {"continuous": trained.make_trained_workload, "windowed": trained.make_windowed_workload}
    if construction not in make:
        raise ValueError(f"construction: expected one of {sorted(make)}, got {construction!r}")
    wl = make[construction](Qn, N, H, seed, indexer=indexer)
    return workload_topk_distribution(wl, K, rows, **kw)


def format_topk_distribution(d: TopKDistribution, top: int = 3) -> str:
    """A markdown table of ``d``: one line per query with its largest offset-bin ratio
    (and which offset), the ratio of its own offset, the two classes (ratio, selected /
    visible), the selected keys at offset 0 and in sparse bins; then the verdict against
    ``LIMIT``.  ``top``: how many of the largest offset bins to list per query."""
    p = d.params
    head = (
        f"Top-K over source-window offsets ({p.get('construction', '?')} construction, "
        f"N={p.get('N', '?')}, H={p.get('H', '?')}, seed={p.get('seed', '?')}, "
        f"indexer {p.get('indexer', '?')} trained on the "
        f"{p.get('indexer_construction', '?')} construction); ratio = share of the Top-K / "
        f"share of the visible keys, limit {LIMIT:g}"
    )
    lines = [
        head,
        "",
        "| query | K | max offset ratio (offset) | largest bins | own offset: ratio "
        "| window start: ratio (sel/vis) | offset 0: sel/vis | sparse sel |",
        "|---:|---:|---:|---|---:|---:|---:|---:|",
    ]

    def f(x):
        return "-" if np.isnan(x) else f"{x:.2f}"

    for i in range(d.rows.size):
        r = np.nan_to_num(d.offset_ratio[i], nan=-1.0)
        big = np.argsort(-r, kind="stable")[:top]
        bins = ", ".join(f"{int(b)}: {f(d.offset_ratio[i, b])}" for b in big if r[b] >= 0)
        lines.append(
            f"| {int(d.rows[i])} | {int(d.K[i])} | {f(d.max_offset_ratio[i])} "
            f"({int(d.argmax_offset[i])}) | {bins} | {int(d.own_offset[i])}: "
            f"{f(d.own_offset_ratio[i])} | {f(d.class_ratio[i, 0])} "
            f"({int(d.class_selected[i, 0])}/{int(d.class_visible[i, 0])}) | "
            f"{int(d.class_selected[i, 1])}/{int(d.class_visible[i, 1])} | "
            f"{int(d.sparse_selected[i])} |"
        )
    if not d.checked:
        lines += ["", "not checked: some query has no bin with enough expected keys"]
    else:
        worst = float(np.max(d.max_ratio))
        verdict = "passes" if d.passed else "FAILS"
        lines += ["", f"largest ratio {worst:.2f}: {verdict} (every bin ≤ {LIMIT:g}× uniform)"]
    return "\n".join(lines)
