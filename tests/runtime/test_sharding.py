"""Several devices (``CompileConfig(mesh=..., shard=...)``): on four forced host devices in a
subprocess (XLA's device count is fixed when JAX starts), every executor gives the reference
interpreter's results and the XLA program is really partitioned; malformed sharding configs are located
errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import Mesh
from rt_helpers import COMPILED

import tempo_lab as tl

ROOT = Path(__file__).resolve().parents[2]

def rnn(config, batch=8):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 6, 16)).astype(np.float32)
    w = rng.standard_normal((16, 16)).astype(np.float32)
    ctx = tl.Context(dims=("b", "t"))
    B, T = ctx.bounds
    b, t = ctx.dims
    with ctx:
        xs = tl.from_array(x, domain=(b, t), name="xs")
        h = tl.placeholder((16,), domain=(b, t), name="h")
        h[tl.eq(t, 0)] = tl.tanh(xs @ tl.constant(w))
        h[t > 0] = tl.tanh(xs @ tl.constant(w) + h[b, t - 1])
        m = h[0:B, t].mean(axis=0)  # a reduction over the sharded dim: a collective
    return ctx.compile(bounds={B: batch, T: 6}, outputs={"h": h, "m": m}, config=config)


def _one_device_mesh():
    return Mesh(np.array(jax.devices()[:1]), ("data",))


@pytest.mark.parametrize("groups", [False, True], ids=["", "vectorise_groups"])
def test_a_mesh_of_one_device_gives_the_same_results(groups):
    """With ``vectorise_groups`` too: batching the ops off the recurrence over t (the input
    projection, the mean over b) must leave b a whole axis that can be sharded."""
    want = rnn(tl.CompileConfig()).run()
    prog = rnn(tl.CompileConfig(mesh=_one_device_mesh(), shard={"b": "data"},
                                vectorise_groups=groups))
    if groups:
        assert any("t" in op.attrs.get("vdims", ()) for op in prog.sdg.ops.values())
    got = prog.run()
    for k in ("h", "m"):
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6)
    text = prog.executable.pretty()
    assert "devices" in text and "b -> mesh axis data" in text
    assert prog.lowered.to_dict()["devices"]["shard"] == {"b": "data"}


def stored_rnn(config):
    """An RNN whose whole h is read after its loop (the stores a budget may move to the
    host); also run in two processes by ``test_multiprocess``."""
    ctx = tl.Context(dims=("b", "t"))
    B, T = ctx.bounds
    b, t = ctx.dims
    x = np.random.default_rng(0).standard_normal((8, 12, 64)).astype(np.float32)
    with ctx:
        h = tl.placeholder((64,), domain=(b, t), name="h")
        xs = tl.from_array(x, domain=(b, t))
        h[tl.eq(t, 0)] = tl.tanh(xs)
        h[t > 0] = tl.tanh(xs + h[b, t - 1])
        y = tl.tanh(h * 2)[b, 0:T].sum(axis=0) + h[b, 0:T].sum(axis=0)
    return ctx.compile(bounds={B: 8, T: 12}, outputs={"y": y}, config=config)


def test_a_batch_dim_stays_whole_under_a_budget_with_group_vectorisation():
    """Under a device memory budget the ops off the recurrence over t are batched after b is
    vectorised, sized with b's axis in them: b stays one axis that can be sharded (batched
    first, they left b room only for blocks, and sharding b was refused)."""
    def config(budget=None):
        return tl.CompileConfig(mesh=_one_device_mesh(), shard={"b": "data"},
                                vectorise_groups=True, device_memory_budget=budget)
    full = stored_rnn(config())
    low = stored_rnn(config(full.memory.peak_bytes // 2))
    np.testing.assert_allclose(low.run()["y"], full.run()["y"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kw, words", [
    ({"shard": {"b": "data"}}, "needs a mesh"),
    ({"mesh": "cpu", "shard": {"b": "data"}}, "jax.sharding.Mesh"),
    ({"mesh": "MESH", "shard": {"b": "model"}}, "one of the mesh's axes"),
    ({"mesh": "MESH", "shard": {}}, "give a dict"),
])
def test_malformed_sharding_configs_are_located_errors(kw, words):
    kw = {k: _one_device_mesh() if v == "MESH" else v for k, v in kw.items()}
    with pytest.raises(tl.ShardingError, match=words) as e:
        tl.CompileConfig(**kw)
    assert str(e.value).startswith(f"{__file__}:")


def test_sharding_a_dim_that_carries_a_recurrence_is_an_error():
    with pytest.raises(tl.ShardingError, match=r"cannot shard 't': .* reads h at t = t - 1") as e:
        rnn(tl.CompileConfig(mesh=_one_device_mesh(), shard={"t": "data"}))
    assert str(e.value).startswith(f"{__file__}:")
    with pytest.raises(tl.ShardingError, match="no dim 'q'"):
        rnn(tl.CompileConfig(mesh=_one_device_mesh(), shard={"q": "data"}))


CHECK = '''
mesh = Mesh(np.array(jax.devices()), ("data",))
assert len(jax.devices()) == 4, jax.devices()
out = {}
want = rnn(tl.CompileConfig(executor="reference")).run()
for ex in lowering():
    prog = rnn(tl.CompileConfig(executor=ex, mesh=mesh, shard={"b": "data"}))
    got = prog.run()
    out[ex] = max(float(np.abs(got[k] - want[k]).max()) for k in ("h", "m"))
    if ex == "xla":
        out["partitioned"] = partitioned(prog)
        out["device_peak"] = [prog.lowered.device_peak_bytes, prog.memory.peak_bytes]
try:
    rnn(tl.CompileConfig(mesh=mesh, shard={"b": "data"}), batch=6)
except tl.ShardingError as e:
    out["indivisible"] = str(e)
# the decoder only: PPO's rows take minutes to compile (python -m benchmarks.shard runs both)
out["benchmark"] = json.load(open(sys.argv[1])) if main(
    ["--quick", "--programs", "decoder", "--out", sys.argv[1]]) == 0 else None
print("RESULT " + json.dumps(out))
'''


def test_four_devices_give_the_reference_results_and_a_partitioned_program(tmp_path):
    script = tmp_path / "check.py"
    script.write_text("import json, sys\nimport jax, numpy as np\nimport tempo_lab as tl\n"
                      "from jax.sharding import Mesh\n"
                      "from benchmarks.shard import main, partitioned\n"
                      "from tempo_lab.executors import lowering\n"
                      "sys.path[:0] = ['tests', 'tests/runtime']\nfrom test_sharding import rnn\n"
                      "tl.config.progress = False\n" + textwrap.dedent(CHECK))
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "shard.json")],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    out = json.loads(line[len("RESULT "):])
    for ex in COMPILED:
        assert out[ex] < 1e-5, (ex, out[ex])  # a sharded sum adds in another order
    assert out["partitioned"]
    device, total = out["device_peak"]
    assert device < total
    assert "6" in out["indivisible"] and "4 devices" in out["indivisible"]
    records = out["benchmark"]
    assert {(r["program"], r["sharded"]) for r in records} == {
        ("decoder", False), ("decoder", True)}
    for r in records:
        assert r["max_abs_err"] < 1e-4
        if r["sharded"]:
            assert r["devices"] == 4 and r["partitioned"] is True
