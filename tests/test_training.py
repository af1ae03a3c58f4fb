"""A tiny sequence model trained end to end as one recurrent program over (iteration i, step t):
random inputs per iteration, an RNN, a delay-line target, BPTT through the recurrence over t and
Adam over i. The loss must fall by a stated factor within a fixed budget."""
from __future__ import annotations

import numpy as np

import tempo_lab as tl

HIDDEN, ITERS, STEPS = 16, 200, 8
FACTOR = 10  # mean loss of the first 10 iterations / of the last 10 (measured: about 19)


def delay_line_program():
    rng = np.random.default_rng(0)
    ctx = tl.Context(dims=("i", "t"))
    i, t = ctx.dims
    _, T = ctx.bounds
    with ctx:
        p = tl.optim.parameters({"wx": rng.normal(size=(1, HIDDEN)) * 0.5,
                                 "wh": rng.normal(size=(HIDDEN, HIDDEN)) * 0.2,
                                 "wo": rng.normal(size=(HIDDEN, 1)) * 0.2}, dim=i)
        x = tl.random.normal((1,), domain=(i, t), seed=0)
        h = tl.placeholder((HIDDEN,), domain=(i, t))
        h[i, 0] = tl.tanh(x @ p["wx"])
        h[i, t] = tl.tanh(x @ p["wx"] + h[i, t - 1] @ p["wh"])
        y = tl.placeholder((1,), domain=(i, t))  # target: the previous step's input
        y[i, 0] = tl.zeros((1,))
        y[i, t] = x[i, t - 1]
        loss = ((h @ p["wo"] - y) ** 2).mean()
        tl.optim.Adam(lr=0.02).minimize(loss, p)
        per_iteration = loss[i, 0:T].mean(axis=0)
    return ctx, per_iteration


def test_rnn_learns_a_delay_line():
    ctx, loss = delay_line_program()
    NI, NT = ctx.bounds
    curve = ctx.compile(bounds={NI: ITERS, NT: STEPS}, outputs={"loss": loss}).run()["loss"]
    assert curve.shape == (ITERS,) and np.isfinite(curve).all()
    assert curve[:10].mean() / curve[-10:].mean() > FACTOR, (curve[:10], curve[-10:])
