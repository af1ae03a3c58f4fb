"""What a GPU changes: programs run there and agree with the reference interpreter, the Hugging
Face fixtures match ``transformers`` in float32 and in bfloat16, and weights are held once on the
device. Skipped where JAX sees no GPU (CI); ``benchmarks/gpu_check.sh`` runs them on one."""
from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

import tempo_lab as tl

pytestmark = pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")
HF = Path(__file__).parents[1] / "fixtures" / "hf"


def test_a_recurrence_with_causal_and_window_reads_equals_the_reference():
    ctx = tl.Context(dims=("b", "t"))
    b, t = ctx.dims
    B, T = ctx.bounds
    x0 = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    with ctx:
        x = tl.placeholder((4,), "float32", domain=(b, t))
        x[b, 0] = tl.from_array(x0, domain=(b,))
        x[b, t] = tl.tanh(x[b, t - 1] * 1.5 + 0.25)
        y = x[b, 0:t + 1].sum(axis=0)
        w = x[b, tl.max(0, t - 2):t + 1].mean(axis=0)
    outs = {"y": y, "w": w}
    want = ctx.compile(bounds={B: 3, T: 50}, outputs=outs,
                       config=tl.CompileConfig(executor="reference")).run()
    for executor in ("xla", "codegen"):
        got = ctx.compile(bounds={B: 3, T: 50}, outputs=outs,
                          config=tl.CompileConfig(executor=executor)).run()
        for k in outs:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5, err_msg=k)


@pytest.mark.parametrize("name", ["llama3_tied", "untied_bf16"])
def test_a_checkpoint_matches_transformers_on_the_gpu(name):
    model, params = tl.nn.Llama.from_pretrained(HF / name)
    expected = np.load(HF / name / "expected.npz")
    ctx = tl.Context(dims=("b", "n", "t"))
    b, n, t = ctx.dims
    B, N, T = ctx.bounds
    with ctx:
        logits = model(params, tl.from_array(expected["ids"], domain=(b, t)), t, n)
    with jax.default_matmul_precision("highest"):
        got = ctx.compile(bounds={B: 2, N: model.layers, T: expected["ids"].shape[1]},
                          outputs={"logits": logits}).run()["logits"]
    np.testing.assert_allclose(got, expected["logits"], rtol=1e-3, atol=1e-3)


def test_bfloat16_weights_are_held_once_on_the_device():
    model = tl.nn.Llama(vocab=4096, embed=256, layers=2, heads=4, kv_heads=2, hidden=512)
    params = model.init(0, "bfloat16")
    ctx = tl.Context(dims=("b", "n", "t"))
    b, n, t = ctx.dims
    B, N, T = ctx.bounds
    with ctx:
        ids, _ = model.generate(params, tl.from_array(np.zeros((1, 4), np.int32), domain=(b,)),
                                t, n)
    prog = ctx.compile(bounds={B: 1, N: 2, T: 16}, outputs={"ids": ids})
    prog.run()
    weights = sum(v.nbytes for v in params.values())
    stats = prog.executable.memory_analysis()
    assert stats["argument"] <= weights * 1.05 + (1 << 20), (stats, weights)
    assert stats["temp"] <= weights * 0.25, (stats, weights)
