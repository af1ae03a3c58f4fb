"""The benchmark commands run end to end at tiny sizes: their correctness checks (every system's
output against NumPy before anything is timed) and their JSON records are exercised in CI. The
numbers themselves are benchmarks, not tests (see benchmarks/README.md)."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DECODE_FIELDS = {"system", "attention", "window", "seq_len", "layers", "batch", "ms_per_token",
                 "ms_per_token_min", "ms_per_token_max", "compile_s", "store_peak_bytes",
                 "rss_peak_bytes"}


def _run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_decode_benchmark_tiny(tmp_path, model):
    out = tmp_path / "decode.json"
    _run("benchmarks.decode", "--model", model, "--layers", "1", "--embed", "32", "--heads", "2",
         "--batch", "1", "--vocab", "48", "--seq-len", "16", "--attention", "both", "--window",
         "4", "--runs", "1", "--no-progress", "--out", str(out), "--systems", "tempo_lab",
         "jax_scan", "jax_step")
    records = json.loads(out.read_text())
    assert {r["system"] for r in records} == {"tempo_lab", "jax_scan", "jax_step"}
    assert {r["attention"] for r in records} == {"causal", "window"}
    for r in records:
        assert DECODE_FIELDS <= r.keys() and r["ms_per_token"] > 0 and r["model"] == model


def test_the_llama_preset_is_llama_3_2_1b():
    import tempo_lab as tl
    from benchmarks import decode

    args = decode.parse_args(["--preset", "llama-3.2-1b", "--layers", "2", "--dtype",
                              "bfloat16"])
    (cfg,) = decode.configs(args)
    real = tl.nn.checkpoint.llama_from_config(tl.nn.checkpoint.read_config(
        ROOT / "tests" / "fixtures" / "configs" / "llama-3.2-1b.json"))
    assert cfg.llama == dataclasses.replace(real, layers=2)
    assert (cfg.dtype, cfg.batch, cfg.attention, args.runs) == ("bfloat16", 1, "causal", 3)


def test_transformers_generate_is_a_third_reference(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    out = tmp_path / "decode.json"
    _run("benchmarks.decode", "--model", "llama", "--layers", "2", "--embed", "32", "--heads",
         "4", "--kv-heads", "2", "--batch", "2", "--vocab", "64", "--seq-len", "24",
         "--attention", "causal", "--runs", "1", "--no-progress", "--out", str(out),
         "--systems", "hf_generate")
    (rec,) = json.loads(out.read_text())
    assert rec["system"] == "hf_generate" and rec["max_abs_err"] < 1e-3


def test_compile_benchmark_tiny(tmp_path):
    out = tmp_path / "compile.json"
    _run("benchmarks.compile", "--layers", "2", "--seq-len", "8", "--out", str(out))
    (rec,) = json.loads(out.read_text())
    assert rec["layers"] == 2 and rec["tempo_lab_compile_s"] > 0 and rec["max_abs_err"] < 1e-3


def test_compile_scale_window_records_the_same_peak_at_any_bound():
    from benchmarks.compile import one_scale

    small, huge = (one_scale("window", n, n) for n in (10**3, 10**7))
    assert small["predicted_peak_bytes"] == huge["predicted_peak_bytes"] > 0
    assert huge["simulated_steps"] < 4 * small["simulated_steps"]


def test_autobatch_benchmark_tiny(tmp_path):
    out = tmp_path / "autobatch.json"
    _run("benchmarks.autobatch", "--batch", "8", "--seq-len", "8", "--layers", "3", "--leaves",
         "4", "--hidden", "8", "--runs", "1", "--bucketed", "--phases", "--out", str(out))
    records = json.loads(out.read_text())
    assert {r["model"] for r in records} == {"birnn", "berxit", "treelstm"}
    for r in records:
        assert r["ms_per_batch"] > 0 and r["max_abs_err"] < 1e-3
        assert 0 < r["useful_fraction"] <= 1 and r["tempo_lab_ratio"] > 0
        if r["system"] in ("tempo_lab", "jax_padded"):  # --phases: both systems' profiles
            ph = r["phases_us"]
            assert ph["program"] > 0 and ph["loops"], ph
            assert ph["kernels"] + ph["control"] == pytest.approx(ph["program"])
        else:
            assert "phases_us" not in r
    assert {r["system"] for r in records if r["model"] == "birnn"} == {
        "tempo_lab", "jax_padded", "jax_per_instance", "jax_bucketed"}
    tree = {r["system"]: r for r in records if r["model"] == "treelstm"}
    assert set(tree) == {"tempo_lab", "jax_padded", "jax_per_instance", "jax_levels"}
    assert tree["tempo_lab"]["levels"] == tree["jax_levels"]["levels"]
    assert tree["tempo_lab"]["levels"]["steps"] < tree["tempo_lab"]["nodes_max"]


def test_rl_memory_benchmark_tiny(tmp_path):
    """Both experiments' records; PPO on 3x8x8 images under a budget of half its unbudgeted
    peak comes within 55 % of that peak (0.39 of 0.72 MiB; the target of half was met while
    isl scheduled PPO: 0.41 of 0.82 MiB, see benchmarks/README.md) with the same results and
    no more than the plan predicts. Monte-Carlo and TD(4) with and without streaming, their
    losses compared, are what the rl_memory notebook runs (tests/test_notebooks.py): here TD(4)
    alone, at 8 steps, for its records."""
    out = tmp_path / "rl_memory.json"
    _run("benchmarks.rl_memory", "--steps", "8", "--num-envs", "2", "--iterations", "1",
         "--runs", "1", "--algorithms", "td4", "--obs-sides", "8", "--out", str(out))
    records = json.loads(out.read_text())
    obs = [r for r in records if r["experiment"] == "large_obs"]
    assert len(obs) == 1 and obs[0]["matches_unbudgeted"]
    assert obs[0]["device_peak_bytes"] == obs[0]["predicted_device_peak_bytes"]
    assert obs[0]["device_peak_bytes"] <= 0.55 * obs[0]["unbudgeted_peak_bytes"]
    assert obs[0]["offloaded_bytes"] > 0
    algs = {(r["algorithm"], r["stream"]) for r in records if r["experiment"] == "algorithm"}
    assert algs == {("td4", True), ("td4", False)}


def test_rl_benchmark_tiny(tmp_path):
    """PPO in both systems, each in its own subprocess (checked to agree), then both taking
    turns in one process: each record carries the rounds' ratios and their median."""
    out = tmp_path / "rl.json"
    proc = _run("benchmarks.rl", "--num-envs", "2", "--ep-len", "8", "--hidden", "8",
                "--iterations", "2", "--epochs", "1", "--minibatches", "2", "--turns", "3",
                "--no-progress", "--out", str(out))
    records = json.loads(out.read_text())
    assert {r["system"] for r in records} == {"tempo_lab", "cleanrl_jax"}
    turns = records[0]["turns"]
    assert turns == records[1]["turns"] and turns["rounds"] == 3
    assert len(turns["ratios"]) == 3 and turns["ratio"] == sorted(turns["ratios"])[1]
    assert all(x > 0 for x in turns["tempo_lab_iter_s"] + turns["cleanrl_jax_iter_s"])
    assert "taking turns" in proc.stdout


def test_soak_benchmark_tiny(tmp_path):
    """Each system's record: RSS after every program, checked against NumPy on the way."""
    out = tmp_path / "soak.json"
    _run("benchmarks.soak", "--small", "3", "--ppo", "0", "--out", str(out))
    records = json.loads(out.read_text())
    assert {(r["system"], r["kind"]) for r in records} == {("tempo_lab", "small"),
                                                           ("jax", "small")}
    for r in records:
        assert len(r["rss_bytes"]) == len(r["seconds"]) == 3
        assert r["growth_bytes"] == r["rss_bytes"][-1] - r["rss_bytes"][0]


def test_overhead_benchmark_tiny(tmp_path):
    """Each program on xla against jax.jit, checked against JAX's values on the way."""
    out = tmp_path / "overhead.json"
    _run("benchmarks.overhead", "--quick", "--out", str(out))
    records = json.loads(out.read_text())
    assert {(r["program"], r["system"], r["executor"]) for r in records} == {
        (p, s, e) for p in ("one_op", "loop")
        for s, e in (("jax_jit", None), ("jax_jit_numpy_in", None), ("tempo_lab", "xla"))}
    assert all(r["us"] > 0 and r["us_min"] <= r["us"] for r in records)


def test_generate_benchmark_tiny(tmp_path):
    out = tmp_path / "generate.json"
    _run("benchmarks.generate", "--layers", "1", "--embed", "32", "--heads", "2", "--vocab", "48",
         "--batch", "3", "--lengths", "2", "9", "--new", "3", "--runs", "1", "--out", str(out))
    r = json.loads(out.read_text())
    assert r["batch"] == 3 and r["throughput_x"] > 0 and r["first_token_cached_s"] > 0


@pytest.mark.parametrize("mixed", [False, True], ids=["float32", "mixed"])
def test_train_benchmark_quick(tmp_path, mixed):
    """Each system (plain JAX with and without a checkpoint per layer) in its own process; the
    losses of three Adam steps agree, also in mixed precision (bfloat16 weights, float32
    masters)."""
    out = tmp_path / "train.json"
    _run("benchmarks.train", "--quick", "--seq", "16", "--out", str(out), *["--mixed"] * mixed)
    r = json.loads(out.read_text())
    assert r["losses_equal"] and r["mixed"] == mixed and r["time_ratio"] > 0 and r["rss_ratio"] > 0
    assert r["time_ratio_checkpoint"] > 0 and len(r["jax_checkpoint"]["losses"]) == 3
    assert len(r["tempo_lab"]["losses"]) == 3 and r["tempo_lab"]["plan_peak"] > 0


def test_prefill_benchmark_tiny(tmp_path):
    """The prompt's steps split off, fed one at a time and plain JAX's batched forward give
    the same first token (the benchmark checks it before timing)."""
    out = tmp_path / "prefill.json"
    _run("benchmarks.prefill", "--layers", "1", "--embed", "32", "--heads", "2", "--vocab", "48",
         "--prompt", "9", "--runs", "1", "--out", str(out))
    r = json.loads(out.read_text())
    assert r["prompt"] == 9 and min(r["split_s"], r["stepwise_s"], r["jax_s"]) > 0
