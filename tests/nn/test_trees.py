"""Trees batched level by level: ``tl.nn.tree_levels`` lays out the nodes, a program loops over
its steps with every slot of a step batched, gathering children from the steps before."""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tempo_lab as tl


def random_forest(trees: int, max_leaves: int, seed: int):
    """Random binary trees in post-order, as the autobatch benchmark draws them."""
    from benchmarks.autobatch import random_tree

    rs = np.random.RandomState(seed)
    ts = [random_tree(int(n), rs) for n in rs.randint(1, max_leaves + 1, size=trees)]
    kids = np.full((trees, max(len(t) for t in ts), 2), -1)
    for b, t in enumerate(ts):
        kids[b, :len(t)] = t
    return kids, np.array([len(t) for t in ts])


def height(kids, b: int, n: int) -> int:
    """Tree ``b``'s height in nodes (post-order: children before parents)."""
    h = np.zeros(n, int)
    for i in range(n):
        h[i] = 1 + max((h[c] for c in kids[b, i] if c >= 0), default=0)
    return int(h.max()) if n else 0


def check_layout(lv, kids, lengths, width=None):
    """Every node once, within the width, each after its children, and no more steps than
    needed where slots are not the limit."""
    placed = {}
    for b, n in enumerate(lengths):
        for i in range(n):
            s, k = int(lv.step[b, i]), int(lv.slot[b, i])
            assert 0 <= s < lv.steps and 0 <= k < lv.width
            assert (s, k) not in placed.values()
            placed[b, i] = (s, k)
            for a, c in enumerate(kids[b, i]):
                if c >= 0:
                    assert lv.step[b, c] < s
                    assert lv.has_child[s, k, a]
                    assert (lv.child_step[s, k, a], lv.child_slot[s, k, a]) == placed[b, c]
                else:
                    assert not lv.has_child[s, k, a]
        assert (lv.step[b, n:] == -1).all()
    assert lv.used.sum() == len(placed) == lengths.sum()
    if width is not None:
        assert lv.width == width
    tallest = max(height(kids, b, n) for b, n in enumerate(lengths))
    assert lv.steps >= tallest
    if lv.width >= max(((kids[b, :n] < 0).all(-1)).sum() for b, n in enumerate(lengths)) \
            * len(lengths):
        assert lv.steps == tallest  # slots for every leaf at once: the height is enough


@settings(max_examples=40, deadline=None)
@given(trees=st.integers(1, 6), leaves=st.integers(1, 9), seed=st.integers(0, 10**6),
       width=st.one_of(st.none(), st.integers(1, 40)))
def test_layout_places_every_node_after_its_children(trees, leaves, seed, width):
    kids, lengths = random_forest(trees, leaves, seed)
    check_layout(tl.nn.tree_levels(kids, lengths, width=width), kids, lengths, width)


def test_layout_takes_the_fewest_steps_on_a_small_width():
    """Hu's schedule on few slots: one slot runs a node a step; a perfect tree of 8 leaves
    takes 8 | 4 | 2 | 1 on 8 slots, and on 4 slots one more step, as any schedule must (its
    4 inner nodes above the leaves need all 8 leaves done)."""
    kids, lengths = random_forest(3, 6, seed=0)
    assert tl.nn.tree_levels(kids, lengths, width=1).steps == lengths.sum()
    perfect = np.array([[-1, -1]] * 8 + [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11],
                                          [12, 13]])[None]
    assert tl.nn.tree_levels(perfect, width=8).steps == 4
    assert tl.nn.tree_levels(perfect, width=4).steps == 5
    assert tl.nn.tree_levels(perfect, width=3).steps == 6


def test_layout_scales_to_a_large_batch():
    kids, lengths = random_forest(2000, 64, seed=3)            # about 130 000 nodes
    t0 = time.process_time()  # this process's CPU time: a guard against a blow-up in the
    lv = tl.nn.tree_levels(kids, lengths)  # size, not a timing (other processes do not count)
    assert time.process_time() - t0 < 30
    assert lv.used.sum() == lengths.sum() and lv.useful_fraction > 0.8
    assert lv.steps <= 2 * max(height(kids, b, n) for b, n in enumerate(lengths[:50])) + 40


@pytest.mark.parametrize("children, lengths, width, says", [
    (np.array([[[1, -1], [-1, -1], [1, -1]]]), None, None, "is a child of nodes"),
    (np.array([[[5, -1], [-1, -1]]]), None, None, "outside the tree's 2 nodes"),
    (np.array([[[-5, -1], [-1, -1]]]), None, None, "exactly -1 for none"),
    (np.array([[[1, -1], [0, -1]]]), None, None, "cycle"),
    (np.array([[[-1, -1]]]), [3], None, "lengths must be"),
    (np.array([[[-1, -1]]]), [0.5], None, "integer counts"),
    (np.array([[[-1, -1]]]), None, True, "width must be a positive int"),
    (np.array([[[-1, -1]]]), None, 0, "width must be a positive int"),
    (np.zeros((2, 2, 2), np.float32), None, None, "integers of shape"),
])
def test_bad_trees_say_what_is_wrong_at_the_users_line(children, lengths, width, says):
    with pytest.raises(tl.ArgumentError) as e:
        tl.nn.tree_levels(children, lengths, width=width)
    assert str(e.value).startswith(f"{__file__}:")
    assert says in str(e.value)


def treelstm(p, executor, grad=False):
    from benchmarks.autobatch import tree_levels, treelstm_levels_program

    ctx = tl.Context(dims=("b", "s", "k"))
    lv = tree_levels(p)
    w, root = treelstm_levels_program(ctx, p, lv)
    B, S, K = ctx.bounds
    outputs = {"y": root}
    if grad:
        with ctx:
            loss = (root * root).sum()
            outputs = {"loss": loss, "g": tl.grad(loss, w)}
    prog = ctx.compile(bounds={B: len(p["lengths"]), S: lv.steps, K: lv.width},
                       outputs=outputs, config=tl.CompileConfig(executor=executor))
    return prog


def test_treelstm_level_by_level_equals_numpy(executor):
    from benchmarks.autobatch import treelstm_numpy, treelstm_problem

    p = treelstm_problem(9, 7, 8, seed=2)
    prog = treelstm(p, executor)
    np.testing.assert_allclose(prog.run()["y"], treelstm_numpy(p), rtol=1e-4, atol=1e-5)
    if executor == "xla":  # the slots of a step batched: no loop over k
        assert "i_k" not in prog.executable.source


@pytest.mark.executors(("xla", "codegen", "reference"), reason="for time: the interpreter runs "
                        "codegen's kernels")
def test_gradient_through_trees_level_by_level_matches_jax_grad(executor):
    from benchmarks.autobatch import treelstm_numpy, treelstm_problem

    p = treelstm_problem(5, 5, 4, seed=4)
    run = treelstm(p, executor, grad=True).run()

    def loss_jax(W):
        return (treelstm_numpy(p, jnp, W) ** 2).sum()
    np.testing.assert_allclose(run["loss"].sum(), loss_jax(p["w"]), rtol=1e-5)
    np.testing.assert_allclose(run["g"], jax.grad(loss_jax)(jnp.asarray(p["w"])), rtol=1e-4,
                               atol=1e-6)
