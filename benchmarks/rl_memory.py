"""Memory-driven scheduling benchmark (the paper's Figure 15 at CPU scale): REINFORCE with
Monte-Carlo returns against TD(n) returns, at a size where the rollout dominates memory.

    python -m benchmarks.rl_memory [--quick] [--steps 4096] [--num-envs 16] [--iterations 3]
        [--runs 3] [--obs-sides 32 64] [--out benchmarks/results/rl_memory.json]

Every algorithm is compiled with the memory objective on (``CompileConfig(stream=True)``): sums
over the steps become running sums inside the rollout's loop where the dependences allow. A
TD(n) step's gradient needs the rewards up to ``n`` steps on, so the compiler runs it ``n``
steps late in the rollout's loop and keeps rings of ``n + 1`` steps; a Monte-Carlo return
needs the whole episode, so every step is stored until the rollout ends. Nothing in the
compiler knows about RL: the difference comes from the dependences. Each TD(n) record is also
compiled without the objective (``stream=False``) and both runs must give the same losses.

Records: ``{"experiment": "algorithm", "algorithm": "mc" | "td1" | "td4" | ..., "stream",
"store_peak_bytes" (measured: on the default XLA executor, every store it allocates for the
whole run), "predicted_store_peak_bytes" (the memory plan's per-step peak), "iter_s"
(median warm seconds per training iteration), "compile_s", "steps", "num_envs", ...}``.

``{"experiment": "large_obs", "obs": [3, H, W], "budget_bytes", "device_peak_bytes" (measured
on the codegen executor, which moves stores to the host and back), "predicted_device_peak_bytes",
"unbudgeted_peak_bytes", "offloaded_bytes", "iter_s", "unbudgeted_iter_s",
"matches_unbudgeted"}``: PPO on CartPole
seen as an image (``tl.rl.Pixels``), compiled without a budget and with half of that program's
peak as ``device_memory_budget``; the two must give the same losses and returns.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

from benchmarks.decode import _write, environment, loadavg, write_results

DEFAULT_OUT = os.path.join("benchmarks", "results", "rl_memory.json")
QUICK_OUT = os.path.join("benchmarks", "results", "rl_memory_quick.json")
TARGET = 0.5  # TD(4) store peak / Monte-Carlo's


def compile_reinforce(algorithm: str, steps: int, num_envs: int, iterations: int,
                      stream: bool = True, hidden: int = 64, executor: str = "auto"):
    """REINFORCE on CartPole, ``algorithm`` "mc" or "td<n>", compiled with or without the
    memory objective; outputs the per-iteration loss and episode return."""
    import tempo_lab as tl
    from tempo_lab.rl.algorithms import ReinforceConfig, reinforce
    from tempo_lab.rl.envs import CartPole

    n = None if algorithm == "mc" else int(algorithm[2:])
    # advantages are not normalised and the loss is a mean over all B * T steps: both are
    # per-iteration statistics of the whole rollout, which no schedule can stream
    cfg = ReinforceConfig(n_step=n, normalize=False, hidden=hidden, loss_mean="steps")
    ctx = tl.Context(dims=cfg.DIMS)
    tr = reinforce(ctx, CartPole(), cfg)
    return ctx.compile(bounds=cfg.bounds(ctx, iterations, num_envs, steps),
                       outputs={"loss": tr.loss, "episode_return": tr.episode_return},
                       config=tl.CompileConfig(stream=stream, executor=executor))


def measure(algorithm: str, steps: int, num_envs: int, iterations: int, runs: int,
            stream: bool = True, hidden: int = 64) -> tuple[dict, np.ndarray]:
    """One record, and the per-iteration losses (to check two compilations agree)."""
    t0 = time.perf_counter()
    prog = compile_reinforce(algorithm, steps, num_envs, iterations, stream, hidden)
    first = prog.run()
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        run = prog.run()
        times.append(time.perf_counter() - t0)
    rec = {"experiment": "algorithm", "algorithm": algorithm, "stream": stream,
           "steps": steps, "num_envs": num_envs, "iterations": iterations, "hidden": hidden,
           "store_peak_bytes": int(first.profile.peak_bytes),
           "predicted_store_peak_bytes": int(prog.memory.peak_bytes),
           "iter_s": statistics.median(times) / iterations, "compile_s": compile_s,
           "executor": prog.executor, "loadavg": loadavg()}
    return rec, np.asarray(run["loss"])


def _ppo_pixels(side: int, budget: int | None):
    import tempo_lab as tl
    from tempo_lab.rl.algorithms import PPOConfig, ppo
    from tempo_lab.rl.envs import CartPole, Pixels

    cfg = PPOConfig(hidden=16, update_epochs=2, num_minibatches=2)
    ctx = tl.Context(dims=cfg.DIMS)
    tr = ppo(ctx, Pixels(CartPole(), (3, side, side)), cfg)
    return ctx.compile(bounds=cfg.bounds(ctx, 2, 4, 32),
                       outputs={"loss": tr.loss, "episode_return": tr.episode_return},
                       config=tl.CompileConfig(executor="codegen", device_memory_budget=budget))


def _timed(prog, runs: int):
    """The first run (its profile) and the median of ``runs`` warm runs' seconds."""
    first = prog.run()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        prog.run()
        times.append(time.perf_counter() - t0)
    return first, statistics.median(times)


def large_obs(side: int, runs: int) -> dict:
    """PPO on ``3 x side x side`` observations, without a budget and under half its peak."""
    free = _ppo_pixels(side, None)
    want, free_secs = _timed(free, runs)
    budget = free.memory.peak_bytes // 2
    prog = _ppo_pixels(side, budget)
    got, secs = _timed(prog, runs)
    same = all(np.array_equal(np.asarray(got[k]), np.asarray(want[k]))
               for k in ("loss", "episode_return"))
    return {"experiment": "large_obs", "obs": [3, side, side], "budget_bytes": budget,
            "device_peak_bytes": int(got.profile.peak_bytes),
            "predicted_device_peak_bytes": int(prog.memory.peak_bytes),
            "unbudgeted_peak_bytes": int(free.memory.peak_bytes),
            "offloaded_bytes": int(got.profile.offloaded_bytes), "iter_s": secs / 2,
            "unbudgeted_iter_s": free_secs / 2,
            "matches_unbudgeted": same, "executor": prog.executor, "loadavg": loadavg()}


def run(algorithms, steps, num_envs, iterations, runs, out, sides=()) -> list[dict]:
    env = environment()
    records = []
    for side in sides:
        records.append({**env, **large_obs(side, runs)})
        _write(records, out + ".partial")
    for alg in algorithms:
        rec, loss = measure(alg, steps, num_envs, iterations, runs)
        records.append({**env, **rec})
        if alg != "mc":  # the same program without the memory objective: same losses
            off, loss_off = measure(alg, steps, num_envs, iterations, runs, stream=False)
            if not np.allclose(loss, loss_off, rtol=1e-4, atol=1e-5):
                raise SystemExit(f"{alg}: losses differ with and without streaming: "
                                 f"{loss} vs {loss_off}")
            records.append({**env, **off, "matches_streamed": True})
        _write(records, out + ".partial")
    write_results(records, out)
    return records


def table(records: list[dict]) -> str:
    lines = [f"{'obs':>12} {'budget':>9} {'device peak':>11} {'predicted':>9} "
             f"{'unbudgeted':>10} {'offloaded':>9} {'same':>5} {'s/iter':>7} {'(no budget)':>11}"]
    for r in (r for r in records if r["experiment"] == "large_obs"):
        mib = [f"{r[k] / 2**20:.2f}Mi" for k in ("budget_bytes", "device_peak_bytes",
                                                 "predicted_device_peak_bytes",
                                                 "unbudgeted_peak_bytes", "offloaded_bytes")]
        lines.append(f"{'x'.join(map(str, r['obs'])):>12} {mib[0]:>9} {mib[1]:>11} "
                     f"{mib[2]:>9} {mib[3]:>10} {mib[4]:>9} {str(r['matches_unbudgeted']):>5} "
                     f"{r['iter_s']:>7.3f} {r['unbudgeted_iter_s']:>11.3f}")
    records = [r for r in records if r["experiment"] == "algorithm"]
    mc = next((r for r in records if r["algorithm"] == "mc"), None)
    lines += ["", f"{'algorithm':>9} {'stream':>6} {'store peak':>11} {'predicted':>11} "
                  f"{'vs mc':>6} {'s/iter':>7}"]
    for r in records:
        ratio = r["store_peak_bytes"] / mc["store_peak_bytes"] if mc else float("nan")
        lines.append(f"{r['algorithm']:>9} {str(r['stream']):>6} "
                     f"{r['store_peak_bytes'] / 2**20:>9.2f}Mi "
                     f"{r['predicted_store_peak_bytes'] / 2**20:>9.2f}Mi {ratio:>6.2f} "
                     f"{r['iter_s']:>7.3f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.rl_memory",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small: 512 steps, 1 timed run")
    ap.add_argument("--steps", type=int, default=4096)
    ap.add_argument("--num-envs", type=int, default=16)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--algorithms", nargs="+", default=["mc", "td1", "td4", "td16"])
    ap.add_argument("--obs-sides", nargs="*", type=int, default=[32, 64],
                    help="large_obs: observation images 3 x S x S (none: skip)")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.runs, args.iterations = min(args.steps, 512), 1, 2
        args.algorithms = [a for a in args.algorithms if a in ("mc", "td4")]
        args.obs_sides = [s for s in args.obs_sides if s <= 32]
    import tempo_lab as tl

    tl.config.progress = False
    out = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)
    records = run(args.algorithms, args.steps, args.num_envs, args.iterations, args.runs, out,
                  args.obs_sides)
    print(table(records))
    td4 = next((r for r in records if r.get("algorithm") == "td4" and r["stream"]), None)
    mc = next((r for r in records if r.get("algorithm") == "mc"), None)
    if td4 and mc:
        ratio = td4["store_peak_bytes"] / mc["store_peak_bytes"]
        print(f"TD(4) / Monte-Carlo store peak: {ratio:.2f} (target <= {TARGET})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
