"""GPU-side synthetic workloads in the DeepGEMM/SGLang layout (for tests and ``dosa bench``
when ``dosa_ref.workloads`` is not given a regime it knows).

Regimes (all causal prefill chunks: query t of the chunk sees keys [0, N − Qn + t + 1)):
  gaussian    i.i.d. N(0, 1) queries and keys, weights N(0, 1) (hard: light tails).
  structured  keys share a few "topic" directions with heavy-tailed loadings and queries
              mostly point at one topic; ~75% of head weights positive (DSA-like).
  ties        structured, but keys repeat a small pool of 64 distinct vectors.
  equal       every key identical (every visible score equal).
  adversarial structured keys plus a wide-dynamic-range coordinate pattern (one huge
              coordinate, many tiny ones) that stresses the MMA accumulator.

Any other name is looked up in ``dosa_ref.workloads.regime_names()`` (the calibrated regime
and its variants): generated on the host by ``dosa_ref.workloads.make_workload`` (float32,
causal ranges), uploaded, and quantized on the GPU like the regimes above; "trained" (a
real encoder over real text, dosa_ref/trained.py) is generated on the GPU.

Files: ``load_gpu_workload(path)`` reads a .npz / .safetensors workload written by
``dosa_ref.workloads.save_workload`` (float tensors q, w, k and ranges ks, ke; validated
there) and quantizes it the same way; ``inputs_shape(path)`` reads (H, Qn, N) from the
file's header without loading the tensors (``dosa bench --inputs``).
"""

from __future__ import annotations

import numpy as np

from ._build import cupy_or_raise
from .prepare import D, quantize_keys

__all__ = ["REGIMES", "inputs_shape", "load_gpu_workload", "make_gpu_workload", "quantize_queries"]

REGIMES = ("gaussian", "structured", "ties", "equal", "adversarial")


def quantize_queries(qf, w):
    """e4m3 queries per (token, head) with the scale folded into w (= dosa_ref.fp8)."""
    cp = cupy_or_raise()
    Qn, H, _ = qf.shape
    payload, scale, _ = quantize_keys(qf.reshape(Qn * H, D))
    wq = (w.astype(cp.float32) * scale.reshape(Qn, H)).astype(cp.float32)
    return payload.reshape(Qn, H, D), wq


def make_gpu_workload(regime, Qn, N, H, seed=0, causal=True, scale_fmt="amax"):
    """Returns dict(q, w, k_payload, k_scale, ks, ke, kf, qf, wf) on the device."""
    cp = cupy_or_raise()
    if regime not in REGIMES:
        return _from_reference(regime, Qn, N, H, seed, causal, scale_fmt)
    rs = cp.random.RandomState(seed)
    T = 8
    topics = rs.standard_normal((T, D), dtype=cp.float32)
    topics /= cp.linalg.norm(topics, axis=1, keepdims=True)
    if regime == "gaussian":
        kf = rs.standard_normal((N, D), dtype=cp.float32)
        qf = rs.standard_normal((Qn, H, D), dtype=cp.float32)
        wf = rs.standard_normal((Qn, H), dtype=cp.float32)
    else:
        nk = N if regime in ("structured", "adversarial") else 64
        z = rs.standard_normal((nk, D), dtype=cp.float32)
        load = rs.exponential(1.0, (nk, T)).astype(cp.float32) ** 2
        load *= (rs.random_sample((nk, T)) < 0.3).astype(cp.float32)
        kf = z + 1.5 * load @ topics
        if regime == "adversarial":
            big = rs.randint(0, D, nk)
            kf *= 1e-3
            kf[cp.arange(nk), big] = 30.0 * (1 + rs.random_sample(nk, dtype=cp.float32))
        if regime == "ties":
            kf = kf[rs.randint(0, nk, N)]
        if regime == "equal":
            kf = cp.broadcast_to(kf[:1], (N, D)).copy()
        tq = rs.randint(0, T, Qn)
        qf = 0.6 * rs.standard_normal((Qn, H, D), dtype=cp.float32)
        qf += (rs.random_sample((Qn, H, 1), dtype=cp.float32) + 0.2) * topics[tq][:, None, :] * 3
        sign = cp.where(rs.random_sample((Qn, H)) < 0.75, 1.0, -1.0).astype(cp.float32)
        wf = sign * (0.2 + rs.random_sample((Qn, H), dtype=cp.float32))
    kp, ksc, _ = quantize_keys(kf, scale_fmt)
    q, w = quantize_queries(qf, wf)
    if causal:
        ke = cp.arange(N - Qn + 1, N + 1, dtype=cp.int32).clip(0, N)
        ks = cp.zeros(Qn, dtype=cp.int32)
    else:
        ks = cp.zeros(Qn, dtype=cp.int32)
        ke = cp.full(Qn, N, dtype=cp.int32)
    return dict(q=q, w=w, k_payload=kp, k_scale=ksc, ks=ks, ke=ke, kf=kf, qf=qf, wf=wf)


def _from_reference(regime, Qn, N, H, seed, causal, scale_fmt):
    """A ``dosa_ref.workloads`` regime, quantized on the GPU (docs/method.md §8); the
    trained regime's encoder and indexer run on the GPU (docs/workloads.md §1)."""
    cp = cupy_or_raise()
    from dosa_ref.workloads import TRAINED, Workload, make_workload, regime_names

    if regime == TRAINED:
        from dosa_ref.trained import make_trained_workload

        d = make_trained_workload(Qn, N, H, seed, xp=cp)  # checks the counts
        wl = Workload(d["q"], d["w"], d["k"], d["ks"], d["ke"], name=TRAINED, params=d["params"])
        return _upload(wl, causal, scale_fmt)
    if regime not in regime_names():
        raise ValueError(
            f"regime: expected one of {REGIMES + tuple(regime_names())}, got {regime!r}"
        )
    return _upload(make_workload(regime, Qn, N, H=H, seed=seed), causal, scale_fmt)


def load_gpu_workload(path, scale_fmt="amax"):
    """A workload file (``dosa_ref.workloads.save_workload`` format: float q [Qn, H, 128],
    w [Qn, H], k [N, 128], int ks / ke [Qn]), quantized on the GPU like the generated
    regimes; the same dict as ``make_gpu_workload``.  Bad files raise ValueError."""
    from dosa_ref.workloads import load_workload

    wl = load_workload(path)
    if wl.q.shape[2] != D:
        raise ValueError(f"q: expected head dimension {D}, got {wl.q.shape[2]} in {path!s}")
    return _upload(wl, True, scale_fmt)


def inputs_shape(path) -> tuple[int, int, int]:
    """(H, Qn, N) of a workload file from its header (no tensor is loaded)."""
    import zipfile
    from pathlib import Path

    path = Path(path)
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="np") as f:
                qs, ks = f.get_slice("q").get_shape(), f.get_slice("k").get_shape()
        elif path.suffix == ".npz":
            with zipfile.ZipFile(path) as z:
                shp = {}
                for name in ("q", "k"):
                    with z.open(name + ".npy") as fh:
                        fmt = np.lib.format
                        ver = fmt.read_magic(fh)
                        read = fmt.read_array_header_1_0 if ver == (1, 0) else None
                        read = fmt.read_array_header_2_0 if ver == (2, 0) else read
                        if read is None:
                            raise ValueError(f"inputs: .npy format {ver} of {name} not read")
                        shp[name] = read(fh)[0]
            qs, ks = shp["q"], shp["k"]
        else:
            raise ValueError(f"inputs: expected .npz or .safetensors files, got {str(path)!r}")
    except ValueError:
        raise
    except Exception as e:  # missing file or tensor, not a zip / safetensors file, ...
        raise ValueError(f"inputs: cannot read the q / k shapes of {str(path)!r}: {e}") from e
    if len(qs) != 3 or len(ks) != 2:
        raise ValueError(f"inputs: q must be [Qn, H, D] and k [N, D] in {str(path)!r}")
    return int(qs[1]), int(qs[0]), int(ks[0])


def _upload(wl, causal, scale_fmt):
    """A host ``dosa_ref.workloads.Workload`` on the GPU, quantized (docs/method.md §8)."""
    cp = cupy_or_raise()
    Qn, _, _, N = wl.shape
    kf = cp.asarray(wl.k, dtype=cp.float32)
    qf = cp.asarray(wl.q, dtype=cp.float32)
    wf = cp.asarray(wl.w, dtype=cp.float32)
    kp, ksc, _ = quantize_keys(kf, scale_fmt)
    q, w = quantize_queries(qf, wf)
    if causal:
        ks = cp.asarray(wl.ks, dtype=cp.int32)
        ke = cp.asarray(wl.ke, dtype=cp.int32)
    else:
        ks = cp.zeros(Qn, dtype=cp.int32)
        ke = cp.full(Qn, N, dtype=cp.int32)
    return dict(q=q, w=w, k_payload=kp, k_scale=ksc, ks=ks, ke=ke, kf=kf, qf=qf, wf=wf)
