"""Search over ops by tokens (widgets/search.py and search.js): whole words or name prefixes
that do not split a number, kind:, scope:, line:, /regex/, ranked; names from the source in
every view; constants out of the picker and the loop code unless asked for."""
import inspect
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import tempo_lab as tl
from tempo_lab.widgets import graph as G
from tempo_lab.widgets import search as S
from tempo_lab.widgets.inspector import facts_html, op_facts, op_links
from tempo_lab.widgets.schedule_view import code_lines
from tempo_lab.widgets.sdg_view import op_options

LAYERS, D, HEADS = 16, 16, 2


def rms_norm(x, w):
    return x / tl.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6) * w


def decoder():
    """A Llama-style decoder written as a user would: one tl.scope per layer, tl.nn.rope,
    tl.nn.attention and tl.nn.silu, the user's own rms_norm."""
    rng = np.random.default_rng(0)
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    dh = D // HEADS
    with ctx:
        h = tl.from_array(rng.normal(size=(6, D)).astype(np.float32), domain=(t,))
        for layer in range(LAYERS):
            with tl.scope(f"layer{layer}"):
                w = {k: rng.normal(size=(D, D)).astype(np.float32) * 0.3
                     for k in ("wq", "wk", "wv", "wo", "w1", "w2", "w3")}
                g = rng.uniform(0.5, 1.5, size=D).astype(np.float32)
                x = rms_norm(h, g)
                q = tl.nn.rope((x @ w["wq"]).reshape(HEADS, dh), t)
                k = tl.nn.rope((x @ w["wk"]).reshape(HEADS, dh), t)
                v = (x @ w["wv"]).reshape(HEADS, dh)
                att = tl.nn.attention(q, k, v, t)
                h = h + att.reshape(D) @ w["wo"]
                x = rms_norm(h, g)
                h = h + (tl.nn.silu(x @ w["w1"]) * (x @ w["w3"])) @ w["w2"]
        logits = rms_norm(h, np.ones(D, np.float32))
    return ctx.compile(bounds={T: 6}, outputs={"logits": logits})


ATT_LINE = inspect.getsourcelines(decoder)[1] + [
    k for k, line in enumerate(inspect.getsource(decoder).splitlines())
    if line.strip().startswith("att = ")][0]


@pytest.fixture(scope="module")
def prog():
    return decoder()


def _scopes(sdg, i):
    op = sdg.ops[i]
    return {s for s in op.scope} | {s for o in S.body_ops(op) for s in o.scope}


def test_words_are_whole_tokens_or_prefixes_that_do_not_split_numbers():
    assert S.word_matches("layer1", "layer1") == 2
    assert S.word_matches("layer1", "layer10") == 0
    assert S.word_matches("layer", "layer10") == 1
    assert S.word_matches("att", "attention") == 1
    assert S.word_matches("%93", "%934") == 0
    assert S.tokens("layer1_norm") == ["layer1_norm", "layer1", "norm"]


@pytest.mark.parametrize("sdg_of", [lambda p: p.sdg, lambda p: p.passes.initial],
                         ids=["compiled", "traced"])
def test_search_finds_what_users_type(prog, sdg_of):
    sdg = sdg_of(prog)
    hits = G.matches(sdg, "layer1")
    assert hits and all("layer1" in _scopes(sdg, i) for i in hits)
    assert not any(s.startswith("layer1") and s != "layer1" for i in hits
                   for s in _scopes(sdg, i))
    soft = G.matches(sdg, "kind:softmax scope:layer11")
    assert len(soft) == 1 and sdg.ops[soft[0]].kind in ("softmax", "fused")
    assert "softmax" in [sdg.ops[soft[0]].kind] + S.body_kinds(sdg.ops[soft[0]])
    assert G.matches(sdg, "KIND:Softmax  Scope:LAYER11") == soft
    for word in ("rope", "attention", "silu"):
        assert any(word in _scopes(sdg, i) for i in G.matches(sdg, word)), word
    for name in ("q", "att"):       # the user's variables: an exact name first
        first = G.matches(sdg, name)[0]
        assert name in S.op_names(sdg.ops[first]), name
    line = G.matches(sdg, f"line:{ATT_LINE}")
    assert line and sdg.ops[line[0]].loc.line == ATT_LINE
    assert all(ATT_LINE == sdg.ops[i].loc.line
               or ATT_LINE in [n for _, n, _ in sdg.ops[i].loc.stack] for i in line)
    assert G.matches(sdg, "/^q · %/") == [i for i in G.matches(sdg, "/^q · %/")
                                          if S.op_title(sdg.ops[i]).startswith("q · ")]
    assert G.matches(sdg, "layer1 no-such-thing") == []
    assert G.matches(sdg, f"%{line[0]}") == [line[0]]


def test_names_in_labels_inspector_picker_and_code(prog):
    sdg = prog.sdg
    q = G.matches(sdg, "name:q")[0]
    assert S.op_title(sdg.ops[q]) == f"q · %{q}"
    spec = G.graph_spec(sdg, highlight=q)
    assert any(n.label.startswith(f"q · %{q} ") for n in spec.nodes)
    facts = op_facts(sdg, q)
    assert facts["op"].startswith(f"q · %{q} (")
    assert "test_search.py:" in facts["source"] and "/" not in facts["source"].split(":")[0]
    links = op_links(sdg, q)
    page = facts_html(facts, links)
    for i, _ in links["reads"] + links["read by"]:
        assert f'class="tl-op-link" data-op="{i}"' in page
    consts = {i for i, op in sdg.ops.items() if op.kind in S.INLINE_KINDS}
    assert consts
    assert not consts & {v for _, v in op_options(sdg)}
    assert consts <= {v for _, v in op_options(sdg, constants=True)}
    lines = code_lines(prog.schedule)
    shown = set().union(*(ops for _, ops in lines))
    assert not shown & consts
    assert consts & set().union(*(ops for _, ops in code_lines(prog.schedule, True)))
    assert any(f"q·%{q}" in line for line, _ in lines)


def test_ppo_search_finds_the_optimiser_and_the_clip():
    cfg = tl.rl.PPOConfig(hidden=4, update_epochs=1, num_minibatches=1)
    ctx = tl.Context(dims=cfg.DIMS)
    tr = tl.rl.ppo(ctx, tl.rl.CartPole(), cfg)
    prog = ctx.compile(bounds=cfg.bounds(ctx, 2, 2, 4), outputs={"return": tr.episode_return})
    for sdg in (prog.passes.initial, prog.sdg):
        for word in ("adam", "clip", "permutation"):
            hits = G.matches(sdg, word)
            assert hits and any(word in _scopes(sdg, i) for i in hits), word


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_browser_search_agrees_with_python(prog, tmp_path):
    rows = G.search_rows(prog.sdg)
    queries = ["layer1", "layer", "kind:softmax scope:layer11", "rope", "att", "q", "silu",
               f"line:{ATT_LINE}", "/^q · %/", "%5", "name:h layer3", "matmul layer2",
               "(t)", "no-such-thing", "/[/", "scope:layer1 kind:matmul"]
    script = (Path(S.__file__).with_name("search.js").read_text(encoding="utf-8")
              + "\nconst rows = JSON.parse(require('fs').readFileSync(process.argv[2], 'utf8'));"
              "\nconst qs = JSON.parse(process.argv[3]);"
              "\nconsole.log(JSON.stringify(qs.map((q) => tlSearch(rows, q).map((h) => h[2]))));")
    (tmp_path / "rows.json").write_text(json.dumps(rows), encoding="utf-8")
    (tmp_path / "s.js").write_text(script, encoding="utf-8")
    out = subprocess.run(["node", str(tmp_path / "s.js"), str(tmp_path / "rows.json"),
                          json.dumps(queries)], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    for q, js in zip(queries, json.loads(out)):
        assert js == S.search(rows, q), q


def test_inspector_links_select_the_op_in_the_canvas(prog, tmp_path):
    """In the browser: the canvas module (search.js + graph_canvas.js) on a page with an
    inspector beside it, as in an SDG view: a click on a reader's link selects that op in the
    canvas, and the search box finds a user's variable. A stand-in model, as the export
    uses; skipped without chromium or Playwright."""
    import os

    chromium = os.environ.get("TEMPO_LAB_CHROMIUM", "/usr/bin/chromium")
    if not os.path.exists(chromium):
        pytest.skip("needs chromium")
    sync_api = pytest.importorskip("playwright.sync_api")
    from tempo_lab.widgets.canvas import CSS, ESM

    sdg = prog.sdg
    q = G.matches(sdg, "name:q")[0]
    links = op_links(sdg, q)
    paths = G.group_paths(sdg)
    shown = [q] + [i for i, _ in links["read by"]]
    opened = G.default_expanded(sdg) | {paths[i][:j + 1] for i in shown
                                        for j in range(len(paths[i]))}
    svg = G.svg_of(G.to_dot(G.graph_spec(sdg, expanded=opened)))
    if svg is None:
        pytest.skip("needs graphviz's dot")
    target = next(i for i, _ in links["read by"] if f'id="op{i}"' in svg)
    data = json.dumps({"svg": svg, "selected": -1, "index": G.search_rows(sdg), "query": "",
                       "view": [], "height": 500}).replace("</", "<\\/")
    model = ("const data = " + data + "; const handlers = {};"
             "const model = {get: (k) => data[k], set: (k, v) => { data[k] = v; "
             "(handlers['change:' + k] || []).forEach((f) => f()); }, save_changes() {}, "
             "send() {}, on: (e, f) => { (handlers[e] = handlers[e] || []).push(f); }};")
    page = (f"<html><head><meta charset='utf-8'><style>{CSS}</style></head><body>"
            f"<div class='tempo-lab-sdg'><div id='c'></div>"
            f"{facts_html(op_facts(sdg, q), links)}</div>"
            f"<script type='module'>{ESM}\n{model}"
            f"render({{model, el: document.getElementById('c')}});</script></body></html>")
    path = tmp_path / "page.html"
    path.write_text(page, encoding="utf-8")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True,
                                     args=["--no-sandbox", "--disable-gpu",
                                           "--disable-dev-shm-usage"])
        try:
            pg = browser.new_page(viewport={"width": 1200, "height": 900})
            errors = []
            pg.on("pageerror", lambda e: errors.append(str(e)))
            pg.goto(path.as_uri())
            pg.wait_for_selector("#c svg")
            pg.click(f'a.tl-op-link[data-op="{target}"]')
            pg.wait_for_function(f"document.querySelector('#c').dataset.selected === "
                                 f"'{target}'", timeout=10_000)
            assert pg.locator(f'#c g.node[id="op{target}"].tl-selected').count() == 1
            pg.fill(".tl-graph-search", "q")
            first = pg.locator(".tl-graph-hit").first
            assert first.get_attribute("data-op") == str(G.matches(sdg, "q")[0])
            assert first.text_content().startswith("q · %")
            assert not errors, errors
        finally:
            browser.close()
