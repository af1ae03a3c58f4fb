"""Compile time by stage against the number of layers (the paper's compile-time figure).

    python -m benchmarks.compile [--layers 2 4 8 16 32 64] [--seq-len 32] [--out FILE] [--quick]

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


def measure(layers: list[int], seq_len: int = 32, on_record=None) -> list[dict]:
    """One record per layer count, each measured in a fresh subprocess (JAX and tempo_lab
    cache compiled kernels per process, which would flatter every count after the first)."""
    root = Path(__file__).resolve().parent.parent
    records = []
    for n in layers:
        proc = subprocess.run([sys.executable, "-m", "benchmarks.compile", "--one", str(n),
                               "--seq-len", str(seq_len)], capture_output=True, text=True,
                              cwd=root)
        line = next((x for x in proc.stdout.splitlines() if x.startswith(RESULT)), None)
        if proc.returncode != 0 or line is None:
            raise RuntimeError(f"layers={n} failed:\n{proc.stderr[-3000:]}")
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
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one is not None:
        print(RESULT + json.dumps(one(args.one, args.seq_len)))
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
