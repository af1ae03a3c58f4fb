"""Soak benchmark: many distinct programs compiled and run in one process, as a notebook session
does, with the resident set (RSS) read after each; does memory come back?

    python -m benchmarks.soak [--quick] [--small 200] [--ppo 30] [--out benchmarks/results/soak.json]

Each system runs in a subprocess of its own (a fresh process, so the numbers are its own):

- ``tempo_lab``: ``--small`` distinct small programs (a recurrence ``h[t] = f(h[t-1] W + x[t])``
  with a causal or windowed sum, widths 3..31 and lengths 5..11, so each is a new compilation),
  each compiled, run on the default executor, checked against NumPy and dropped; then ``--ppo``
  PPO trainings from ``tl.rl`` (CartPole, hidden widths 16.. so that each is new).
- ``jax``: the same small programs written in plain JAX (``jax.jit`` of a ``lax.scan``), the
  best a JAX user would write, each a new jitted function dropped after its run.

Records: ``{"system", "kind": "small" | "ppo", "rss_bytes": [RSS after each program],
"rss_start_bytes" (before the first), "growth_bytes" (after the last minus after the first),
"seconds": [each program's compile + run]}``. The target (small programs): growth over 200
programs at most 100 MB.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time

import numpy as np

from benchmarks.decode import environment, write_results

DEFAULT_OUT = os.path.join("benchmarks", "results", "soak.json")
QUICK_OUT = os.path.join("benchmarks", "results", "soak_quick.json")
TARGET_GROWTH_BYTES = 100 * 2**20
FUNCTIONS = ("tanh", "sin", "relu")


def rss_bytes() -> int:
    """The process's resident set now (Linux VmRSS), not its peak: memory given back shows."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmRSS in /proc/self/status")


def shape(i: int) -> tuple[int, int, str, bool]:
    """Program ``i``'s width, length, function and whether its sum is windowed."""
    return 3 + i % 29, 5 + (i // 29) % 7, FUNCTIONS[i % 3], i % 2 == 1


def data(i: int):
    d, n, _, _ = shape(i)
    rng = np.random.default_rng(i)
    return (rng.standard_normal((n, d)).astype(np.float32),
            (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32))


def numpy_small(i: int) -> np.ndarray:
    d, n, fn, window = shape(i)
    xs, w = data(i)
    f = {"tanh": np.tanh, "sin": np.sin, "relu": lambda v: np.maximum(v, 0)}[fn]
    h, hs = np.zeros(d, np.float32), []
    for t in range(n):
        h = f(h @ w + xs[t])
        hs.append(h)
    hs = np.stack(hs)
    return np.stack([hs[max(0, t - 2) if window else 0:t + 1].sum(0) for t in range(n)])


def tempo_lab_small(i: int) -> np.ndarray:
    import tempo_lab as tl

    d, n, fn, window = shape(i)
    xs, w0 = data(i)
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.from_array(xs, domain=(t,))
        w = tl.constant(w0)
        f = getattr(tl, fn)
        h = tl.placeholder((d,), "float32", domain=(t,))
        h[0] = f(x[0])
        h[t] = f(h[t - 1] @ w + x[t])
        y = h[tl.max(0, t - 2) if window else 0:t + 1].sum(axis=0)
    return np.asarray(ctx.compile(bounds={T: n}, outputs={"y": y}).run()["y"])


def jax_small(i: int) -> np.ndarray:
    import jax
    import jax.numpy as jnp

    d, n, fn, window = shape(i)
    xs, w = data(i)
    f = {"tanh": jnp.tanh, "sin": jnp.sin, "relu": jax.nn.relu}[fn]

    @jax.jit
    def run(xs, w):
        def step(h, x):
            h = f(h @ w + x)
            return h, h
        _, hs = jax.lax.scan(step, jnp.zeros(d, jnp.float32), xs)
        c = jnp.cumsum(hs, axis=0)
        if not window:
            return c
        return c - jnp.concatenate([jnp.zeros((3, d), c.dtype), c[:-3]])

    return np.asarray(run(xs, w))


def tempo_lab_ppo(i: int) -> None:
    import tempo_lab as tl

    cfg = tl.rl.PPOConfig(hidden=16 + i, update_epochs=2, num_minibatches=2, seed=i)
    curves = tl.rl.train(tl.rl.ppo, tl.rl.CartPole(), cfg, iterations=2, num_envs=4, steps=64)
    if not np.isfinite(curves["loss"]).all():
        raise RuntimeError(f"PPO program {i}: a loss is not finite")


def soak(system: str, kind: str, count: int) -> dict:
    """Compile and run ``count`` programs of ``kind`` in this process; RSS after each."""
    if system == "tempo_lab":
        import tempo_lab as tl

        tl.config.progress = False
    start, after, seconds = rss_bytes(), [], []
    for i in range(count):
        t0 = time.perf_counter()
        if kind == "ppo":
            tempo_lab_ppo(i)
        else:
            got = (tempo_lab_small if system == "tempo_lab" else jax_small)(i)
            np.testing.assert_allclose(got, numpy_small(i), rtol=1e-4, atol=1e-4,
                                       err_msg=f"{system} program {i}")
        seconds.append(round(time.perf_counter() - t0, 4))
        gc.collect()
        after.append(rss_bytes())
    return {"system": system, "kind": kind, "programs": count, "rss_start_bytes": start,
            "rss_bytes": after, "growth_bytes": after[-1] - after[0], "seconds": seconds}


def in_subprocess(system: str, kind: str, count: int) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.soak", "--child", system, kind, str(count)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RECORD ")), None)
    if proc.returncode or not line:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(line[len("RECORD "):])


def table(records: list[dict]) -> str:
    rows = [f"{'system':10} {'kind':6} {'programs':>8} {'RSS first':>10} {'RSS last':>10} "
            f"{'growth':>9} {'per prog':>9} {'s/prog':>7}"]
    mb = 2**20
    for r in records:
        per = r["growth_bytes"] / max(1, r["programs"] - 1) / mb
        rows.append(f"{r['system']:10} {r['kind']:6} {r['programs']:8d} "
                    f"{r['rss_bytes'][0] / mb:8.0f}MB {r['rss_bytes'][-1] / mb:8.0f}MB "
                    f"{r['growth_bytes'] / mb:7.1f}MB {per:7.2f}MB "
                    f"{float(np.median(r['seconds'])):7.2f}")
    return "\n".join(rows)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        system, kind, count = argv[1], argv[2], int(argv[3])
        print("RECORD " + json.dumps(soak(system, kind, count)))
        return 0
    ap = argparse.ArgumentParser(prog="python -m benchmarks.soak",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="40 small programs, 3 PPO ones")
    ap.add_argument("--small", type=int, default=200)
    ap.add_argument("--ppo", type=int, default=30)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if args.quick:
        args.small, args.ppo = min(args.small, 40), min(args.ppo, 3)
    env = environment()
    records = []
    for system, kind, count in (("tempo_lab", "small", args.small), ("jax", "small", args.small),
                                ("tempo_lab", "ppo", args.ppo)):
        if count > 0:
            records.append({**in_subprocess(system, kind, count), **env})
            print(table(records[-1:]).splitlines()[-1], flush=True)
    print(table(records))
    small = next((r for r in records if r["system"] == "tempo_lab" and r["kind"] == "small"),
                 None)
    if small:
        met = "met" if small["growth_bytes"] <= TARGET_GROWTH_BYTES else "MISSED"
        print(f"tempo_lab growth over {small['programs']} small programs: "
              f"{small['growth_bytes'] / 2**20:.0f} MB (target <= 100 MB at 200: {met})")
    write_results(records, args.out or (QUICK_OUT if args.quick else DEFAULT_OUT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
