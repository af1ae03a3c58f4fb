"""A tiny sequence model trained end to end as one recurrent program over (iteration i, step t):
random inputs per iteration, an RNN, a delay-line target, BPTT through the recurrence over t and
Adam over i. The loss must fall by a stated factor within a fixed budget."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from tempo_lab.examples import DelayLine

ITERS, STEPS = 200, 8
FACTOR = 10  # mean loss of the first 10 iterations / of the last 10 (measured: about 19)


def test_rnn_learns_a_delay_line_and_matches_plain_jax():
    model = DelayLine()
    ctx, loss, x = model.program()
    NI, NT = ctx.bounds
    res = ctx.compile(bounds={NI: ITERS, NT: STEPS}, outputs={"loss": loss, "x": x}).run()
    curve = res["loss"]
    assert curve.shape == (ITERS,) and np.isfinite(curve).all()
    assert curve[:10].mean() / curve[-10:].mean() > FACTOR, (curve[:10], curve[-10:])
    # the same training in plain JAX (jax.grad, Adam by hand) on the same inputs
    want = np.asarray(model.jax_train()(jnp.asarray(res["x"])))
    np.testing.assert_allclose(curve, want, rtol=2e-3, atol=1e-5)
