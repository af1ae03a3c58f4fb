"""Several devices: a program's batch dim sharded over a mesh against the same program on one.

    python -m benchmarks.shard [--quick] [--devices 4] [--processes 1] [--out FILE]

For the decoder of ``benchmarks.decode`` (batch ``b`` sharded) and PPO of ``benchmarks.rl``
(environments ``b`` sharded), compiled once for one device and once with
``CompileConfig(mesh=Mesh(devices, ("data",)), shard={"b": "data"})``: the outputs are checked
equal, then timed (median of warm runs). Records: ``program``, ``devices``, ``sharded``,
``max_abs_err`` (against the one-device run), ``ms`` (per run), ``partitioned`` (the XLA
program's HLO holds one device's share of the batch, not the whole batch: really split, not
replicated) and ``device_peak_bytes`` (the plan's store peak on one device).

On a CPU-only machine the devices are XLA's forced host devices
(``--xla_force_host_platform_device_count``): the benchmark re-runs itself with the flag set, so
the numbers show that the program is partitioned and what that costs, not a speed-up (the host
devices share the same cores).

``--processes 2`` runs the same under ``python -m tempo_lab.launch -n 2``: the devices are split
between two processes joined over loopback (JAX's multi-controller runtime, gloo collectives),
the sharded program runs as one SPMD program across both, and its outputs, gathered in every
process, are checked against the one-device run; process 0 records (``processes``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

FLAG = "--xla_force_host_platform_device_count"
DEFAULT_OUT = os.path.join("benchmarks", "results", "shard.json")


def _decoder(quick: bool):
    import tempo_lab as tl
    from benchmarks.decode import Config, make_inputs, tempo_lab_decoder

    cfg = Config(layers=2, heads=4, embed=64 if quick else 256, batch=8,
                 seq_len=32 if quick else 256, attention="causal", window=None)
    weights, tokens = make_inputs(cfg)

    def build(config):
        ctx = tl.Context(dims=("b", "n", "t"))
        B, N, T = ctx.bounds
        y = tempo_lab_decoder(ctx, weights, tokens, cfg.heads, cfg.window)
        return ctx.compile(bounds={B: cfg.batch, N: cfg.layers, T: cfg.seq_len},
                           outputs={"y": y}, config=config)
    return build, f"decoder batch {cfg.batch}, T = {cfg.seq_len}, embed {cfg.embed}"


def _ppo(quick: bool):
    from benchmarks.rl import Config, compile_tempo_lab

    cfg = Config(num_envs=8 if quick else 32, ep_len=25 if quick else 250, hidden=64,
                 iterations=2)
    return (lambda config: compile_tempo_lab(cfg, config)), cfg.label()


PROGRAMS = {"decoder": _decoder, "ppo": _ppo}


def partitioned(prog) -> bool:
    """Whether the XLA program holds one device's share of its sharded stores: after SPMD
    partitioning, the HLO has the per-device shape of some sharded store (a replicated program
    would only have whole ones)."""
    import jax.numpy as jnp

    layout, hlo = prog.lowered.layout, prog.executable.hlo()
    for i, s in prog.executable.prepared.plan.shapes.items():
        sharding = layout.store(i, len(s[0]))
        if sharding is not None:
            local = sharding.shard_shape(s[0])
            if local != tuple(s[0]) and f"{jnp.dtype(s[1]).name[0]}{jnp.dtype(s[1]).itemsize * 8}" \
                    f"[{','.join(map(str, local))}]" in hlo:
                return True
    return False


def one(program: str, devices: int, quick: bool, runs: int) -> list[dict]:
    import jax
    import numpy as np
    from jax.sharding import Mesh

    import tempo_lab as tl

    tl.config.progress = False
    build, label = PROGRAMS[program](quick)
    mesh = Mesh(np.array(jax.devices()[:devices]), ("data",))
    records, want = [], None
    for sharded in (False, True):
        config = tl.CompileConfig(mesh=mesh, shard={"b": "data"}) if sharded else \
            tl.CompileConfig()
        prog = build(config)
        first = prog.run()
        outs = {k: np.asarray(first[k]) for k in prog.sdg.outputs}
        if want is None:
            want = outs
        err = max(float(np.max(np.abs(outs[k] - want[k]))) for k in want)
        if not all(np.allclose(outs[k], want[k], rtol=1e-4, atol=1e-4) for k in want):
            raise RuntimeError(f"{program}: sharded and one-device outputs differ by {err}")
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            prog.run()
            times.append(time.perf_counter() - t0)
        records.append({
            "program": program, "label": label, "devices": devices if sharded else 1,
            "sharded": sharded, "executor": prog.executor, "max_abs_err": err,
            "ms": 1e3 * statistics.median(times), "runs": runs,
            "partitioned": (partitioned(prog) if sharded and prog.executor == "xla"
                            else None),
            "device_peak_bytes": int(prog.lowered.device_peak_bytes),
            "peak_bytes": int(prog.memory.peak_bytes),
            "processes": jax.process_count() if sharded else 1,
            "platform": jax.devices()[0].platform})
    return records


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, 3 warm runs")
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--processes", type=int, default=1,
                    help="split the devices between this many local processes")
    ap.add_argument("--runs", type=int, default=None)
    ap.add_argument("--programs", nargs="+", default=list(PROGRAMS), choices=list(PROGRAMS))
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    root = Path(__file__).resolve().parent.parent
    argv = argv if argv is not None else sys.argv[1:]
    if args.processes > 1 and "TEMPO_LAB_LAUNCH" not in os.environ:
        if args.devices % args.processes:
            print(f"--devices {args.devices} do not split over --processes {args.processes}",
                  file=sys.stderr)
            return 1
        return subprocess.run([sys.executable, "-m", "tempo_lab.launch", "-n",
                               str(args.processes), "--devices",
                               str(args.devices // args.processes), "--timeout", "3000",
                               str(Path(__file__).resolve()), *argv], cwd=root).returncode
    import jax

    from benchmarks.decode import write_results

    if len(jax.devices()) < args.devices:
        if jax.devices()[0].platform != "cpu" or FLAG in os.environ.get("XLA_FLAGS", ""):
            print(f"only {len(jax.devices())} devices; ask for fewer with --devices",
                  file=sys.stderr)
            return 1
        env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} "
                                          f"{FLAG}={args.devices}".strip()}
        return subprocess.run([sys.executable, "-m", "benchmarks.shard", *argv],
                              env=env, cwd=root).returncode
    runs = args.runs or (3 if args.quick else 10)
    records, first = [], jax.process_index() == 0
    say = print if first else (lambda *a, **k: None)  # one table, from process 0
    say(f"{'program':>8} {'devices':>7} {'executor':>8} {'ms':>9} {'max err':>9} "
        f"{'partitioned':>11} {'peak/device B':>13}")
    for program in args.programs:
        for rec in one(program, args.devices, args.quick, runs):
            records.append(rec)
            say(f"{rec['program']:>8} {rec['devices']:>7} {rec['executor']:>8} "
                f"{rec['ms']:>9.2f} {rec['max_abs_err']:>9.2e} {str(rec['partitioned']):>11}"
                f" {rec['device_peak_bytes']:>13}", flush=True)
    if first:
        write_results(records, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
