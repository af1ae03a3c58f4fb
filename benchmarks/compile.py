"""Compile time by stage against the number of layers (the paper's compile-time figure).

    python -m benchmarks.compile [--layers 2 4 8 16 32 64] [--seq-len 32] [--out FILE] [--quick]

For each layer count, in a fresh subprocess (JAX and tempo_lab cache compiled kernels per
process): the decoder of ``benchmarks.decode`` (batch, layers and steps as dims) is compiled by
tempo_lab, and each stage's seconds are recorded from ``prog.compile_times`` (build, validate,
passes, schedule, memory) plus the kernels JAX compiles during the first run (its compile
events); the same decoder as one ``jax.jit`` of a ``lax.scan`` (``jax_scan``) is compiled for
comparison. Layers are a dim in tempo_lab, so its program does not grow with them; the JAX
program unrolls them.

The issue also asks for compile time of a training example; none exists yet (autodiff,
``tl.grad``, is still being built), so only the decoder is measured here.
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
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one is not None:
        print(RESULT + json.dumps(one(args.one, args.seq_len)))
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
