"""tl.save / tl.load: stage objects back from their JSON, equal to what was saved (every index
expression and condition parsed back from its text), explorable without the program's code,
and clear errors for files that are not such JSON."""
from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tempo_lab as tl
from tempo_lab.saved import cond_from_str, expr_from_str, index_from_str

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/ is not a package

from budget import examples  # noqa: E402
from randprog import compile_program, program_strategy  # noqa: E402


def _decoder(layers=2, window=None):
    from tempo_lab.demo import make_weights
    from tempo_lab.examples import unrolled_decoder

    ctx = tl.Context(dims=("t",))
    tokens = np.random.default_rng(1).standard_normal((6, 16)).astype(np.float32)
    h = unrolled_decoder(ctx, make_weights(layers, 16, 32), tokens, heads=2, window=window)
    return ctx.compile(bounds={ctx.bounds[0]: 6}, outputs={"y": h})


def _same(prog, back):
    assert back.sdg.to_dict() == prog.sdg.to_dict()
    assert back.passes.to_dict() == prog.passes.to_dict()
    assert back.memory.to_dict() == prog.memory.to_dict()
    assert back.schedule.code() == prog.schedule.code()
    assert repr(back) == repr(prog) and repr(back.schedule) == repr(prog.schedule)


def test_program_round_trip(tmp_path):
    prog = _decoder(window=3)
    path = tl.save(prog, tmp_path / "prog.json")
    back = tl.load(path)
    _same(prog, back)
    assert "cannot run" in back.pretty()
    assert tl.load(prog.sdg.to_dict()).to_dict() == prog.sdg.to_dict()   # a dict works too
    assert repr(tl.load(prog.passes.to_dict())) == repr(prog.passes)
    with pytest.raises(tl.ArgumentError, match="test_saved.py.*compile it from its code"):
        back.run()


def test_a_program_whose_passes_made_dims_round_trips():
    """A pass that makes a dim (the prefix split of the first steps here; tiling and
    incrementalisation too) records it as an event with no op: saved as null, it loads back
    (it was written as -1, which the file's schema refuses)."""
    ctx = tl.Context(dims=("b", "t"))
    (b, t), (B, T) = ctx.dims, ctx.bounds
    with ctx:
        v = tl.placeholder((), "float32", domain=(b, t))
        v[b, t + 2] = v * 0.5 + 0.25
        v[t < 2] = 0.0
        tl.sink(v, lambda p, x: None)
    prog = ctx.compile(bounds={B: 1, T: 3}, outputs={"v": v},
                       config=tl.CompileConfig(executor="codegen"))
    made = [e for r in prog.passes.records for e in r.events if e.kind == "dim"]
    assert made and all(e.op == -1 for e in made)
    back = tl.load(json.loads(json.dumps(prog.to_dict())))
    _same(prog, back)
    assert [e for r in back.passes.records for e in r.events if e.kind == "dim"] == made


@settings(max_examples=15, deadline=None, derandomize=True, database=None)
@given(program_strategy())
def test_random_programs_round_trip(program):
    """Every feature the random programs draw (until, gradients, dim conditions, ragged
    bounds, windows) survives the JSON: the SDG's edges parse back to the same expressions."""
    prog = compile_program(program, {}, config=tl.CompileConfig(executor="interpreter"))
    back = tl.load(json.loads(json.dumps(prog.to_dict())))
    _same(prog, back)
    for e0, e1 in zip(prog.sdg.edges, back.sdg.edges):
        assert e0.index == e1.index and e0.cond == e1.cond


@pytest.mark.parametrize("text", ["t - 1", "min(T - 1, t)", "max(0, t - 2)", "2*(t // 4)",
                                  "t % 3", "T - t - 1", "-t + 5"])
def test_expressions_parse_back(text):
    assert str(expr_from_str(text)) == str(expr_from_str(str(expr_from_str(text))))


def test_ranges_and_conditions_parse_back():
    t = tl.Dim("t")
    assert index_from_str("max(0, t - 2):t + 1") == tl.Slice(tl.max(0, t - 2), t + 1)
    for text in ("t == 0", "t != 0", "t >= 1 & t < T - 1", "(t >= 1 & t < T) | t == 0",
                 "~(t >= -1 & t < T - 1)", "true", "false"):
        c = cond_from_str(text)
        assert cond_from_str(str(c)) == c


def test_bad_files_are_clear_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(tl.ArgumentError, match="test_saved.py.*cannot read it as JSON"):
        tl.load(bad)
    with pytest.raises(tl.ArgumentError, match="memory plan loads as part of its program"):
        tl.load(_decoder(1).memory.to_dict())
    broken = _decoder(1).sdg.to_dict()
    broken["edges"][0]["index"] = ["t +* 1"]
    with pytest.raises(tl.ArgumentError, match="not what to_dict"):
        tl.load(broken)
    with pytest.raises(tl.ArgumentError, match="tl.save needs a stage"):
        tl.save(42, tmp_path / "x.json")


def test_loaded_program_explores_without_its_code(tmp_path):
    pytest.importorskip("ipywidgets")
    prog = _decoder(layers=4)
    back = tl.load(tl.save(prog, tmp_path / "prog.json"))
    dash = back.explore().dashboard
    for name in ("SDG", "Passes", "Schedule", "Memory", "Profile"):
        assert dash.open(name) is not None
    assert "layer0…layer3 ×4" in dash.sdg.spec().titles.values()  # alike layers fold
    dash.sdg.fold.value = False
    assert {p[0] for p in dash.sdg.spec().groups.values()} >= {"layer0", "layer3"}
    assert "cannot run" in dash.views["Profile"].widget.children[0].value
    out = dash.export(tmp_path / "saved.html")
    assert "layer3" in out.read_text()


def test_tampered_and_hostile_files_are_located_errors(tmp_path):
    """Everything read from a file is validated: a schema version it does not know, JSON
    nested deeper than Python recurses, an index expression of 50 000 terms, ``t // t``, a
    count of 10^300 bytes: each an ArgumentError at this line naming the file."""
    prog = _decoder(1)
    path = tmp_path / "p.json"

    def load_edited(edit, *words):
        data = prog.to_dict()
        edit(data)
        path.write_text(json.dumps(data))
        with pytest.raises(tl.ArgumentError) as e:
            tl.load(path)
        assert str(e.value).startswith(f"{__file__}:") and "p.json" in str(e.value), e.value
        for w in words:
            assert w in str(e.value), (w, str(e.value))

    load_edited(lambda d: d.update(schema="tempo_lab.program/999"), "999", "reads")
    load_edited(lambda d: d["sdg"]["edges"][0].update(index=[" + ".join(["t"] * 50_000)]),
                "characters")
    load_edited(lambda d: d["sdg"]["edges"][0].update(index=["t // t"]), "positive constant")
    load_edited(lambda d: d["memory"].update(peak_bytes=10**300), "peak_bytes")
    load_edited(lambda d: d["bounds"].update(T=-4), "bounds.T")
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(tl.ArgumentError, match="nested too deeply"):
        tl.load(path)



def test_paths_that_no_file_system_takes_are_located_errors(tmp_path):
    """A NUL byte in the path once raised Python's bare ``ValueError`` from ``tl.save``."""
    prog = _decoder(1)
    for call in (lambda: tl.save(prog, str(tmp_path / "a\0b.json")),
                 lambda: tl.save(prog, b"p.json"),
                 lambda: tl.load(str(tmp_path / "a\0b.json"))):
        with pytest.raises(tl.ArgumentError) as e:
            call()
        assert str(e.value).startswith(f"{__file__}:"), e.value
        assert "NUL byte" in str(e.value) or "bytes" in str(e.value), e.value


def test_the_json_reader_bounds_what_it_reads(tmp_path):
    """``tl.load`` reads through the package's guarded JSON reader: an integer of 5 000
    digits, a key given twice (once read as its last value), nesting past 100 levels and a
    file that is not an object are each named."""
    path = tmp_path / "p.json"
    good = json.dumps(_decoder(1).to_dict())
    for text, why in ((good[:-1] + ', "deep": ' + "[" * 100 + "]" * 100 + "}", "101 levels"),
                      (good[:-1] + ', "big": 1' + "0" * 5000 + "}", "5001 digits"),
                      (good[:-1] + ', "schema": "tempo_lab.program/1"}', "'schema' twice"),
                      ("[" + good + "]", "JSON array where a JSON object")):
        path.write_text(text)
        with pytest.raises(tl.ArgumentError) as e:
            tl.load(path)
        assert str(e.value).startswith(f"{__file__}:") and "p.json" in str(e.value), e.value
        assert why in str(e.value), (why, str(e.value))


# -- a saved file edited anywhere: it loads and prints, or it is a located error --------------
HOSTILE = [None, -1, 0, 10**300, 1.5, float("nan"), "", "t // t", "<script>", "9" * 5000,
           [], {}, [[[]]], True, "T", "tempo_lab.program/1", "bfloat16"]


@functools.cache
def _saved() -> tuple[dict, list[tuple]]:
    """A small program's ``to_dict()`` and the path of every field in it (of a list, its first
    item: each kind of field is drawn as often as another), made once."""
    data = _decoder(1, window=3).to_dict()

    def paths(x, at=()):
        if at:
            yield at
        items = x.items() if isinstance(x, dict) else \
            enumerate(x[:1]) if isinstance(x, list) else ()
        for k, v in items:
            yield from paths(v, at + (k,))
    return data, list(paths(data))


def _use(stage) -> None:
    """What a user does with a loaded stage: print it, show it, save it again."""
    for s in (stage, *(getattr(stage, n, None) for n in ("sdg", "passes", "schedule",
                                                         "memory"))):
        if s is not None:
            repr(s), s.pretty(), s._repr_html_(), json.dumps(s.to_dict())


@settings(max_examples=examples(180), deadline=None, derandomize=True, database=None)
@given(st.data())
def test_a_file_edited_anywhere_loads_and_prints_or_is_a_located_error(tmp_path_factory, data):
    """Any field of a saved program replaced by a hostile value (or removed), or the file cut
    short anywhere: ``tl.load`` either gives a stage that prints, shows and saves again, or an
    ArgumentError located at the caller that names the file. Never another exception."""
    import copy

    saved, paths = _saved()
    edited = copy.deepcopy(saved)
    where = data.draw(st.sampled_from(paths), label="field")
    parent = edited
    for k in where[:-1]:
        parent = parent[k]
    if isinstance(parent, dict) and data.draw(st.booleans(), label="remove"):
        del parent[where[-1]]
    else:
        parent[where[-1]] = data.draw(st.sampled_from(HOSTILE), label="value")
    text = json.dumps(edited)
    if data.draw(st.booleans(), label="cut short"):
        text = text[:data.draw(st.integers(0, len(text) - 1), label="length")]
    path = tmp_path_factory.mktemp("edited") / "p.json"
    path.write_text(text)
    line = sys._getframe().f_lineno + 2
    try:
        stage = tl.load(path)
    except tl.ArgumentError as err:
        assert str(err).startswith(f"{__file__}:{line}:") and "p.json" in str(err), err
    else:
        _use(stage)
