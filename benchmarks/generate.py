"""``tl.nn.generate`` as a user calls it: a batch of prompts of different lengths against the
same prompts one at a time, and a new process's first token with the compilation cache warm
against cold.

    python -m benchmarks.generate --quick          # a small Llama; --preset llama-3.2-1b
    python -m benchmarks.generate --layers 2 --embed 512 --lengths 5 200 --batch 8
    python -m benchmarks.generate --quick --eos-after 8 --new 64   # early stop at EOS

Each call is timed whole, as a user waits for it: tempo_lab's compile of the program (every
call builds one for its prompts' shape), the XLA compile (warm after the first call of a shape,
and across processes through ``tl.config.compilation_cache``) and the run. Both ways give every
row the same tokens (checked before timing). Medians of ``--runs`` rounds taking turns; JSON
to ``benchmarks/results/generate.json``.

``--eos-after K``: the batch's ids that end a row are each row's K-th greedy token (so every
row ends by its K-th new token), and the same call is timed with the program stopping where
every row has ended (``early_stop=True``, a ``tl.until``) and running to the longest row's
limit (``early_stop=False``): the steps each runs and its median time.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def model_of(args):
    import tempo_lab as tl

    if args.preset == "llama-3.2-1b":
        cfg = Path(__file__).resolve().parent.parent / "tests/fixtures/configs/llama-3.2-1b.json"
        import dataclasses

        real = tl.nn.checkpoint.llama_from_config(tl.nn.checkpoint.read_config(cfg))
        return dataclasses.replace(real, layers=args.layers)
    return tl.nn.Llama(vocab=args.vocab, embed=args.embed, layers=args.layers, heads=args.heads,
                       kv_heads=max(1, args.heads // 2), hidden=2 * args.embed)


def prompts_of(args, vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    lengths = np.linspace(args.lengths[0], args.lengths[1], args.batch).round().astype(int)
    return [rng.integers(0, vocab, n).tolist() for n in lengths]


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def first_token(argv: list[str], cache: str) -> float:
    """Seconds from a new process's ``generate`` call to its first token (max_new_tokens=1)."""
    cmd = [sys.executable, "-m", "benchmarks.generate", "--first-token", cache, *argv]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=3600)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.generate")
    ap.add_argument("--quick", action="store_true", help="a small model, few runs")
    ap.add_argument("--preset", choices=["llama-3.2-1b"], help="real widths (random weights)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--embed", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lengths", type=int, nargs=2, default=(5, 200))
    ap.add_argument("--new", type=int, default=16, help="max_new_tokens")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--eos-after", type=int, help="each row ends by its K-th new token; "
                    "time the early stop against none")
    ap.add_argument("--out", type=Path, default=RESULTS / "generate.json")
    ap.add_argument("--first-token", help=argparse.SUPPRESS)  # the child of first_token()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    if args.quick:
        args.lengths, args.runs = (5, 60), 2
    import tempo_lab as tl

    tl.config.progress = False
    if args.first_token is not None:
        tl.config.compilation_cache = args.first_token
        model = model_of(args)
        params = model.init(0)
        print(timed(lambda: tl.nn.generate(model, params, prompts_of(args, model.vocab)[:1],
                                           max_new_tokens=1)))
        return 0
    model = model_of(args)
    params = model.init(0)
    prompts = prompts_of(args, model.vocab)
    if args.eos_after:
        return early_stop(args, model, params, prompts)
    batched = tl.nn.generate(model, params, prompts, max_new_tokens=args.new)
    alone = [tl.nn.generate(model, params, [p], max_new_tokens=args.new)[0] for p in prompts]
    assert batched == alone, "a row's tokens differ batched and alone"
    times = {"batched": [], "one_at_a_time": []}
    for _ in range(args.runs):
        times["batched"].append(timed(lambda: tl.nn.generate(model, params, prompts,
                                                             max_new_tokens=args.new)))
        times["one_at_a_time"].append(timed(lambda: [tl.nn.generate(
            model, params, [p], max_new_tokens=args.new) for p in prompts]))
    with tempfile.TemporaryDirectory() as cache:
        cold, warm = first_token(argv, cache), first_token(argv, cache)
    med = {k: statistics.median(v) for k, v in times.items()}
    record = {"model": repr(model), "batch": args.batch, "lengths": list(args.lengths),
              "new_tokens": args.new, "runs": args.runs, "seconds": times,
              "batched_s": med["batched"], "one_at_a_time_s": med["one_at_a_time"],
              "throughput_x": med["one_at_a_time"] / med["batched"],
              "first_token_cold_s": cold, "first_token_cached_s": warm,
              "first_token_ratio": warm / cold}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{record['model']}\n  {args.batch} prompts of {args.lengths[0]}-{args.lengths[1]} "
          f"tokens, {args.new} new: batched {med['batched']:.2f} s, one at a time "
          f"{med['one_at_a_time']:.2f} s: {record['throughput_x']:.2f}x the throughput\n"
          f"  first token in a new process: {cold:.2f} s cold, {warm:.2f} s with the cache "
          f"({record['first_token_ratio']:.2f}x)\n  -> {args.out}")
    return 0


def early_stop(args, model, params, prompts) -> int:
    """Steps and time with the program ending where every row has met its EOS, and without."""
    import tempo_lab as tl
    from tempo_lab.program import Program

    full = tl.nn.generate(model, params, prompts, max_new_tokens=args.new)
    stops = sorted({r[min(args.eos_after, len(r)) - 1] for r in full})
    steps, ran, run = [], [], Program.run

    def counted(self, *a, **k):
        t0 = time.perf_counter()
        out = run(self, *a, **k)
        ran.append(time.perf_counter() - t0)
        steps.append(out.bounds["T"])
        return out

    Program.run = counted
    record = {"model": repr(model), "batch": args.batch, "lengths": list(args.lengths),
              "new_tokens": args.new, "eos_after": args.eos_after, "runs": args.runs}
    got = {}
    for early in (False, True):
        def call(early=early):
            return tl.nn.generate(model, params, prompts, max_new_tokens=args.new, eos=stops,
                                  early_stop=early)
        got[early] = call()
        times = [timed(call) for _ in range(args.runs)]
        record[f"early_stop_{early}"] = {"steps": steps[-1], "seconds": times,
                                         "median_s": statistics.median(times),
                                         "run_median_s": statistics.median(ran[-args.runs:])}
    Program.run = run
    assert got[True] == got[False], "the early stop changed the tokens"
    record["new_tokens_per_row"] = [len(r) for r in got[True]]
    out = args.out.with_name("generate_early_stop.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    off, on = record["early_stop_False"], record["early_stop_True"]
    print(f"{record['model']}\n  {args.batch} prompts of {args.lengths[0]}-{args.lengths[1]} "
          f"tokens, up to {args.new} new, rows ending after {record['new_tokens_per_row']} "
          f"tokens (a call, compile included; the program's run):\n"
          f"  to the longest row's limit: {off['steps']} steps, {off['median_s']:.3f} s; "
          f"{off['run_median_s']:.3f} s\n  stopping when every row has ended: {on['steps']} "
          f"steps, {on['median_s']:.3f} s; {on['run_median_s']:.3f} s "
          f"({off['median_s'] / on['median_s']:.2f}x; "
          f"{off['run_median_s'] / on['run_median_s']:.2f}x)\n  -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
