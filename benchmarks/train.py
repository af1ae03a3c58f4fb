"""Fine-tuning ``tl.nn.Llama``: next-token cross-entropy on random tokens, Adam, every parameter
trained, against the strongest plain JAX we write for the same step.

    python -m benchmarks.train [--quick] [--preset small|llama-3.2-1b] [--layers N] [--seq S]
                               [--iters I] [--budget BYTES] [--xla-split K] [--mixed]

tempo_lab: one program over (iteration ``i``, batch ``b``, layer ``n``, token ``t``) with
``tl.optim.parameters(w, dim=i)``, per-layer weights taken with ``tl.take(v, n)`` and
``tl.optim.Adam(lr).minimize(ce, p)``: a run trains ``I`` iterations. Plain JAX: one jitted
step (``jax.value_and_grad`` of the whole-sequence forward of ``benchmarks.llama``, Adam by
hand, parameters and moments donated), called ``I`` times. The layer loop is put outside the
token loop (the dims' order): a layer's work over all tokens is then batched (projections,
attention under a causal mask, MLP, their gradients); with the tokens outside (as decoding
needs) every op of a layer runs token by token. Both minimise the summed
cross-entropy from the same initial weights, so their losses agree to float rounding.

``--mixed``: mixed precision, bfloat16 weights rounded from float32 masters that Adam updates
with float32 moments (``parameters(..., dtype="bfloat16", master_dtype="float32")``; in JAX
the masters cast inside the jitted step and the bfloat16 gradients widened). The losses then
agree to bfloat16 rounding (``MIXED_LOSS_RTOL``).

Each system runs in a process of its own (its peak RSS is its own). Reported per system: time
per iteration (median over runs), compile (tempo_lab: ``ctx.compile`` plus XLA's compile,
made ahead of the first run with the persistent compilation cache off; JAX: lower + compile),
the first run's time beyond a later run's (``first_run_extra_s``: a new process's stores
first written, which the kernel maps as they are touched), peak RSS, and the losses; the
ratios tempo_lab / JAX; to ``benchmarks/results/train.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
PRESETS = {
    "small": {"vocab": 4096, "embed": 256, "layers": 2, "heads": 4, "kv_heads": 2,
              "hidden": 512},
    "llama-3.2-1b": {"vocab": 128256, "embed": 2048, "layers": 16, "heads": 32, "kv_heads": 8,
                     "hidden": 8192},
}
MARK = "TRAIN_RESULT "
LR = 1e-4
LOSS_RTOL = 1e-4
MIXED_LOSS_RTOL = 1e-2


def model_of(args):
    import tempo_lab as tl

    p = dict(PRESETS[args.preset])
    if args.layers:
        p["layers"] = args.layers
    return tl.nn.Llama(p["vocab"], p["embed"], p["layers"], p["heads"], p["kv_heads"],
                       p["hidden"])


def tokens(args, vocab: int) -> np.ndarray:
    """(iterations, batch, seq + 1) ids: inputs ``[..., :-1]``, targets ``[..., 1:]``."""
    rng = np.random.default_rng(1)
    return rng.integers(0, vocab, (args.iters, args.batch, args.seq + 1)).astype(np.int32)


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_tempo_lab(args) -> dict:
    import tempo_lab as tl

    tl.config.progress = False
    model = model_of(args)
    ids = tokens(args, model.vocab)
    ctx = tl.Context(dims=("i", "b", "n", "t"))  # layers outside tokens: see the docstring
    i, b, n, t = ctx.dims
    with ctx:
        p = tl.optim.parameters(model.init(seed=0), dim=i,
                                **({"dtype": "bfloat16", "master_dtype": "float32"}
                                   if args.mixed else {}))
        params = {k: tl.take(v, n) if k.startswith("layers.") else v for k, v in p.items()}
        logits = model(params, tl.from_array(ids[..., :-1], domain=(i, b, t)), t, n)
        top = logits.max()
        ce = tl.log(tl.exp(logits - top).sum()) + top - tl.take(
            logits, tl.from_array(ids[..., 1:], domain=(i, b, t)))
        tl.optim.Adam(lr=LR).minimize(ce, p)
    bounds = dict(zip(ctx.bounds, (args.iters, args.batch, model.layers, args.seq)))
    config = tl.CompileConfig(device_memory_budget=args.budget or None,
                              xla_split=args.xla_split or tl.CompileConfig().xla_split)
    t0 = time.perf_counter()
    prog = ctx.compile(bounds=bounds, outputs={"ce": ce}, config=config)
    xla = hasattr(prog.executable, "memory_analysis")
    if xla:  # compiles the XLA program ahead of the first run (and puts the inputs on the
        # device, the initial weights included, which plain JAX's compile does not count)
        prog.executable.memory_analysis()
    t1 = time.perf_counter()
    first = prog.run()
    t2 = time.perf_counter()
    times = []
    for _ in range(args.runs):
        s = time.perf_counter()
        prog.run()
        times.append((time.perf_counter() - s) / args.iters)
    run = statistics.median(times) * args.iters
    losses = np.asarray(first["ce"]).reshape(args.iters, -1).sum(axis=1)
    # without XLA's compile apart, the first run's extra time is counted as compile
    compile_s = (t1 - t0) if xla else (t2 - t0) - run
    return {"s_per_iter": statistics.median(times), "compile_s": compile_s,
            "first_run_extra_s": (t2 - t1) - run if xla else None, "peak_rss": _peak_rss(),
            "plan_peak": int(prog.memory.peak_bytes), "losses": losses.tolist()}


def run_jax(args, remat: bool = False) -> dict:
    """Plain JAX: ``jax.value_and_grad`` of the whole-sequence forward, hand-written Adam, one
    jitted step with the parameters and moments donated; ``remat``: each layer under
    ``jax.checkpoint`` (``jax_checkpoint``)."""
    import jax
    import jax.numpy as jnp

    from benchmarks import llama

    model = model_of(args)
    ids = tokens(args, model.vocab)
    params = {k: jnp.asarray(v) for k, v in model.init(seed=0).items()}
    b1, b2, eps = 0.9, 0.999, 1e-8

    def loss_fn(params, batch):
        logits = llama.forward(params, batch[:, :-1], model, remat)
        lse = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, batch[:, 1:, None], axis=-1)[..., 0]
        return (lse - picked).sum()

    def step(params, m, v, batch, k):
        if args.mixed:
            low = jax.tree.map(lambda a: a.astype(jnp.bfloat16), params)
            loss, g = jax.value_and_grad(loss_fn)(low, batch)
            g = jax.tree.map(lambda a: a.astype(jnp.float32), g)
        else:
            loss, g = jax.value_and_grad(loss_fn)(params, batch)
        m = jax.tree.map(lambda a, b: b1 * a + (1 - b1) * b, m, g)
        v = jax.tree.map(lambda a, b: b2 * a + (1 - b2) * b * b, v, g)
        upd = lambda p, a, b: p - LR * (a / (1 - b1 ** k)) / (jnp.sqrt(b / (1 - b2 ** k)) + eps)
        return jax.tree.map(upd, params, m, v), m, v, loss

    zeros = lambda: jax.tree.map(jnp.zeros_like, params)
    t0 = time.perf_counter()
    jstep = jax.jit(step, donate_argnums=(0, 1, 2)).lower(
        params, zeros(), zeros(), ids[0], 1.0).compile()
    compile_s = time.perf_counter() - t0

    def train():
        p, m, v = jax.tree.map(jnp.copy, params), zeros(), zeros()
        jax.block_until_ready((p, m, v))
        s, losses = time.perf_counter(), []
        for k in range(args.iters):
            p, m, v, loss = jstep(p, m, v, ids[k], float(k + 1))
            losses.append(loss)
        jax.block_until_ready(p)
        return (time.perf_counter() - s) / args.iters, [float(x) for x in losses]

    first, losses = train()
    times = [train()[0] for _ in range(args.runs)]
    return {"s_per_iter": statistics.median(times), "compile_s": compile_s,
            "first_run_extra_s": (first - statistics.median(times)) * args.iters,
            "peak_rss": _peak_rss(), "losses": losses}


SYSTEMS = {"tempo_lab": run_tempo_lab, "jax": run_jax,
           "jax_checkpoint": lambda args: run_jax(args, remat=True)}


def _child(system: str, args) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.train", "--system", system, "--preset", args.preset,
           "--seq", str(args.seq), "--iters", str(args.iters), "--batch", str(args.batch),
           "--runs", str(args.runs)]
    if args.layers:
        cmd += ["--layers", str(args.layers)]
    if args.budget:
        cmd += ["--budget", str(args.budget)]
    if args.xla_split:
        cmd += ["--xla-split", str(args.xla_split)]
    if args.mixed:
        cmd += ["--mixed"]
    # compiled cold, as plain JAX's step is: a program the persistent compilation cache
    # holds from an earlier run would not be compiled at all
    env = {**os.environ, "TEMPO_LAB_COMPILATION_CACHE": ""}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    for line in out.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    return {"error": (out.stderr or out.stdout).strip().splitlines()[-1:]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.train")
    ap.add_argument("--quick", action="store_true", help="small widths, 32 tokens, 1 run")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="small")
    ap.add_argument("--layers", type=int, default=0, help="layers (0: the preset's)")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--budget", type=int, default=0, help="device_memory_budget in bytes")
    ap.add_argument("--xla-split", type=int, default=0,
                    help="CompileConfig.xla_split (0: its default)")
    ap.add_argument("--mixed", action="store_true",
                    help="bfloat16 weights, float32 master weights and moments")
    ap.add_argument("--out", type=Path, default=RESULTS / "train.json")
    ap.add_argument("--system", choices=sorted(SYSTEMS), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.preset, args.seq, args.runs = "small", 32, 1
    if args.system:
        print(MARK + json.dumps(SYSTEMS[args.system](args)), flush=True)
        return 0
    res = {s: _child(s, args) for s in SYSTEMS}
    out = {"preset": args.preset, "layers": args.layers or PRESETS[args.preset]["layers"],
           "seq": args.seq, "batch": args.batch, "iters": args.iters, "budget": args.budget,
           "xla_split": args.xla_split, "mixed": args.mixed,
           **res}
    ok = all("error" not in r for r in res.values())
    if ok:
        tl_, jx, ck = res["tempo_lab"], res["jax"], res["jax_checkpoint"]
        out["time_ratio"] = tl_["s_per_iter"] / jx["s_per_iter"]
        out["rss_ratio"] = tl_["peak_rss"] / jx["peak_rss"]
        out["compile_ratio"] = tl_["compile_s"] / jx["compile_s"]
        out["time_ratio_checkpoint"] = tl_["s_per_iter"] / ck["s_per_iter"]
        out["rss_ratio_checkpoint"] = tl_["peak_rss"] / ck["peak_rss"]
        rtol = MIXED_LOSS_RTOL if args.mixed else LOSS_RTOL
        out["losses_equal"] = all(bool(np.allclose(tl_["losses"], r["losses"], rtol=rtol))
                                  for r in (jx, ck))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    for s, r in res.items():
        if "error" in r:
            print(f"{s:10s} error: {r['error']}")
        else:
            first = ("" if r["first_run_extra_s"] is None
                     else f"  first run +{r['first_run_extra_s']:5.2f} s")
            print(f"{s:10s} {r['s_per_iter'] * 1e3:9.1f} ms/iter  compile {r['compile_s']:6.2f} s"
                  f"{first}  peak RSS {r['peak_rss'] / 2**30:6.2f} GiB  losses {r['losses']}")
    if ok:
        print(f"tempo_lab / jax: time {out['time_ratio']:.2f}x, peak RSS {out['rss_ratio']:.2f}x,"
              f" compile {out['compile_ratio']:.2f}x; / jax_checkpoint: time "
              f"{out['time_ratio_checkpoint']:.2f}x, peak RSS {out['rss_ratio_checkpoint']:.2f}x;"
              f" losses equal: {out['losses_equal']}")
    return 0 if ok and out["losses_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
