"""Payload tests of the notebook views (no browser)."""
import pytest

import tempo_lab as tl

W = pytest.importorskip("ipywidgets")


def _prog():
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.placeholder((), "float32", domain=(t,), name="x")
        x[0] = 1.0
        x[t] = x[t - 1] * 0.5
        y = x[0:t + 1].sum(axis=0)
    return ctx.compile(bounds={T: 4}, outputs={"y": y})


def test_sdg_view_has_picture_and_sections():
    from widgets import svg_of

    prog = _prog()
    view = prog.sdg.explore()
    assert isinstance(view, W.VBox)
    htmls = [c.value for c in view.children]
    assert any("SDG(ops=" in h for h in htmls)
    if svg_of("digraph { a -> b }") is not None:
        assert htmls[0].count("<svg") == 1 and "if t != 0" in htmls[0]


def test_view_without_dot_program(monkeypatch):
    import graphviz

    def missing(*a, **k):
        raise graphviz.ExecutableNotFound(("dot",))

    monkeypatch.setattr(graphviz.Source, "pipe", missing)
    view = _prog().sdg.explore()
    assert "not installed" in view.children[0].value
    assert "SDG(ops=" in view.children[1].value


def test_every_stage_explores():
    prog = _prog()
    for stage in (prog, prog.trace, prog.run()):
        view = stage.explore()
        assert repr(stage).split("(")[0] in view.children[-1].value
