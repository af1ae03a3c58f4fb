"""The README's demo: trace a small decoder (layers as a dim, multi-head causal attention over
``0:t+1``), print its SDG and schedule, run it on the JAX executor and on the reference
interpreter, check both against a plain NumPy decoder and write the views.

    python -m tempo_lab.demo [--out out/demo] [--layers 2] [--steps 8]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

import tempo_lab as tl
from tempo_lab.svg import dot_installed, svg_of


def decoder(ctx: tl.Context, weights: dict, tokens: np.ndarray, heads: int,
            window: int | None = None):
    """Residual pre-norm transformer blocks; layer n reads layer n-1's output at the same t.

    ``ctx`` has dims ``(n, t)``, or ``(b, n, t)`` with tokens over ``(b, t)`` for a batch.
    Attention reads keys and values over ``0:t+1``, or the last ``window`` steps. Returns the
    placeholder ``h_out`` (every layer's output).
    """
    *lead, n, t = ctx.dims
    d = tokens.shape[-1]
    dh = d // heads
    start = 0 if window is None else tl.max(0, t - window + 1)
    with ctx:
        emb = tl.from_array(tokens, domain=(*lead, t), name="emb")
        w = {k: tl.from_array(v, domain=(n,), name=k) for k, v in weights.items()}
        h_in = tl.placeholder((d,), "float32", domain=ctx.dims, name="h_in")
        h_out = tl.placeholder((d,), "float32", domain=ctx.dims, name="h_out")
        h_in[(*lead, 0, t)] = emb
        h_in[(*lead, n, t)] = h_out[(*lead, n - 1, t)]

        x = rms_norm(h_in)
        q = (x @ w["wq"]).reshape(heads, dh)
        k = (x @ w["wk"]).reshape(heads, dh)
        v = (x @ w["wv"]).reshape(heads, dh)
        keys = k[(*lead, n, slice(start, t + 1))].transpose(1, 0, 2)   # (heads, steps, dh)
        values = v[(*lead, n, slice(start, t + 1))].transpose(1, 0, 2)
        scores = (keys @ q.expand_dims(2)).squeeze(2) / float(np.sqrt(dh))   # (heads, steps)
        att = (tl.softmax(scores, axis=-1).expand_dims(1) @ values).squeeze(1)  # (heads, dh)
        h_mid = h_in + att.reshape(d) @ w["wo"]
        h_out[(*lead, n, t)] = h_mid + tl.relu(rms_norm(h_mid) @ w["w1"]) @ w["w2"]
    return h_out


def rms_norm(x):
    return x / tl.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6)


def numpy_decoder(weights: dict, tokens: np.ndarray, heads: int,
                  window: int | None = None) -> np.ndarray:
    """The same decoder directly in NumPy over whole arrays, as the check; tokens are
    ``(steps, d)`` or ``(batch, steps, d)``."""
    if tokens.ndim == 3:
        return np.stack([numpy_decoder(weights, x, heads, window) for x in tokens])
    steps, d = tokens.shape
    dh = d // heads

    def norm(x):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)

    i = np.arange(steps)
    mask = i[None, :] <= i[:, None]
    if window is not None:
        mask &= i[None, :] > i[:, None] - window
    h = tokens.astype(np.float32)
    for layer in range(weights["wq"].shape[0]):
        wt = {k: v[layer] for k, v in weights.items()}
        x = norm(h)
        q, k, v = ((x @ wt[m]).reshape(steps, heads, dh).transpose(1, 0, 2)
                   for m in ("wq", "wk", "wv"))
        s = np.where(mask, q @ k.transpose(0, 2, 1) / np.sqrt(dh), -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        att = (p @ v).transpose(1, 0, 2).reshape(steps, d)
        h_mid = h + att @ wt["wo"]
        h = h_mid + np.maximum(norm(h_mid) @ wt["w1"], 0) @ wt["w2"]
    return h.astype(np.float32)


def make_weights(layers: int, d: int, hidden: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    shapes = {"wq": (d, d), "wk": (d, d), "wv": (d, d), "wo": (d, d), "w1": (d, hidden),
              "w2": (hidden, d)}
    return {k: (rng.standard_normal((layers,) + s) / np.sqrt(s[0])).astype(np.float32)
            for k, s in shapes.items()}


def write_views(prog, out_dir: str) -> list[str]:
    """The SDG as DOT, JSON, HTML and (when graphviz's ``dot`` is installed) SVG."""
    os.makedirs(out_dir, exist_ok=True)
    written = []

    def put(name, text):
        path = os.path.join(out_dir, name)
        with open(path, "w") as f:
            f.write(text)
        written.append(path)

    dot = prog.sdg.to_dot()
    put("sdg.dot", dot)
    put("sdg.json", json.dumps(prog.sdg.to_dict(), indent=1))
    put("trace.txt", prog.trace.pretty() + "\n")
    put("schedule.txt", prog.schedule.pretty() + "\n")
    put("memory.txt", prog.memory.pretty() + "\n")
    svg = svg_of(dot) or ""
    if svg:
        put("sdg.svg", svg)
    else:
        print("note: graphviz 'dot' " + ("failed or took too long" if dot_installed() else
                                         "not found") + "; writing HTML without the graph picture")
    put("sdg.html", f"<!doctype html><meta charset='utf-8'><title>tempo_lab demo SDG</title>"
                    f"{svg}{prog.sdg._repr_html_()}")
    return written


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join("out", "demo"))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--embed", type=int, default=16)
    ap.add_argument("--heads", type=int, default=2)
    args = ap.parse_args(argv)

    weights = make_weights(args.layers, args.embed, 2 * args.embed)
    tokens = np.random.default_rng(1).standard_normal((args.steps, args.embed)).astype(np.float32)
    ctx = tl.Context(dims=("n", "t"))
    n, t = ctx.dims
    N, T = ctx.bounds
    h_out = decoder(ctx, weights, tokens, args.heads)
    with ctx:
        y = h_out[N - 1, t]          # the last layer's output at every step

    t0 = time.perf_counter()
    prog = ctx.compile(bounds={N: args.layers, T: args.steps}, outputs={"y": y})
    compile_s = time.perf_counter() - t0
    print(prog.sdg.pretty().split("\nops:")[0])
    print(f"compiled in {compile_s:.2f} s: {prog!r}")

    print(prog.schedule.code())
    print(prog.memory)
    want = numpy_decoder(weights, tokens, args.heads)
    ok = True
    for p in (prog, ctx.compile(bounds={N: args.layers, T: args.steps}, outputs={"y": y},
                                config=tl.CompileConfig(executor="reference"))):
        t0 = time.perf_counter()
        run = p.run()
        run_s = time.perf_counter() - t0
        err = float(np.max(np.abs(run["y"] - want)))
        extra = (f", store peak {run.profile.peak_bytes} B (predicted "
                 f"{p.memory.peak_bytes} B)" if run.profile else "")
        print(f"{p.config.executor}: ran in {run_s:.2f} s; output {run['y'].shape}, "
              f"max |tempo_lab - numpy| = {err:.2e}{extra}")
        ok &= bool(np.allclose(run["y"], want, rtol=1e-4, atol=1e-4))
    for path in write_views(prog, args.out):
        print(f"wrote {path}")
    if not ok:
        print("MISMATCH against the NumPy decoder", file=sys.stderr)
        return 1
    print("OK: both executors match the NumPy decoder")
    return 0


if __name__ == "__main__":
    sys.exit(main())
