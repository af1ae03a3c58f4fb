"""Compile time by stage against the number of layers (the paper's compile-time figure).

    python -m benchmarks.compile [--layers 2 4 8 16 32 64] [--seq-len 32] [--out FILE] [--quick]
    python -m benchmarks.compile --scale [--quick]

For each layer count, in a fresh subprocess (JAX and tempo_lab cache compiled kernels per
process): the decoder of ``benchmarks.decode`` (batch, layers and steps as dims) is compiled by
tempo_lab, and each stage's seconds are recorded from ``prog.compile_times`` (build, validate,
passes, schedule, memory) plus the kernels JAX compiles during the first run (its compile
events); the same decoder as one ``jax.jit`` of a ``lax.scan`` (``jax_scan``) is compiled for
comparison. Layers are a dim in tempo_lab, so its program does not grow with them; the JAX
program unrolls them.

The training example (``tempo_lab.examples.DelayLine``: an RNN trained with BPTT and Adam as
one program over iterations and steps) is measured the same way (``--training``): tempo_lab's
stages, the kernels its first run compiles, and the run, against one ``jax.jit`` of a
``lax.scan`` over iterations with ``jax.grad`` inside (``jax_scan``), on the same inputs; the
two loss curves are checked equal first.

The scaling study (``--scale``, ``--scale --quick`` for a subset) compiles, each in a fresh
subprocess: the decoder with its layers *unrolled* as separate ops (2-64 layers, how most models
are written; ``tempo_lab.examples.unrolled_decoder``), the same with layers as a dim
(``layered``), a chain of 1 000 / 10 000 ops with recurrences (``tempo_lab.examples.op_chain``)
and PPO (``tl.rl.ppo``, 32 x 250). Each is checked against, and its compile time compared with,
``jax.jit(...).lower(...).compile()`` of its plain-JAX twin in the same process. ``window``
compiles a windowed decoder at T = 10^3 ... 10^9 (compile time and predicted peak, no run).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.decode import Config, loadavg

RESULT = "COMPILE_RESULT "
DEFAULT_OUT = os.path.join("benchmarks", "results", "compile.json")


def one(layers: int, seq_len: int) -> dict:
    """Measure one layer count in this process."""
    import numpy as np

    import tempo_lab as tl
    from benchmarks.decode import (
        _CompileClock,
        bench_jax_scan,
        check_output,
        make_inputs,
        numpy_reference,
        tempo_lab_decoder,
    )

    load = loadavg()
    cfg = Config(layers=layers, heads=4, embed=64, batch=2, seq_len=seq_len, attention="causal",
                 window=None)
    weights, tokens = make_inputs(cfg)
    ref = numpy_reference(weights, tokens, cfg.heads)
    clock = _CompileClock()
    ctx = tl.Context(dims=("b", "n", "t"))
    B, N, T = ctx.bounds
    y = tempo_lab_decoder(ctx, weights, tokens, cfg.heads)
    prog = ctx.compile(bounds={B: cfg.batch, N: layers, T: seq_len}, outputs={"y": y})
    clock.active = True
    run = prog.run()
    clock.active = False
    check_output("tempo_lab", cfg, run["y"], ref)
    stages = {**prog.compile_times, "kernels": clock.seconds}
    jax_rec = bench_jax_scan(cfg, weights, tokens, ref, warm_runs=1, progress=False)
    return {"layers": layers, "seq_len": seq_len, "sdg_ops": len(prog.sdg.ops),
            "loadavg_at_start": load,
            "tempo_lab_compile_s": sum(stages.values()), "tempo_lab_by_stage": stages,
            "jax_scan_compile_s": jax_rec["compile_s"],
            "max_abs_err": float(np.max(np.abs(run["y"] - ref)))}


def one_training(iters: int, steps: int) -> dict:
    """Measure the training example in this process."""
    import time

    import jax.numpy as jnp
    import numpy as np

    from benchmarks.decode import _CompileClock
    from tempo_lab.examples import DelayLine

    load = loadavg()
    model = DelayLine()
    clock = _CompileClock()
    ctx, loss, x = model.program()
    NI, NT = ctx.bounds
    prog = ctx.compile(bounds={NI: iters, NT: steps}, outputs={"loss": loss, "x": x})
    clock.active = True
    t0 = time.perf_counter()
    res = prog.run()
    first_run = time.perf_counter() - t0
    clock.active = False
    t0 = time.perf_counter()
    prog.run()
    warm_run = time.perf_counter() - t0
    xs = jnp.asarray(res["x"])
    train = model.jax_train()
    t0 = time.perf_counter()
    compiled = train.lower(xs).compile()
    jax_compile = time.perf_counter() - t0
    t0 = time.perf_counter()
    want = np.asarray(compiled(xs))
    jax_run = time.perf_counter() - t0
    err = float(np.max(np.abs(res["loss"] - want)))
    if not np.allclose(res["loss"], want, rtol=2e-3, atol=1e-5):
        raise RuntimeError(f"training: tempo_lab and jax_scan loss curves differ by {err}")
    stages = {**prog.compile_times, "kernels": clock.seconds}
    return {"program": "training", "iters": iters, "steps": steps, "sdg_ops": len(prog.sdg.ops),
            "loadavg_at_start": load, "executor": prog.executable.to_dict().get("executor"),
            "tempo_lab_compile_s": sum(stages.values()), "tempo_lab_by_stage": stages,
            "tempo_lab_run_s": warm_run, "tempo_lab_first_run_s": first_run,
            "jax_scan_compile_s": jax_compile, "jax_scan_run_s": jax_run,
            "max_abs_err": err}


def one_scale(program: str, size: int, seq_len: int, fuse: bool = True) -> dict:
    """``--scale``: compile time by stage of one program of the scaling study, in this process,
    against ``jax.jit`` of its plain-JAX twin (compile only: ``lower().compile()``).

    ``unrolled``: the decoder with ``size`` layers written out as separate ops; ``layered``:
    the same with layers as a dim; ``chain``: about ``size`` ops in a chain with recurrences
    (``tempo_lab.examples.op_chain``); ``ppo``: ``tl.rl.ppo`` at 32 environments x 250 steps
    against the CleanRL-style baseline of ``benchmarks.rl``."""
    import time

    import jax
    import numpy as np

    import tempo_lab as tl
    from benchmarks.decode import _CompileClock
    from tempo_lab.demo import make_weights, numpy_decoder
    from tempo_lab.examples import op_chain, unrolled_decoder

    tl.config.progress = False
    load = loadavg()
    cfg = tl.CompileConfig(fuse=fuse)
    if program == "ppo":
        return _one_ppo(load)
    if program == "window":
        return _one_window(size, load)
    weights = make_weights(size, 32, 64) if program in ("unrolled", "layered") else None
    tokens = np.random.default_rng(1).standard_normal((seq_len, 32)).astype(np.float32)
    data = np.random.default_rng(0).standard_normal((seq_len, 8)).astype(np.float32)
    t_trace = time.perf_counter()  # jax.jit's lower traces too, so tracing is counted here
    if program in ("unrolled", "layered"):
        if program == "unrolled":
            ctx = tl.Context(dims=("t",))
            (T,) = ctx.bounds
            y = unrolled_decoder(ctx, weights, tokens, 2)
            bounds = {T: seq_len}
        else:
            from tempo_lab.demo import decoder

            ctx = tl.Context(dims=("n", "t"))
            N, T = ctx.bounds
            h = decoder(ctx, weights, tokens, 2)
            with ctx:
                y = h[N - 1, ctx.dims[1]]
            bounds = {N: size, T: seq_len}
        twin, args = _jax_unrolled_decoder(weights, 2), (tokens,)
    elif program == "chain":
        ctx = tl.Context(dims=("t",))
        (T,) = ctx.bounds
        y, twin = op_chain(ctx, size, data)
        bounds, args = {T: seq_len}, (data,)
    else:
        raise ValueError(program)
    trace_s = time.perf_counter() - t_trace
    want = numpy_decoder(weights, tokens, 2) if weights is not None else None
    t0 = time.perf_counter()
    prog = ctx.compile(bounds=bounds, outputs={"y": y}, config=cfg)
    compile_s = time.perf_counter() - t0 + trace_s
    clock = _CompileClock()
    clock.active = True
    got = prog.run()["y"]
    clock.active = False
    t0 = time.perf_counter()
    jitted = jax.jit(twin).lower(*args).compile()
    jax_s = time.perf_counter() - t0
    ref = np.asarray(jitted(*args)) if want is None else want
    err = float(np.max(np.abs(got - ref)))
    if not np.allclose(got, ref, rtol=1e-3, atol=1e-3):
        raise RuntimeError(f"{program} {size}: tempo_lab and the JAX twin differ by {err}")
    stages = {"trace": trace_s, **prog.compile_times, "kernels": clock.seconds}
    return {"scale": program, "size": size, "seq_len": seq_len, "fuse": fuse,
            "traced_ops": len(prog.passes.initial.ops), "sdg_ops": len(prog.sdg.ops),
            "scheduler": prog.schedule.method.split(" ")[0], "loadavg_at_start": load,
            "tempo_lab_compile_s": compile_s, "tempo_lab_by_stage": stages,
            "tempo_lab_with_kernels_s": compile_s + clock.seconds,
            "jax_jit_compile_s": jax_s, "ratio": (compile_s + clock.seconds) / jax_s,
            "max_abs_err": err}


def _one_window(steps: int, load) -> dict:
    """The decoder (2 layers unrolled, attention over a window of 8) compiled at ``T = steps``
    with random tokens (no array over ``t``) and only the last step as output: compile time and
    predicted store peak, which should not depend on ``steps``. Not run (10^7 steps would take
    hours on CPU), so no JAX twin: compare the records of different ``steps``."""
    import time

    import tempo_lab as tl
    from tempo_lab.demo import make_weights
    from tempo_lab.examples import unrolled_decoder

    t0 = time.perf_counter()
    ctx = tl.Context(dims=("t",))
    (T,) = ctx.bounds
    with ctx:
        tokens = tl.random.normal((32,), domain=ctx.dims, seed=0)
    h = unrolled_decoder(ctx, make_weights(2, 32, 64), tokens, 2, window=8)
    with ctx:
        y = h[T - 1]
    prog = ctx.compile(bounds={T: steps}, outputs={"y": y})
    compile_s = time.perf_counter() - t0
    return {"scale": "window", "size": steps, "seq_len": steps, "fuse": True,
            "traced_ops": len(prog.passes.initial.ops), "sdg_ops": len(prog.sdg.ops),
            "scheduler": prog.schedule.method.split(" ")[0], "loadavg_at_start": load,
            "tempo_lab_compile_s": compile_s,
            "tempo_lab_by_stage": {"trace": 0.0, **prog.compile_times},
            "tempo_lab_with_kernels_s": compile_s, "jax_jit_compile_s": None, "ratio": None,
            "predicted_peak_bytes": prog.memory.peak_bytes,
            "simulated_steps": len(prog.memory.timeline), "max_abs_err": None}


def _jax_unrolled_decoder(weights: dict, heads: int):
    """The decoder in plain JAX: a ``lax.scan`` over steps with a KV cache, the layers a
    Python loop inside the step (so ``jax.jit`` sees every layer)."""
    import jax
    import jax.numpy as jnp

    layers = weights["wq"].shape[0]

    def norm(x):
        return x / jnp.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)

    def run(tokens):
        steps, d = tokens.shape
        dh = d // heads
        w = {k: jnp.asarray(v) for k, v in weights.items()}

        def step(cache, item):
            t, h = item
            new = []
            for layer in range(layers):
                kc, vc = cache[layer]
                x = norm(h)
                q, k, v = ((x @ w[m][layer]).reshape(heads, dh) for m in ("wq", "wk", "wv"))
                kc, vc = kc.at[t].set(k), vc.at[t].set(v)
                s = jnp.einsum("hd,shd->hs", q, kc) / jnp.sqrt(dh)
                s = jnp.where(jnp.arange(steps)[None] <= t, s, -jnp.inf)
                att = jnp.einsum("hs,shd->hd", jax.nn.softmax(s, axis=-1), vc).reshape(d)
                h_mid = h + att @ w["wo"][layer]
                h = h_mid + jax.nn.relu(norm(h_mid) @ w["w1"][layer]) @ w["w2"][layer]
                new.append((kc, vc))
            return new, h

        cache = [(jnp.zeros((steps, heads, dh)), jnp.zeros((steps, heads, dh)))
                 for _ in range(layers)]
        return jax.lax.scan(step, cache, (jnp.arange(steps), tokens))[1]

    return run


def _one_ppo(load) -> dict:
    """PPO (32 x 250, hidden 64, 2 iterations): tempo_lab's compile stages against the
    CleanRL-style baseline's ``lower().compile()`` of its two phases, both from
    ``benchmarks.rl`` (no warm runs: only compile is measured here)."""
    import time

    import numpy as np

    from benchmarks import rl

    cfg = rl.Config(num_envs=32, ep_len=250, hidden=64, iterations=2)
    t0 = time.perf_counter()
    prog = rl.compile_tempo_lab(cfg)
    compile_s = time.perf_counter() - t0
    first = prog.run()
    base = rl.bench_cleanrl(cfg, 0, False)
    err = float(abs(np.asarray(first["return"]) - np.asarray(base["returns"])).max())
    stages = {**prog.compile_times, "kernels": first.seconds}
    return {"scale": "ppo", "size": cfg.num_envs * cfg.ep_len, "seq_len": cfg.ep_len,
            "fuse": True, "traced_ops": len(prog.passes.initial.ops),
            "sdg_ops": len(prog.sdg.ops), "scheduler": prog.schedule.method.split(" ")[0],
            "loadavg_at_start": load, "tempo_lab_compile_s": compile_s,
            "tempo_lab_by_stage": stages,
            "tempo_lab_with_kernels_s": compile_s + first.seconds,
            "kernels_method": "first run (kernels compile inside it; 2 iterations)",
            "jax_jit_compile_s": base["compile_s"],
            "ratio": (compile_s + first.seconds) / base["compile_s"], "max_abs_err": err}


SCALE_QUICK = [("unrolled", 2), ("unrolled", 24), ("layered", 24), ("chain", 1000),
               ("ppo", 0), ("window", 10**3), ("window", 10**7)]
SCALE_FULL = ([("unrolled", n) for n in (2, 8, 16, 24, 32, 64)]
              + [("layered", n) for n in (2, 24, 64)]
              + [("chain", 1000), ("chain", 10000), ("ppo", 0)]
              + [("window", 10**k) for k in (3, 5, 7, 9)])


def measure_scale(cases, seq_len: int = 32, on_record=None) -> list[dict]:
    """``--scale``: every case in a fresh subprocess, for the same reason as ``measure``."""
    return _in_subprocesses([(f"{program} {size}", ["--one-scale", program, str(size)])
                             for program, size in cases], seq_len, on_record)


def _print_scale_row(rec: dict) -> None:
    stages = ", ".join(f"{k} {v:.2f}" for k, v in rec["tempo_lab_by_stage"].items())
    print(f"{rec['scale']:>8} {rec['size']:>6}  {rec['traced_ops']:>6} {rec['sdg_ops']:>5}  "
          f"{rec['scheduler']:>7}  {rec['tempo_lab_compile_s']:>8.2f}  "
          f"{rec['tempo_lab_with_kernels_s']:>8.2f}  {_num(rec['jax_jit_compile_s'], 7, 2)}  "
          f"{_num(rec['ratio'], 6, 1)}x  {stages}"
          + (f", peak {rec['predicted_peak_bytes']} B" if "predicted_peak_bytes" in rec else ""),
          flush=True)


def _num(x, width: int, digits: int) -> str:
    return f"{'-':>{width}}" if x is None else f"{x:>{width}.{digits}f}"


def measure(layers: list[int], seq_len: int = 32, on_record=None) -> list[dict]:
    """One record per layer count, each measured in a fresh subprocess (JAX and tempo_lab
    cache compiled kernels per process, which would flatter every count after the first)."""
    return _in_subprocesses([(f"layers={n}", ["--one", str(n)]) for n in layers], seq_len,
                            on_record)


def _in_subprocesses(cases, seq_len: int, on_record) -> list[dict]:
    """Run ``python -m benchmarks.compile ARGS --seq-len N`` per ``(label, ARGS)``; the
    record each prints."""
    root = Path(__file__).resolve().parent.parent
    records = []
    for label, args in cases:
        proc = subprocess.run([sys.executable, "-m", "benchmarks.compile", *args,
                               "--seq-len", str(seq_len)], capture_output=True, text=True,
                              cwd=root)
        line = next((x for x in proc.stdout.splitlines() if x.startswith(RESULT)), None)
        if proc.returncode != 0 or line is None:
            raise RuntimeError(f"{label} failed:\n{proc.stderr[-3000:]}")
        records.append(json.loads(line[len(RESULT):]))
        if on_record:
            on_record(records[-1])
    return records


def _print_row(rec: dict) -> None:
    stages = ", ".join(f"{k} {v:.2f}" for k, v in rec["tempo_lab_by_stage"].items())
    print(f"{rec['layers']:>6}  {rec['sdg_ops']:>4}  {rec['tempo_lab_compile_s']:>11.2f}  "
          f"{rec['jax_scan_compile_s']:>10.2f}  {stages}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 4, 8, 16, 32, 64])
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--quick", action="store_true", help="layers 2, 8 and 32 only")
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--training", action="store_true",
                    help="the training example (200 iterations x 8 steps) instead of layers")
    ap.add_argument("--scale", action="store_true",
                    help="the scaling study: unrolled and layered decoders, op chains, PPO")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--one-scale", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one is not None:
        print(RESULT + json.dumps(one(args.one, args.seq_len)))
        return 0
    if args.one_scale is not None:
        program, size = args.one_scale
        print(RESULT + json.dumps(one_scale(program, int(size), args.seq_len)))
        return 0
    if args.scale:
        print(f"{'program':>8} {'size':>6}  {'traced':>6} {'ops':>5}  {'sched':>7}  "
              f"{'compile':>8}  {'+kernels':>8}  {'jax.jit':>7}  {'ratio':>7}  stages (s)")
        try:
            records = measure_scale(SCALE_QUICK if args.quick else SCALE_FULL, args.seq_len,
                                    on_record=_print_scale_row)
        except RuntimeError as e:
            print(e, file=sys.stderr)
            return 1
        out = args.out if args.out != DEFAULT_OUT else DEFAULT_OUT.replace(".json", "_scale.json")
        os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
        with open(out, "w") as f:
            json.dump(records, f, indent=1)
        print(f"wrote {out}")
        return 0
    if args.training:
        rec = one_training(200, 8)
        st = ", ".join(f"{k} {v:.2f}" for k, v in rec["tempo_lab_by_stage"].items())
        print(f"training ({rec['sdg_ops']} ops, {rec['executor']}): tempo_lab compile "
              f"{rec['tempo_lab_compile_s']:.2f} s ({st}), warm run {rec['tempo_lab_run_s']:.2f}"
              f" s; jax_scan compile {rec['jax_scan_compile_s']:.2f} s, run "
              f"{rec['jax_scan_run_s']:.3f} s")
        out = args.out if args.out != DEFAULT_OUT else DEFAULT_OUT.replace(".json",
                                                                           "_training.json")
        os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
        with open(out, "w") as f:
            json.dump([rec], f, indent=1)
        return 0
    layers = [2, 8, 32] if args.quick else args.layers
    print(f"{'layers':>6}  {'ops':>4}  {'tempo_lab s':>11}  {'jax_scan s':>10}  stages (s)")
    try:
        records = measure(layers, args.seq_len, on_record=_print_row)
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(records, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
