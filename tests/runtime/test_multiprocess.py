"""Several processes (``python -m tempo_lab.launch -n 2``): two local processes of two CPU
devices each, joined over loopback, run one sharded program as JAX's multi-controller runtime
does on a cluster. Every process gets the whole outputs, equal to the one-process run; the
user's callbacks run once; what cannot work is a located ``ShardingError``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rt_helpers import COMPILED

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r'''
import json
import sys

import jax
import numpy as np
from jax.sharding import Mesh

import tempo_lab as tl
from benchmarks.shard import PROGRAMS, partitioned
from tempo_lab.executors import lowering
from test_sharding import rnn, stored_rnn

tl.config.progress = False
me = jax.process_index()
out = {"process": me, "processes": jax.process_count(), "devices": len(jax.devices()),
       "local": len(jax.local_devices())}
mesh = Mesh(np.array(jax.devices()), ("data",))
sharded = tl.CompileConfig(mesh=mesh, shard={"b": "data"})

want = rnn(tl.CompileConfig(executor="reference")).run()
for ex in lowering():
    prog = rnn(tl.CompileConfig(executor=ex, mesh=mesh, shard={"b": "data"}))
    got = prog.run()
    out[ex] = max(float(np.abs(got[k] - want[k]).max()) for k in ("h", "m"))
    if ex == "xla":
        out["partitioned"] = partitioned(prog)

build, _ = PROGRAMS["decoder"](True)
one, split = build(tl.CompileConfig()), build(sharded)
out["decoder"] = float(np.abs(split.run()["y"] - one.run()["y"]).max())
out["decoder_partitioned"] = partitioned(split)

# a source's value and a sink's call: once, in process 0, the same on every executor
calls = []
def program(config, over_b=False):
    ctx = tl.Context(dims=("b", "t"))
    B, T = ctx.bounds
    b, t = ctx.dims
    with ctx:
        x = tl.from_array(np.arange(40, dtype=np.float32).reshape(8, 5), domain=(b, t))
        x = x + tl.source(lambda p: np.float32(100 * p["t"] + me), shape=(), dtype="float32",
                          domain=(t,))
        y = x * 2
        tl.sink(y if over_b else y[0:B, t].sum(axis=0),
                lambda p, v: calls.append([p["t"], float(v)]))
    return ctx.compile(bounds={B: 8, T: 5}, outputs={"y": y}, config=config)
for ex in lowering():
    calls.clear()
    got = program(tl.CompileConfig(executor=ex, mesh=mesh, shard={"b": "data"})).run()["y"]
    out[f"callbacks_{ex}"] = [sorted(calls), got.tolist()]
try:
    program(sharded, over_b=True)
except tl.ShardingError as e:
    out["sink_over_b"] = str(e)

# stores moved to the host between phases: each process keeps its own shards
full = stored_rnn(sharded)
budget = tl.CompileConfig(mesh=mesh, shard={"b": "data"},
                          device_memory_budget=full.memory.peak_bytes // 2)
low = stored_rnn(budget)
out["offload"] = [low.executor, float(np.abs(low.run()["y"] - full.run()["y"]).max())]

try:  # each process its own executor: two programs
    rnn(tl.CompileConfig(executor=("xla", "codegen")[me], mesh=mesh, shard={"b": "data"}))
except tl.ShardingError as e:
    out["different"] = str(e)
print("RESULT " + json.dumps(out), flush=True)
'''


def launch(tmp_path, script: str, *args: str, timeout: float = 240):
    path = tmp_path / "script.py"
    path.write_text(script)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "runtime")])}
    env.pop("XLA_FLAGS", None)
    return subprocess.run([sys.executable, "-m", "tempo_lab.launch", *args, str(path)],
                          capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=timeout + 30)


def results(proc) -> dict[int, dict]:
    out = {}
    for line in proc.stdout.splitlines():
        k, _, rest = line.partition("] ")
        if rest.startswith("RESULT "):
            out[int(k[1:])] = json.loads(rest[len("RESULT "):])
    return out


def test_two_processes_run_one_sharded_program(tmp_path):
    proc = launch(tmp_path, SCRIPT, "-n", "2", "--devices", "2", "--timeout", "240")
    got = results(proc)
    assert proc.returncode == 0 and set(got) == {0, 1}, proc.stdout[-4000:]
    for k, out in got.items():
        assert (out["process"], out["processes"], out["devices"], out["local"]) == (k, 2, 4, 2)
        for ex in COMPILED:
            assert out[ex] < 1e-5, (k, ex, out[ex])  # a sharded sum adds in another order
        assert out["partitioned"] and out["decoder_partitioned"]
        assert out["decoder"] < 1e-4
        for ex in COMPILED:
            calls, y = out[f"callbacks_{ex}"]
            # the source's value is process 0's (100 t), whichever process reads it
            assert y == [[2 * (5 * b + t) + 200 * t for t in range(5)] for b in range(8)]
            sums = [[t, float(sum(row[t] for row in y))] for t in range(5)]
            assert calls == (sums if k == 0 else []), (k, ex, calls)  # once, in process 0
        assert "tl.sink" in out["sink_over_b"] and out["sink_over_b"].startswith(str(
            tmp_path / "script.py"))
        assert out["offload"][0] == "codegen" and out["offload"][1] < 1e-5
        assert "processes [1] compiled another program" in out["different"]


FAILS = r'''
import jax
if jax.process_index() == 1:
    RAISE
import time
time.sleep(120)  # process 0 would wait for process 1 in a collective
'''


@pytest.mark.parametrize("raise_, status, shown", [
    ("raise SystemExit(3)", 3, None),
    ("raise ValueError('bad batch')", 1, "[1] ValueError: bad batch"),
])
def test_a_failing_process_stops_the_others_at_once(tmp_path, raise_, status, shown):
    proc = launch(tmp_path, FAILS.replace("RAISE", raise_), "-n", "2", "--timeout", "60",
                  timeout=60)
    assert proc.returncode == status, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert shown is None or shown in proc.stdout
    assert "--timeout" not in proc.stderr  # stopped by the failure, not by the clock


@pytest.mark.parametrize("args, words", [
    (["-n", "0"], "positive"),
    ([], "give -n N"),
    (["--coordinator", "h:1", "--processes", "2", "--process-id", "2"], "give 0 to 1"),
])
def test_launch_arguments_are_checked(tmp_path, args, words):
    proc = launch(tmp_path, "", *args, timeout=30)
    assert proc.returncode == 2 and words in proc.stderr


def _running(marker: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        try:
            cmdline = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone, or not a process
            continue
        if d.name.isdigit() and marker in cmdline:
            out.append(int(d.name))
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_killing_the_launcher_stops_its_processes(tmp_path):
    path = tmp_path / "sleeps.py"
    path.write_text("import time\ntime.sleep(120)\n")
    launcher = subprocess.Popen([sys.executable, "-m", "tempo_lab.launch", "-n", "2",
                                 str(path)], cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while len(_running(f"--child {path}")) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(_running(f"--child {path}")) == 2
    finally:
        launcher.kill()  # SIGKILL: the launcher runs no cleanup of its own
        launcher.wait()
    deadline = time.monotonic() + 10
    while _running(f"--child {path}") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _running(f"--child {path}") == []
