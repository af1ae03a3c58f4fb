"""RL training benchmark: PPO in tempo_lab (one program) and in CleanRL-style JAX.

    python -m benchmarks.rl [--quick] [--iterations 5] [--num-envs 32] [--ep-len 250]
        [--hidden 64] [--epochs 4] [--minibatches 4] [--env cartpole|pendulum]
        [--max-steps N] [--bootstrap-truncated]
        [--sweep ep_len num_envs hidden env] [--systems ...] [--turns 10]
        [--out benchmarks/results/rl.json] [--no-progress]

Systems (same environment, network, initial parameters, random numbers and hyper-parameters,
PPO as CleanRL runs it: ``epochs`` passes over each rollout in ``minibatches`` shuffled
minibatches, one Adam step per minibatch):

- ``tempo_lab``: ``tl.rl.ppo`` compiled over ``(i, e, m, s, b, t)``: acting, GAE, the
  shuffled minibatches, the loss, its gradient and Adam for every iteration are one program.
- ``cleanrl_jax``: the structure of CleanRL's JAX PPO written here in plain JAX: a jitted acting
  phase (``lax.scan`` over steps, ``vmap`` over environments) that stores observations, actions,
  log-probs, values and rewards, then a separate jitted learning phase (GAE, then a
  ``lax.scan`` over epochs of a ``lax.scan`` over minibatches, each recomputing the forward
  pass on its samples and taking one Adam step). A Python loop alternates the two, one call
  each per iteration. Its permutations come from ``tempo_lab.random.permutation_entry`` with
  the same keys, so both systems draw the same minibatches.

The baseline draws its noise with tempo_lab's counter-based generator
(``tempo_lab.runtime.counter_rng``, keyed by seed, stream and point) so both systems take the
same actions: the parent checks that their per-iteration returns and losses agree before it
prints a table. Each (system, configuration) runs in a fresh subprocess (``--one SYSTEM``) so
the peak RSS is that system's own; then a third one times both taking turns (``--turns``), so
the time ratio is measured on the same machine state for both.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from benchmarks.decode import (
    _bar,
    _write,
    environment,
    loadavg,
    rss_peak_bytes,
    taking_turns,
    vm_hwm_bytes,
    write_results,
)

SYSTEMS = ("tempo_lab", "cleanrl_jax")
RESULT_PREFIX = "RL_RESULT "
DEFAULT_OUT = os.path.join("benchmarks", "results", "rl.json")
QUICK_OUT = os.path.join("benchmarks", "results", "rl_quick.json")
LAYERS = 2      # tl.rl.ActorCritic: two tanh hidden layers per head, not configurable
RTOL = 1e-3     # returns and losses of the two systems, iteration by iteration
CONTINUOUS_CHECKED = 2  # iterations compared with continuous actions (see check_agreement)


@dataclass(frozen=True)
class Config:
    num_envs: int
    ep_len: int
    hidden: int
    iterations: int
    algorithm: str = "ppo"
    layers: int = LAYERS
    epochs: int = 4
    minibatches: int = 4
    env: str = "cartpole"
    max_steps: int | None = None       # the environment's time limit (None: its default)
    bootstrap_truncated: bool = False  # PPOConfig.bootstrap_truncated

    def label(self) -> str:
        limit = "" if self.max_steps is None else f" limit {self.max_steps}"
        boot = ", bootstrap truncated" if self.bootstrap_truncated else ""
        return (f"{self.algorithm} {self.env}{limit} {self.num_envs}x{self.ep_len}, "
                f"{self.layers}x{self.hidden}, {self.epochs}ep x {self.minibatches}mb, "
                f"{self.iterations} it{boot}")


ENVS = {"cartpole": "CartPole", "pendulum": "Pendulum"}
CONTINUOUS = ("pendulum",)   # environments with continuous actions


def make_env(cfg: Config):
    import tempo_lab as tl

    env = getattr(tl.rl, ENVS[cfg.env])
    return env() if cfg.max_steps is None else env(max_steps=cfg.max_steps)


def ppo_config(cfg: Config):
    """The hyper-parameters both systems use: ``tl.rl.PPOConfig``'s defaults, with the
    configuration's width, epochs, minibatches and truncation rule."""
    import tempo_lab as tl

    return tl.rl.PPOConfig(hidden=cfg.hidden, update_epochs=cfg.epochs,
                           num_minibatches=cfg.minibatches,
                           bootstrap_truncated=cfg.bootstrap_truncated)


# -- tempo_lab --------------------------------------------------------------------------------
def compile_tempo_lab(cfg: Config, config=None):
    """``tl.rl.ppo`` compiled for ``cfg`` (the default ``CompileConfig`` unless ``config`` is
    given: the value network and GAE's inputs batched over the steps); outputs ``return`` and
    ``loss`` per iteration. Returned so a notebook can look at its stages."""
    import tempo_lab as tl

    pc = ppo_config(cfg)
    ctx = tl.Context(dims=pc.DIMS)
    tr = tl.rl.ppo(ctx, make_env(cfg), pc)
    return ctx.compile(bounds=pc.bounds(ctx, cfg.iterations, cfg.num_envs, cfg.ep_len),
                       outputs={"return": tr.episode_return, "loss": tr.loss},
                       config=config)


PHASES_METHOD = ("JAX profiler trace of warm calls: each XLA thunk's measured time, attributed "
                 "by its HLO op_name (tempo_lab: the tl.scope of the op whose statement it "
                 "runs; plain JAX: jax.named_scope, jax.grad's transposed ops as gradient); "
                 "a fusion counts for its root's phase; unattributed = wall - thunks")


def bench_tempo_lab(cfg: Config, warm_runs: int, progress: bool, phases: bool = False) -> dict:
    """The whole program is one run, so an iteration's time is a run's time / iterations."""
    prog = compile_tempo_lab(cfg)
    stages = dict(prog.compile_times)
    first = prog.run()
    bar = _bar(warm_runs, f"tempo_lab {cfg.label()}: warm runs", progress)
    warm = []
    for _ in range(warm_runs):
        warm.append(prog.run())
        bar.update()
    bar.close()
    secs = [r.seconds for r in warm] or [first.seconds]
    stages["kernels"] = max(0.0, first.seconds - statistics.median(secs)) if warm else 0.0
    per_iter = [s / cfg.iterations for s in secs]
    extra = {}
    if phases:
        runs = max(warm_runs, 3)
        loops = prog.executable.loop_seconds(runs)
        extra = {"phases_s": phases_tempo_lab(prog, cfg, runs), "phases_method": PHASES_METHOD,
                 "loops_s": {f"loop{k} {x['loop']}": {
                     "seconds": x["seconds"] / cfg.iterations,
                     "control": x["control"] / cfg.iterations} for k, x in loops.items()},
                 "loops_method": LOOPS_METHOD}
    return {**extra, "iter_s": statistics.median(per_iter), "iter_s_all": per_iter,
            "timing": f"median warm run / iterations ({len(warm)} warm runs)",
            "compile_s": sum(stages.values()), "compile_s_by_stage": stages,
            "compile_method": "sum(prog.compile_times) + (first run - median warm run)",
            "first_run_s": first.seconds, "executor": prog.executor,
            "store_peak_bytes": int(first.profile.peak_bytes),
            "predicted_store_peak_bytes": int(prog.memory.peak_bytes),
            "returns": np.asarray(first["return"]).tolist(),
            "losses": np.asarray(first["loss"]).tolist()}


def phases_tempo_lab(prog, cfg: Config, runs: int) -> dict:
    """Measured seconds per iteration by the ``tl.scope`` the ops were made in (``tl.rl.ppo``
    tags rollout, gae, minibatch, loss, gradient, update and metrics)."""
    ex = prog.executable
    sdg = ex.lowered.sdg
    out: dict[str, float] = {}
    for k, sec in ex.op_seconds(runs).items():
        phase = k if isinstance(k, str) else (sdg.ops[k].scope or ("other",))[0]
        out[phase] = out.get(phase, 0.0) + sec / cfg.iterations
    return out


LOOPS_METHOD = ("seconds per iteration in each loop (its while thunk's time, JAX's profiler) "
                "and its control: the part that neither a thunk nor a loop inside it covers "
                "(xla_profile.loop_seconds); tempo_lab's loops as its program's source numbers "
                "them, the baseline's by their while instruction's op_name")


PHASES = ("rollout", "gae", "minibatch", "loss", "gradient", "update", "metrics")


def baseline_phase(path: str) -> str:
    """The phase of a plain-JAX instruction from its ``op_name`` path: ``jax.grad``'s
    transposed ops are the gradient, its forward (``jvp(loss)``) the loss; otherwise the
    innermost ``jax.named_scope`` phase."""
    if "transpose(" in path:
        return "gradient"
    if "jvp(" in path:
        return "loss"
    parts = path.split("/")
    return next((x for x in reversed(parts) if x in PHASES), "other")


# -- CleanRL-style plain JAX -------------------------------------------------------------------
def _noise(jnp, shape, seed: int, stream: int, coords):
    """tempo_lab's ``tl.random.uniform`` value at one point (streams: 0 = reset noise over
    ``(i, b)``, 1 = action noise over ``(i, b, t)``, in the order ``tl.rl.rollout`` makes them)."""
    from tempo_lab.runtime.counter_rng import sample

    attrs = {"dist": "uniform", "shape": shape, "dtype": "float32", "seed": seed,
             "stream": stream, "minval": 0.0, "maxval": 1.0}
    return sample(jnp, attrs, coords)


def make_cleanrl(cfg: Config):
    """``(theta0, act, learn)``: ``act(theta, i)`` plays ``num_envs`` masked episodes of
    ``ep_len`` steps and returns the batch; ``learn(theta, m, v, batch, i)`` computes GAE, then
    scans over epochs and, inside, over shuffled minibatches, recomputing the forward pass on
    each and taking one Adam step per minibatch. Both are jitted separately, as in CleanRL."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    import tempo_lab as tl
    from tempo_lab.nn.sampling import gumbel_argmax
    from tempo_lab.random import ROUNDS, permutation_entry
    from tempo_lab.rl.distributions import _entropy, _inverse_normal_cdf, _log_prob

    env, pc = make_env(cfg), ppo_config(cfg)
    net = tl.rl.ActorCritic.for_env(env, pc.hidden)
    half_log_2pi = 0.5 * math.log(2 * math.pi)

    def dist(theta, obs):
        """``(sample, log_prob, entropy)`` of the policy at ``obs``: the plain-JAX twin of
        ``tl.rl``'s Categorical (discrete) and Normal (continuous) distributions."""
        out = net.policy(theta, obs)
        if not net.continuous:
            return (lambda u: gumbel_argmax(out, u), lambda a: _log_prob(out, a),
                    lambda: _entropy(out))
        log_std = net.log_std(theta)
        entropy = (log_std + 0.5 + half_log_2pi).sum(axis=-1)
        return (lambda u: out + jnp.exp(log_std) * _inverse_normal_cdf(u),
                lambda a: (-0.5 * ((a - out) / jnp.exp(log_std)) ** 2 - log_std
                           - half_log_2pi).sum(axis=-1),
                lambda: jnp.broadcast_to(entropy, out.shape[:-1]))

    envs = jnp.arange(cfg.num_envs, dtype=jnp.int32)
    n = cfg.num_envs * cfg.ep_len
    size = n // pc.num_minibatches
    noise = (env.num_actions,) if hasattr(env, "num_actions") else (env.action_dim,)

    def act(theta, i):
        with jax.named_scope("rollout"):
            return _act(theta, i)

    def _act(theta, i):
        state = jax.vmap(lambda b: env.reset(_noise(jnp, env.reset_noise_shape, pc.seed, 0,
                                                    (i, b))))(envs)

        def step(carry, t):
            state, alive = carry
            obs = jax.vmap(env.observe)(state)
            u = jax.vmap(lambda b: _noise(jnp, noise, pc.seed + 1, 1, (i, b, t)))(envs)
            sample, log_prob, _ = dist(theta, obs)
            a = sample(u)
            new, r, terminated, truncated = jax.vmap(env.step)(state, a)
            done = terminated | truncated
            out = {"obs": obs, "action": a, "logp": log_prob(a),
                   "value": net.value(theta, obs), "reward": r * alive,
                   "done": done.astype(jnp.float32), "alive": alive}
            if pc.bootstrap_truncated:   # the value of the state a truncation reached
                out["terminated"] = terminated.astype(jnp.float32)
                out["truncated"] = truncated
                out["reached_value"] = net.value(theta, jax.vmap(env.observe)(new))
            state = jnp.where(done[:, None], state, new)     # masked episodes: frozen at the end
            return (state, alive * (1.0 - out["done"])), (out, new)

        steps = jnp.arange(cfg.ep_len, dtype=jnp.int32)
        _, (batch, new) = lax.scan(step, (state, jnp.ones(cfg.num_envs, jnp.float32)), steps)
        batch["last_value"] = net.value(theta, jax.vmap(env.observe)(new[-1]))
        return batch                                          # arrays over (t, b)

    def advantages(batch):
        """GAE backwards over t; the next step's value is the stored one (the state after a
        live, non-final transition is the next observation), the horizon's is ``last_value``.
        CleanRL's classic PPO ends the return at every ``done``; with ``bootstrap_truncated``
        a truncation takes the value of the state it reached."""
        nxt = jnp.concatenate([batch["value"][1:], batch["last_value"][None]])
        cont = 1.0 - batch["done"]
        kept = cont
        if pc.bootstrap_truncated:
            nxt = jnp.where(batch["truncated"], batch["reached_value"], nxt)
            kept = 1.0 - batch["terminated"]
        delta = (batch["reward"] + pc.gamma * kept * nxt - batch["value"]) * batch["alive"]

        def back(a_next, x):
            d, c = x
            a = d + pc.gamma * pc.lam * c * a_next
            return a, a

        _, adv = lax.scan(back, jnp.zeros(cfg.num_envs, jnp.float32), (delta, cont),
                          reverse=True)
        return adv

    def loss(theta, mb):
        with jax.named_scope("loss"):
            return _loss(theta, mb)

    def _loss(theta, mb):
        w = mb["alive"]
        count = jnp.maximum(w.sum(), 1.0)

        def mean(x):
            return (x * w).sum() / count

        mu = mean(mb["adv"])
        adv = (mb["adv"] - mu) / (jnp.sqrt(mean((mb["adv"] - mu) ** 2)) + 1e-8)
        _, log_prob, entropy = dist(theta, mb["obs"])         # the recomputed forward pass
        value = net.value(theta, mb["obs"])
        ratio = jnp.exp(log_prob(mb["action"]) - mb["logp"])
        clipped = jnp.clip(ratio, 1.0 - pc.clip, 1.0 + pc.clip)
        pg = -jnp.minimum(ratio * adv, clipped * adv)
        target = mb["adv"] + mb["value"]
        vl = (value - target) ** 2
        if pc.clip_vloss:
            vc = mb["value"] + jnp.clip(value - mb["value"], -pc.clip, pc.clip)
            vl = jnp.maximum(vl, (vc - target) ** 2)
        return mean(pg) + pc.vf_coef * 0.5 * mean(vl) - pc.ent_coef * mean(entropy())

    def learn(theta, m, v, batch, i):
        with jax.named_scope("gae"):
            batch = dict(batch, adv=lax.stop_gradient(advantages(batch)))
        # flat sample index b * T + t, as tl.rl.ppo numbers the rollout's points
        with jax.named_scope("minibatch"):
            flat = {k: jnp.swapaxes(batch[k], 0, 1).reshape((n, *batch[k].shape[2:]))
                    for k in ("obs", "action", "logp", "value", "alive", "adv")}
        lr = pc.lr * (1.0 - i / cfg.iterations) if pc.anneal_lr else pc.lr

        def epoch(carry, e):
            with jax.named_scope("minibatch"):
                keys = _noise(jnp, (ROUNDS,), pc.seed + 2, 2, (i, e))
                perm = jax.vmap(permutation_entry, (0, None, None))(jnp.arange(n), n, keys)

            def minibatch(carry, k):
                theta, m, v, step = carry
                with jax.named_scope("minibatch"):
                    idx = lax.dynamic_slice_in_dim(perm, k * size, size)
                    mb = {x: a[idx] for x, a in flat.items()}
                total, g = jax.value_and_grad(loss)(theta, mb)
                with jax.named_scope("update"):
                    m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
                    s = step.astype(jnp.float32)
                    m_hat, v_hat = m / (1 - 0.9 ** s), v / (1 - 0.999 ** s)
                    theta = theta - lr * m_hat / (jnp.sqrt(v_hat) + 1e-8)
                return (theta, m, v, step + 1), total

            return lax.scan(minibatch, carry, jnp.arange(pc.num_minibatches))

        step0 = i * pc.update_epochs * pc.num_minibatches + 1
        (theta, m, v, _), totals = lax.scan(epoch, (theta, m, v, step0),
                                            jnp.arange(pc.update_epochs))
        return theta, m, v, totals.mean(), batch["reward"].sum() / cfg.num_envs

    theta0 = jnp.asarray(net.init(pc.seed, pc.init_log_std))
    return theta0, jax.jit(act), jax.jit(learn)


def cleanrl_trainer(cfg: Config):
    """``(compile_s, train, (theta0, act, learn))``: the baseline compiled ahead of time, and
    ``train()``, which runs ``cfg.iterations`` iterations from ``theta0`` and returns each
    iteration's seconds (acting + learning, synchronised), return and loss."""
    import jax
    import jax.numpy as jnp

    theta, act, learn = make_cleanrl(cfg)
    i0 = jnp.int32(0)
    t0 = time.perf_counter()
    act_c = act.lower(theta, i0).compile()
    batch_shape = jax.eval_shape(act, theta, i0)
    zeros = jnp.zeros_like(theta)
    learn_c = learn.lower(theta, zeros, zeros, batch_shape, i0).compile()
    compile_s = time.perf_counter() - t0

    def train():
        th, m, v = theta, zeros, zeros
        secs, returns, losses = [], [], []
        for i in range(cfg.iterations):
            t0 = time.perf_counter()
            batch = act_c(th, jnp.int32(i))
            th, m, v, total, ret = learn_c(th, m, v, batch, jnp.int32(i))
            th.block_until_ready()
            secs.append(time.perf_counter() - t0)
            returns.append(float(ret))
            losses.append(float(total))
        return secs, returns, losses
    return compile_s, train, (theta, act_c, learn_c)


def bench_cleanrl(cfg: Config, warm_runs: int, progress: bool, phases: bool = False) -> dict:
    """Times every iteration (acting call + learning call, synchronised); compile_s is
    lower + compile of both functions (AOT, so the first call is not slower)."""
    import jax
    import jax.numpy as jnp

    compile_s, train, (theta, act_c, learn_c) = cleanrl_trainer(cfg)
    zeros = jnp.zeros_like(theta)
    first, returns, losses = train()
    bar = _bar(warm_runs, f"cleanrl_jax {cfg.label()}: warm runs", progress)
    secs = []
    for _ in range(warm_runs):
        secs += train()[0]
        bar.update()
    bar.close()
    secs = secs or first
    extra = {}
    if phases:
        from tempo_lab.runtime.xla_profile import loop_seconds, seconds_by

        runs, i0 = max(warm_runs, 3), jnp.int32(0)
        batch = act_c(theta, i0)
        calls = [(lambda: jax.block_until_ready(act_c(theta, i0)), act_c.as_text()),
                 (lambda: jax.block_until_ready(learn_c(theta, zeros, zeros, batch, i0)),
                  learn_c.as_text())]
        parts = [seconds_by(call, hlo, baseline_phase, runs) for call, hlo in calls]
        loops = [loop_seconds(call, hlo, lambda path: path, runs) for call, hlo in calls]
        extra = {"phases_s": {k: sum(p.get(k, 0.0) for p in parts)
                              for k in sorted(set().union(*parts))},
                 "phases_method": PHASES_METHOD,
                 "loops_s": {k: v for part in loops for k, v in part.items()},
                 "loops_method": LOOPS_METHOD}
    return {**extra, "iter_s": statistics.median(secs), "iter_s_all": secs,
            "timing": f"median over {len(secs)} iterations ({warm_runs} warm runs)",
            "compile_s": compile_s,
            "compile_method": "jax.jit(act/learn).lower(...).compile(), both phases",
            "first_run_s": sum(first), "returns": returns, "losses": losses}


BENCH = {"tempo_lab": bench_tempo_lab, "cleanrl_jax": bench_cleanrl}


def bench_turns(cfg: Config, rounds: int, progress: bool) -> dict:
    """Both systems warm in one process, taking turns: each round one whole training run of
    each (``cfg.iterations`` iterations), in the order A B then B A, so a machine that slows
    down mid-measurement slows both. The ratio is the median of the rounds' ratios: on a
    shared machine one system's time drifts by half between runs minutes apart, which the
    separate subprocesses (kept for the peak RSS) cannot tell from a difference."""
    prog = compile_tempo_lab(cfg)
    prog.run()
    _, train, _ = cleanrl_trainer(cfg)
    train()

    def tempo() -> float:
        return prog.run().seconds / cfg.iterations

    def baseline() -> float:
        return sum(train()[0]) / cfg.iterations
    bar = _bar(rounds, f"both systems {cfg.label()}: rounds", progress)
    got = taking_turns({"tempo_lab": tempo, "cleanrl_jax": baseline}, rounds, bar.update)
    bar.close()
    a, b = got["tempo_lab"], got["cleanrl_jax"]
    ratios = [x / y for x, y in zip(a, b)]
    return {"rounds": rounds, "tempo_lab_iter_s": a, "cleanrl_jax_iter_s": b,
            "ratios": ratios, "ratio": statistics.median(ratios),
            "method": "one process, one training run of each system per round (ABBA order); "
                      "ratio = median over rounds of tempo_lab / cleanrl_jax seconds per "
                      "iteration"}


# -- child processes ---------------------------------------------------------------------------
def run_one(args) -> int:
    """``--one SYSTEM``: time one system on one configuration and print its record."""
    import tempo_lab as tl

    load_start = loadavg()
    tl.config.progress = not args.no_progress
    (cfg,) = configs(args)
    if args.one == "turns":
        rec = bench_turns(cfg, args.turns, not args.no_progress)
    else:
        rec = BENCH[args.one](cfg, args.runs, not args.no_progress, args.phases)
    rec = {"system": args.one, **asdict(cfg), **rec, "rss_peak_bytes": rss_peak_bytes(),
           "vm_hwm_bytes": vm_hwm_bytes(), "loadavg_at_start": load_start,
           "loadavg_at_end": loadavg(), **environment()}
    print(RESULT_PREFIX + json.dumps(rec), flush=True)
    return 0


def _child_cmd(system: str, cfg: Config, args) -> list[str]:
    cmd = [sys.executable, "-m", "benchmarks.rl", "--one", system, "--num-envs",
           str(cfg.num_envs), "--ep-len", str(cfg.ep_len), "--hidden", str(cfg.hidden),
           "--iterations", str(cfg.iterations), "--epochs", str(cfg.epochs), "--minibatches",
           str(cfg.minibatches), "--env", cfg.env, "--runs", str(args.runs), "--no-progress"]
    cmd += ["--max-steps", str(cfg.max_steps)] * (cfg.max_steps is not None)
    cmd += ["--bootstrap-truncated"] * cfg.bootstrap_truncated
    cmd += ["--turns", str(args.turns)] * (system == "turns")
    return cmd + ["--phases"] * bool(getattr(args, "phases", False) and system != "turns")


class BenchmarkError(RuntimeError):
    """A system failed or the systems disagree; the message says how to reproduce."""


def check_agreement(by: dict[str, dict], continuous: bool = False) -> dict:
    """The systems' per-iteration returns and losses must agree: they take the same actions
    from the same parameters, so only float rounding separates them (returns to 1e-5 of their
    size, losses to ``RTOL``). Returns the largest differences.

    With ``continuous`` actions only the first ``CONTINUOUS_CHECKED`` iterations must: each
    Adam step moves a parameter whose gradient is near zero by about ``lr`` in the direction
    of its sign, which rounding may flip, and a continuous action follows every such change
    (measured on Pendulum, 32 x 250: 4e-7 apart at iteration 1, 6e-4 at 2, 1e-2 at 4; a
    discrete action is an argmax and stays the same)."""
    if len(by) < 2:
        return {}
    a, b = by["tempo_lab"], by["cleanrl_jax"]
    n = CONTINUOUS_CHECKED if continuous else None

    def rel(x, y):
        x, y = np.asarray(x, np.float64)[:n], np.asarray(y, np.float64)[:n]
        return float(np.max(np.abs(x - y) / np.maximum(np.abs(y), 1.0)))
    dr, dl = rel(a["returns"], b["returns"]), rel(a["losses"], b["losses"])
    if dr > 1e-5 or dl > RTOL:
        raise BenchmarkError(f"tempo_lab and cleanrl_jax disagree: returns {a['returns']} vs "
                             f"{b['returns']}, losses {a['losses']} vs {b['losses']}")
    return {"max_return_rel_diff": dr, "max_loss_rel_diff": dl,
            "iterations_checked": len(a["returns"]) if n is None else min(n, len(a["returns"]))}


def measure(cfgs: list[Config], systems=SYSTEMS, runs: int = 1, progress: bool = False,
            on_record=None, phases: bool = False, turns: int = 0) -> list[dict]:
    """Every system on every configuration, each in a fresh subprocess; the systems' curves
    are checked against each other per configuration. With ``turns`` (and both systems) a
    third subprocess times them taking turns (``bench_turns``), and both records get its
    result as ``turns``. For notebooks too (this process imports neither JAX nor tempo_lab
    for it)."""
    args = argparse.Namespace(runs=runs, phases=phases, turns=turns)
    together = turns > 0 and set(systems) == set(SYSTEMS)
    records = []
    bar = _bar(len(cfgs) * (len(systems) + together), "rl benchmark", progress, position=0)
    for cfg in cfgs:
        by = {}
        for system in (*systems, *("turns",) * together):
            bar.set_description(f"{system} {cfg.label()}")
            by[system] = _child(system, cfg, args, bar)
            bar.update()
        both = by.pop("turns", None)
        check = check_agreement(by, continuous=cfg.env in CONTINUOUS)
        for r in by.values():
            r["agreement"] = check
            if both is not None:
                r["turns"] = both
            records.append(r)
        if on_record:
            on_record(records)
    bar.close()
    return records


def _child(system: str, cfg: Config, args, bar) -> dict:
    """The record a ``--one SYSTEM`` subprocess prints."""
    cmd = _child_cmd(system, cfg, args)
    proc = subprocess.run(cmd, cwd=Path(__file__).resolve().parent.parent,
                          stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        bar.close()
        raise BenchmarkError(f"{system} ({cfg.label()}) failed with exit code "
                             f"{proc.returncode}; reproduce with\n  python {' '.join(cmd[1:])}")
    line = next(x for x in reversed(proc.stdout.splitlines()) if x.startswith(RESULT_PREFIX))
    return json.loads(line[len(RESULT_PREFIX):])


# -- the table ---------------------------------------------------------------------------------
def _mb(x) -> str:
    return "-" if x is None else f"{x / 2**20:.0f}"


def table(records: list[dict]) -> str:
    head = (f"{'config':<54} {'system':<12} {'iter ms':>10} {'compile s':>9} {'rss MiB':>8} "
            f"{'load 1m':>9}")
    lines = [head, "-" * len(head)]
    keyed: dict[str, dict] = {}
    for r in records:
        keyed.setdefault(Config(**{k: r[k] for k in Config.__dataclass_fields__}).label(),
                         {})[r["system"]] = r
    for label, by in keyed.items():
        for s, r in by.items():
            load = (f"{r['loadavg_at_start'][0]:.1f}-{r['loadavg_at_end'][0]:.1f}"
                    if r.get("loadavg_at_start") and r.get("loadavg_at_end") else "-")
            lines.append(f"{label:<54} {s:<12} {1e3 * r['iter_s']:>10.1f} "
                         f"{r['compile_s']:>9.2f} {_mb(r['rss_peak_bytes']):>8} {load:>9}")
        if len(by) == 2:
            a, b = by["tempo_lab"], by["cleanrl_jax"]
            lines.append(f"{'':<54} {'ratio':<12} {a['iter_s'] / b['iter_s']:>9.2f}x "
                         f"{a['compile_s'] / b['compile_s']:>8.1f}x "
                         f"{a['rss_peak_bytes'] / b['rss_peak_bytes']:>7.2f}x")
            if "turns" in a:
                t = a["turns"]
                lines.append(f"{'':<54} {'taking turns':<12} {t['ratio']:>9.2f}x  (median of "
                             f"{t['rounds']} rounds, {min(t['ratios']):.2f}-"
                             f"{max(t['ratios']):.2f}x)")
    return "\n".join(lines)


def phase_table(records: list[dict]) -> str:
    """Measured ms per iteration per phase, one column per system."""
    lines = []
    for r in records:
        if "phases_s" not in r:
            continue
        ph = r["phases_s"]
        keys = [k for k in (*PHASES, "other", "unattributed") if k in ph]
        lines.append(f"{r['system']:<12} " + "  ".join(f"{k} {1e3 * ph[k]:.1f}" for k in keys)
                     + f"  (sum {1e3 * sum(ph.values()):.1f} ms/iteration)")
    for r in records:
        if "loops_s" in r:
            loops = sorted(r["loops_s"].items(), key=lambda kv: -kv[1]["control"])
            lines.append(f"{r['system']:<12} loop control "
                         f"{1e3 * sum(x['control'] for _, x in loops):.1f} ms/iteration over "
                         f"{len(loops)} loops; most: " + ", ".join(
                             f"{k} {1e3 * x['control']:.2f} of {1e3 * x['seconds']:.2f}"
                             for k, x in loops[:3]))
    return "phases, measured ms per iteration:\n" + "\n".join(lines)


NOTES = """\
iter ms: median seconds per training iteration (acting + learning on num_envs x ep_len steps).
  tempo_lab: a warm run of the whole program / iterations; cleanrl_jax: each iteration timed.
compile s: tempo_lab = sum(prog.compile_times) + (first run - median warm run);
  cleanrl_jax = lower + compile of the acting and the learning function.
ratio: of the separate subprocesses' medians; taking turns (--turns N): both systems in one
  process, a training run of each per round (ABBA), median of the rounds' ratios.
rss: peak resident set of the subprocess that ran that system alone (ru_maxrss).
load 1m: 1-minute load average when the subprocess started and ended (2 CPUs, shared)."""


# -- main --------------------------------------------------------------------------------------
def configs(args) -> list[Config]:
    """The base configuration, then one sweep per name in ``--sweep`` (each varies one
    parameter around the base, like the paper's Figure 13)."""
    base = Config(args.num_envs, args.ep_len, args.hidden, args.iterations,
                  epochs=args.epochs, minibatches=args.minibatches, env=args.env,
                  max_steps=args.max_steps, bootstrap_truncated=args.bootstrap_truncated)
    out = [base]
    for name in args.sweep or ():
        for value in getattr(args, f"sweep_{name}"):
            cfg = replace(base, **{name: value})
            if cfg not in out:
                out.append(cfg)
    return out


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.rl",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--num-envs", type=int, default=32)
    ap.add_argument("--ep-len", type=int, default=250)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--runs", type=int, default=1, help="warm runs after the first (default 1)")
    ap.add_argument("--epochs", type=int, default=4, help="update epochs per iteration")
    ap.add_argument("--minibatches", type=int, default=4, help="minibatches per epoch")
    ap.add_argument("--env", choices=sorted(ENVS), default="cartpole")
    ap.add_argument("--max-steps", type=int, default=None,
                    help="the environment's time limit (default: its own, 500 and 200)")
    ap.add_argument("--bootstrap-truncated", action="store_true",
                    help="bootstrap episodes the time limit truncates (PPOConfig option)")
    ap.add_argument("--sweep", nargs="*", choices=("ep_len", "num_envs", "hidden", "env"),
                    default=[])
    ap.add_argument("--sweep-ep_len", type=int, nargs="+", default=[25, 50, 100, 250])
    ap.add_argument("--sweep-num_envs", type=int, nargs="+", default=[4, 8, 16, 32])
    ap.add_argument("--sweep-hidden", type=int, nargs="+", default=[32, 64, 128, 256])
    ap.add_argument("--sweep-env", nargs="+", choices=sorted(ENVS), default=sorted(ENVS))
    ap.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    ap.add_argument("--quick", action="store_true",
                    help="PPO on CartPole at 32 envs x 250 steps, 2x64 MLP, 4 epochs x 4 "
                         "minibatches, 5 iterations")
    ap.add_argument("--out", default=None,
                    help=f"JSON file (default {DEFAULT_OUT}, with --quick {QUICK_OUT})")
    ap.add_argument("--turns", type=int, default=10,
                    help="rounds of both systems taking turns in one process (default 10; "
                         "0: none)")
    ap.add_argument("--phases", action="store_true",
                    help="also profile each system per phase (rollout, gae, minibatch, loss, "
                         "gradient, update) with JAX's profiler")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--one", choices=(*SYSTEMS, "turns"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.num_envs, args.ep_len, args.hidden, args.iterations = 32, 250, 64, 5
    if args.one and (len(configs(args)) != 1 or args.quick):
        ap.error("--one takes one configuration (no --sweep)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.one:
        return run_one(args)
    out_path = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)
    wall0 = time.perf_counter()
    try:
        records = measure(configs(args), args.systems, args.runs, not args.no_progress,
                          on_record=lambda recs: _write(recs, out_path + ".partial"),
                          phases=args.phases, turns=args.turns)
    except BenchmarkError as e:
        print(f"ABORT: {e}", file=sys.stderr)
        return 2
    print(table(records))
    if args.phases:
        print()
        print(phase_table(records))
    print()
    print(NOTES)
    print(f"total wall time {time.perf_counter() - wall0:.0f} s")
    write_results(records, out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
