"""Prefill: a prompt's first token, with the compiler's prefix split against the prompt fed one
step at a time, and against plain JAX's batched forward over the prompt.

    python -m benchmarks.prefill --quick
    python -m benchmarks.prefill --preset llama-3.2-1b --layers 2 --prompt 512

tempo_lab: the decode program of the prompt and one new token (``model.generate``), compiled
once and run, with the default passes (``passes/prefix.py`` splits the prompt's steps off and
vectorisation batches them) and without the ``prefix`` pass (every prompt step a decode step,
as before); and the time to first token of ``tl.nn.generate(model, params, [prompt],
max_new_tokens=1)``, timed whole as a user waits for it (its own compile of the program, the
XLA program from the process's cache after one untimed call, the run). Plain JAX: one jitted function of the prompt that
computes every layer's keys and values for all its positions at once (causal attention by a
mask, per-layer weights as device arrays, the work LLM runtimes call prefill) and the logits
of its last position, timed warm. Every system's first token is checked equal. Medians of
``--runs`` calls taking turns; JSON to ``benchmarks/results/prefill.json``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from .generate import model_of

RESULTS = Path(__file__).resolve().parent / "results"


def jax_prefill(model):
    """The jitted plain-JAX prefill: ``(p, ids (B, P)) -> (last logits (B, vocab), [(k, v)
    per layer, each (B, P, kv_heads, head_dim)])``."""
    import jax

    from .llama import _head, layers

    def prefill(p, ids):
        h, caches = layers(p, ids, model)
        return _head(p, h[:, -1], model), caches

    return jax.jit(prefill)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.prefill")
    ap.add_argument("--quick", action="store_true", help="a small model, a 64-token prompt")
    ap.add_argument("--preset", choices=["llama-3.2-1b"], help="real widths (random weights)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--embed", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS / "prefill.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.prompt, args.runs = 64, 2
    import jax

    import tempo_lab as tl

    from .llama import device_params

    tl.config.progress = False
    model = model_of(args)
    params = model.init(0)
    prompt = np.random.default_rng(0).integers(0, model.vocab, args.prompt).tolist()
    stepwise = tl.CompileConfig(passes=tuple(p for p in tl.CompileConfig().passes
                                             if p != "prefix"))
    p, fn = device_params(params, model), jax_prefill(model)
    ids = np.asarray([prompt], np.int32)

    def run_jax():
        logits, caches = fn(p, ids)
        jax.block_until_ready(caches)
        return int(np.argmax(np.asarray(logits)[0]))

    def program(config):
        """The decode program of one prompt and one new token, compiled once: its run."""
        ctx = tl.Context(dims=("b", "t", "n"))
        b, t, n = ctx.dims
        with ctx:
            out, _ = model.generate(params, tl.from_array(ids, domain=(b,)), t, n)
        prog = ctx.compile(bounds={b.bound: 1, t.bound: args.prompt + 1, n.bound: model.layers},
                           outputs={"ids": out}, config=config)
        return lambda: int(np.asarray(prog.run()["ids"])[0, -1])

    systems = {"split": program(tl.CompileConfig()), "stepwise": program(stepwise),
               "jax": run_jax,
               "split_call": lambda: tl.nn.generate(model, params, [prompt],
                                                    max_new_tokens=1)[0][0]}
    first = {name: fn_() for name, fn_ in systems.items()}  # compiles; the tokens checked
    assert len(set(first.values())) == 1, f"first tokens differ: {first}"
    times: dict[str, list[float]] = {name: [] for name in systems}
    for _ in range(args.runs):
        for name, fn_ in systems.items():
            t0 = time.perf_counter()
            fn_()
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    record = {"model": repr(model), "prompt": args.prompt, "runs": args.runs, "seconds": times,
              "split_s": med["split"], "stepwise_s": med["stepwise"], "jax_s": med["jax"],
              "first_token_s": med["split_call"],
              "split_over_jax": med["split"] / med["jax"],
              "stepwise_over_split": med["stepwise"] / med["split"]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{record['model']}, a {args.prompt}-token prompt to its first token:\n"
          f"  tempo_lab run, prompt steps split off, batched  {med['split']:.3f} s\n"
          f"  tempo_lab run, prompt fed one step at a time    {med['stepwise']:.3f} s\n"
          f"  plain JAX batched forward (jitted)              {med['jax']:.3f} s\n"
          f"  tl.nn.generate call (its compile included)      {med['split_call']:.3f} s\n"
          f"  split / JAX {record['split_over_jax']:.2f}x, stepwise / split "
          f"{record['stepwise_over_split']:.1f}x  -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
