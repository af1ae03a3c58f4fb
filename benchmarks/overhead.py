"""Per-run overhead: ``prog.run()`` of a one-op program against a jitted JAX call of the same op
(its result back as NumPy, as ``prog.run()`` gives it), in the same process.

    python -m benchmarks.overhead [--quick] [--out benchmarks/results/overhead.json]

Programs (each tiny, so that what is timed is the fixed cost of a run, not its work):

- ``one_op``: ``y = tanh(x)`` over ``t`` (``x`` a 4 x 4 ``tl.from_array``; ``t`` vectorised,
  so the XLA program has no loop); JAX: ``jax.jit(jnp.tanh)``.
- ``loop``: ``h[t] = tanh(h[t-1] + x[t])`` over 8 steps (a loop; its statement counts come
  from the bounds, not from the XLA program, as for every program without a ``tl.until``
  loop); JAX: ``jax.jit`` of a ``lax.scan``.

JAX is timed two ways: ``jax_jit``, its input already on the device (the best a JAX user
repeating a call writes, and what a tempo_lab program does with a ``tl.from_array``), and
``jax_jit_numpy_in``, its NumPy input copied in at every call. Each system is timed in rounds
of calls (``timeit`` with the collector off, as for all), the systems' rounds interleaved so
that each round of one meets the machine as the others' did (on a shared machine a call's
time drifts by half over seconds); a record's ``us`` is the median over rounds of the mean per
call, ``us_min`` the fastest round. Records: ``{"program", "system": "tempo_lab" | "jax_jit" |
"jax_jit_numpy_in", "executor", "us", "us_min", "ratio" (the median over rounds of the round's
time over ``jax_jit``'s in the same round)}``. Target: ``one_op`` on ``xla`` within 2x of
``jax_jit``.
"""
from __future__ import annotations

import argparse
import os
import timeit

import numpy as np

from benchmarks.decode import environment, write_results

DEFAULT_OUT = os.path.join("benchmarks", "results", "overhead.json")
TARGET_RATIO = 2.0


def programs():
    """name -> (tempo_lab program builder(executor), plain JAX function, its NumPy input)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    import tempo_lab as tl

    x1 = np.arange(16, dtype=np.float32).reshape(4, 4) / 16
    x8 = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)

    def one_op(executor):
        ctx = tl.Context(dims=("t",))
        (t,), (T,) = ctx.dims, ctx.bounds
        with ctx:
            y = tl.tanh(tl.from_array(x1, domain=(t,), name="x"))
        return ctx.compile(bounds={T: 4}, outputs={"y": y},
                           config=tl.CompileConfig(executor=executor))

    def loop(executor):
        ctx = tl.Context(dims=("t",))
        (t,), (T,) = ctx.dims, ctx.bounds
        with ctx:
            x = tl.from_array(x8, domain=(t,), name="x")
            h = tl.placeholder((4,), "float32", domain=(t,), name="h")
            h[0] = tl.tanh(x[0])
            h[t] = tl.tanh(h[t - 1] + x[t])
        return ctx.compile(bounds={T: 8}, outputs={"h": h},
                           config=tl.CompileConfig(executor=executor))

    def scan(xs):
        def step(h, x):
            h = jnp.tanh(h + x)
            return h, h
        return lax.scan(step, jnp.zeros(xs.shape[1:], xs.dtype), xs)[1]

    return {"one_op": (one_op, jax.jit(jnp.tanh), x1), "loop": (loop, jax.jit(scan), x8)}


def _rounds(fns: dict, rounds: int, number: int) -> dict[str, np.ndarray]:
    """Per system, the mean microseconds per call of each round; the systems take turns."""
    per = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            per[name].append(timeit.timeit(fn, number=number) / number * 1e6)
    return {name: np.asarray(v) for name, v in per.items()}


def measure(executors, rounds: int, number: int) -> list[dict]:
    import jax

    import tempo_lab as tl

    tl.config.progress = False
    records = []
    for name, (build, jitted, x) in programs().items():
        want, on_device = np.asarray(jitted(x)), jax.device_put(x)
        fns = {"jax_jit": lambda f=jitted, a=on_device: np.asarray(f(a)),
               "jax_jit_numpy_in": lambda f=jitted, a=x: np.asarray(f(a))}
        for executor in executors:
            prog = build(executor)
            got = prog.run()
            out = got[next(iter(got.keys()))]
            np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6,
                                       err_msg=f"{name} on {executor} differs from JAX")
            fns[executor] = prog.run
        per = _rounds(fns, rounds, number)
        base = per["jax_jit"]
        for system, us in per.items():
            tempo = system not in ("jax_jit", "jax_jit_numpy_in")
            records.append({"program": name, "system": "tempo_lab" if tempo else system,
                             "executor": system if tempo else None,
                             "us": float(np.median(us)), "us_min": float(us.min()),
                             "ratio": float(np.median(us / base))})
        for r in records[-len(executors):]:
            print(f"{name:7s} {r['executor']:12s} {r['us']:8.1f} us  (jax.jit "
                  f"{np.median(base):.1f} us, {np.median(per['jax_jit_numpy_in']):.1f} us with "
                  f"a NumPy input)  {r['ratio']:.2f}x", flush=True)
    return records


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.overhead",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="xla only, fewer rounds")
    ap.add_argument("--executors", nargs="+", default=["xla", "codegen", "interpreter"])
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    executors = ["xla"] if args.quick else args.executors
    rounds, number = (7, 500) if args.quick else (15, 2000)
    records = [{**r, **environment()} for r in measure(executors, rounds, number)]
    write_results(records, args.out)
    one = next(r for r in records if r["program"] == "one_op" and r["executor"] == "xla")
    print(f"one_op on xla: {one['ratio']:.2f}x jax.jit (target <= {TARGET_RATIO}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
