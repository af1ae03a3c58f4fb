"""Prefix splitting (``passes/prefix.py``): the steps of a recurrence before a known prefix ends
(``x[t < P] = prompt[t]``) are split off and batched; the results are the unsplit program's and
the reference's."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from rt_helpers import COMPILED, DISTINCT_COMPILED

import tempo_lab as tl
from tempo_lab.schedule import Exec, For, If
from tempo_lab.schedule.loops import to_code

NO_PREFIX = tuple(p for p in tl.CompileConfig().passes if p != "prefix")
CKPT = Path(__file__).parents[1] / "fixtures" / "hf" / "llama3_tied"


def _attention_decoder(P: int = 6, steps: int = 11):
    """An autoregressive attention model written by hand: a step reads the prompt's value
    while ``t < P``, else a function of the last step's output; causal attention over the
    steps so far. No ``tl.nn``: any program of this shape is split."""
    rng = np.random.default_rng(0)
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        prompt = tl.from_array(rng.normal(size=(steps, 8)).astype(np.float32), domain=(t,),
                               name="prompt")  # read below P only
        wq, wk, wv, wo = (tl.from_array(rng.normal(size=(8, 8)).astype(np.float32) / 3,
                                        domain=(), name=n) for n in ("wq", "wk", "wv", "wo"))
        x = tl.placeholder((8,), "float32", domain=(t,), name="x")
        q, k, v = x[t] @ wq, x @ wk, x @ wv
        att = tl.softmax(k[0:t + 1] @ q, axis=0) @ v[0:t + 1]
        out = tl.tanh(att @ wo + x[t])
        x[t < P] = prompt[t]
        x[t] = out[t - 1]
    return ctx, {T: steps}, {"x": x, "out": out}


def _split(prog) -> bool:
    return any(d.name.endswith("_pre") for d in prog.sdg.dims)


@pytest.mark.executors(DISTINCT_COMPILED, reason="the split runs on every kind of back end")
def test_a_known_prefix_is_split_off_and_batched(executor):
    ctx, bounds, outputs = _attention_decoder()
    prog = ctx.compile(bounds=bounds, outputs=outputs,
                       config=tl.CompileConfig(executor=executor, check_invariants=True))
    assert _split(prog), prog.passes
    # the prompt steps' projections run as one batch over the prompt's steps
    batched = [op for op in prog.sdg.ops.values() if "t_pre" in op.attrs.get("vdims", ())
               and op.kind in ("matmul", "fused")]
    assert batched, [op.kind for op in prog.sdg.ops.values()]
    want = ctx.compile(bounds=bounds, outputs=outputs,
                       config=tl.CompileConfig(executor="reference")).run()
    unsplit = ctx.compile(bounds=bounds, outputs=outputs,
                          config=tl.CompileConfig(executor=executor, passes=NO_PREFIX)).run()
    assert not _split(unsplit.program)
    got = prog.run()
    for name in outputs:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(got[name], unsplit[name], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("P", [4, 10])
@pytest.mark.executors(COMPILED, reason="the cut is the lowered program's")
def test_the_loop_is_cut_at_the_prompts_end(executor, P):
    """A prefix of 4 of 11 steps is split too: the loop over ``t`` is cut in two at the
    prompt's end (``schedule/cut.py``), so the steps from it run the model with no branch on
    ``P`` (on XLA, no ``lax.cond`` a step) and those before it only copy the prompt's results
    (a prefix under half of the steps, and one ending a step before the last)."""
    ctx, bounds, outputs = _attention_decoder(P=P, steps=11)
    prog = ctx.compile(bounds=bounds, outputs=outputs,
                       config=tl.CompileConfig(executor=executor, check_invariants=True))
    assert _split(prog)
    loops = [f for f in prog.executable.lowered.ast.walk()
             if isinstance(f, For) and f.var == "t"]
    assert len(loops) == 2, prog.executable.lowered.ast
    guarded = {prog.sdg.ops[x.op].kind for n in loops[1].body.walk() if isinstance(n, If)
               for x in n.walk() if isinstance(x, Exec)}
    assert guarded <= {"dimval", "identity", "take", "from_array"}, to_code(loops[1])
    want = ctx.compile(bounds=bounds, outputs=outputs,
                       config=tl.CompileConfig(executor="reference")).run()
    got = prog.run()
    for name in outputs:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)


def test_the_lowered_program_says_where_a_loop_was_cut_and_why_not():
    """``Lowered.cut_notes`` (and its ``pretty()``): the split decode's loop over ``t`` cut at
    the prompt's end; without the split, the branch on the prompt's end (a constant 4 here)
    is a fixed number of steps from the start, which the cut leaves alone."""
    ctx, bounds, outputs = _attention_decoder(P=4, steps=11)
    notes = {}
    for name, passes in (("split", None), ("whole", NO_PREFIX)):
        config = tl.CompileConfig(executor="xla", **({"passes": passes} if passes else {}))
        lowered = ctx.compile(bounds=bounds, outputs=outputs, config=config).lowered
        notes[name] = [n for n in lowered.cut_notes if n.startswith("t in")]
        assert all(n in lowered.pretty() for n in notes[name])
    assert len(notes["split"]) == 1 and ": cut at T_PRE" in notes["split"][0], notes
    assert len(notes["whole"]) == 1 and "not cut at 4: a fixed number of steps" in \
        notes["whole"][0], notes


def test_a_prefix_of_one_step_is_not_split():
    ctx, bounds, outputs = _attention_decoder(P=1)
    prog = ctx.compile(bounds=bounds, outputs=outputs, config=tl.CompileConfig(executor="xla"))
    assert not _split(prog)
    want = ctx.compile(bounds=bounds, outputs=outputs,
                       config=tl.CompileConfig(executor="reference")).run()
    np.testing.assert_allclose(prog.run()["x"], want["x"], rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def llama():
    return tl.nn.Llama.from_pretrained(CKPT)


@pytest.mark.parametrize("kw", [{}, {"repetition_penalty": 1.3},
                                {"temperature": 0.8, "top_k": 5, "seed": 3},
                                {"eos": [2, 3, 50]}])
def test_generate_gives_the_same_tokens_split(llama, kw, monkeypatch):
    """``tl.nn.generate`` (prompts of different lengths, aligned at their ends) gives the
    same tokens with the prompt's steps split off as fed one step at a time; with ids that
    end a row too, where the step dim is a ``tl.until`` bound (the split applies there)."""
    model, params = llama
    prompts = [[5, 9, 17, 3, 44, 12, 8, 30, 2], [7, 7, 1, 60, 22, 9, 9], [11, 2, 3, 4, 5, 6, 70]]
    dims = []
    compile_ = tl.Context.compile
    monkeypatch.setattr(tl.Context, "compile", lambda self, *a, **k: (
        lambda p: dims.append([d.name for d in p.sdg.dims]) or p)(compile_(self, *a, **k)))
    split = tl.nn.generate(model, params, prompts, max_new_tokens=4, **kw)
    assert any(n.endswith("_pre") for n in dims[-1]), dims
    stepwise = tl.nn.generate(model, params, prompts, max_new_tokens=4,
                              config=tl.CompileConfig(passes=NO_PREFIX), **kw)
    assert split == stepwise


def test_a_decode_computes_the_model_from_the_prompts_end_only(llama):
    """Split, the decode steps' ops (over ``t``) are demanded from the prompt's end on: the
    prompt's steps run once, batched, not again one at a time; the output head runs at the
    prompt's last step only, not at every prompt step. Tokens equal the unsplit program's."""
    model, params = llama
    P, steps = 9, 13
    ctx = tl.Context(dims=("b", "t", "n"))
    b, t, n = ctx.dims
    with ctx:
        ids, logits = model.generate(params, tl.from_array(np.arange(1, P + 1)[None] % 90,
                                                           domain=(b,)), t, n)
    prog = ctx.compile(bounds={b.bound: 1, t.bound: steps, n.bound: model.layers},
                       outputs={"ids": ids}, config=tl.CompileConfig(check_invariants=True))
    assert _split(prog)
    values = {b.bound.name: 1, t.bound.name: steps, n.bound.name: model.layers,
              **{d.bound.name: P for d in prog.sdg.dims if d.name.endswith("_pre")}}
    over_t = [i for i, op in prog.sdg.ops.items() if op.kind in ("matmul", "fused")
              and any(d.name == "t" for d in op.domain) and i in prog.schedule.domains]
    assert over_t
    firsts = {prog.sdg.ops[i].label: _first_t(prog.schedule.domains[i], values) for i in over_t}
    assert all(f is None or f >= P - 1 for f in firsts.values()), firsts
    # each layer's weights are buffers of their own: the prompt's loop over layers picks its
    # layer's under a lax.switch, the decode steps read them in place (not a slice a step)
    plan = prog.executable.prepared.plan
    weights = {i for i, op in prog.sdg.ops.items() if op.label.startswith("layers_")
               and op.kind == "from_array"}
    assert weights and weights <= set(plan.unstacked), (weights, plan.unstacked)
    want = ctx.compile(bounds={b.bound: 1, t.bound: steps, n.bound: model.layers},
                       outputs={"ids": ids}, config=tl.CompileConfig(passes=NO_PREFIX)).run()
    np.testing.assert_array_equal(prog.run()["ids"], want["ids"])


def _first_t(s, values: dict) -> int | None:
    """The least ``t`` of the isl set ``s`` of an op's demanded points at these bounds."""
    import islpy as isl

    from tempo_lab.symbolic import isl as I

    f = I.fix(s, values)
    if f.is_empty():
        return None
    names = f.get_var_names(isl.dim_type.set)
    return f.dim_min_val(next(k for k, x in enumerate(names) if x.rstrip("'") == "t")
                         ).to_python()


@pytest.mark.executors(COMPILED, reason="the cut is the lowered program's")
def test_a_padded_batch_ending_early_is_the_references_on_every_executor(llama, executor):
    """Prompts aligned at their ends, split off, and the loop over the steps (a ``tl.until``
    loop: rows end at an id) cut at the prompts' end: every executor gives the reference's
    tokens, a row ending at its first new token among them."""
    model, params = llama
    rows = [[5, 9, 17, 3, 44, 12, 8, 30, 2], [7, 7, 1], [11, 2, 3, 4, 5]]
    first = tl.nn.generate(model, params, rows, max_new_tokens=1)[0][0]
    want = tl.nn.generate(model, params, rows, max_new_tokens=10, eos=[first],
                          config=tl.CompileConfig(executor="reference"))
    assert len(want[0]) == 1
    got = tl.nn.generate(model, params, rows, max_new_tokens=10, eos=[first],
                         config=tl.CompileConfig(executor=executor))
    assert got == want
