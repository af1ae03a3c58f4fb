"""The dashboard in a real browser: JupyterLab on loopback (random port, token), headless
Chromium driven by Playwright, a notebook that runs ``prog.explore()`` on the demo decoder.
Each tab must render its content (DOM checks); screenshots go to ``screenshots/`` (ignored), or
to the folder ``TEMPO_LAB_SHOTS`` names.

Chromium is the system one (``/usr/bin/chromium``, installed by ``.ci/run``); Playwright never
downloads a browser here. Without chromium or Playwright the test skips, except under
``CI=true``, where it fails."""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHOTS = Path(os.environ.get("TEMPO_LAB_SHOTS") or ROOT / "screenshots")
CHROMIUM = os.environ.get("TEMPO_LAB_CHROMIUM", "/usr/bin/chromium")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
TABS = ("Program", "SDG", "Passes", "Schedule", "Memory", "Profile")

SETUP = """\
import os
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import numpy as np
import tempo_lab as tl
from tempo_lab.demo import decoder, make_weights
tl.config.progress = False
ctx = tl.Context(dims=("n", "t"))
n, t = ctx.dims
N, T = ctx.bounds
tokens = np.random.default_rng(1).standard_normal((8, 16)).astype(np.float32)
h_out = decoder(ctx, make_weights(2, 16, 32), tokens, heads=2)
with ctx:
    y = h_out[N - 1, t]
prog = ctx.compile(bounds={N: 2, T: 8}, outputs={"y": y})
print("compiled", prog)
"""

# A 16-layer decoder written layer by layer (one tl.scope per layer): 673 traced ops, 307
# after the passes.
BIG = """\
from tempo_lab.examples import unrolled_decoder
big_ctx = tl.Context(dims=("t",))
big_h = unrolled_decoder(big_ctx, make_weights(16, 16, 32), tokens, heads=2)
big = big_ctx.compile(bounds={big_ctx.bounds[0]: 8}, outputs={"y": big_h})
print("compiled", big, len(big.passes.initial.ops))
"""


def _need(what: str, ok: bool):
    if not ok:
        (pytest.fail if IN_CI else pytest.skip)(f"browser test needs {what}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# PPO as one program over (i, e, m, s, b, t): 352 traced ops, grouped by tl.rl.ppo's scopes.
PPO = """\
ppo_config = tl.rl.PPOConfig(hidden=16, update_epochs=2, num_minibatches=2)
ppo_ctx = tl.Context(dims=ppo_config.DIMS)
trained = tl.rl.ppo(ppo_ctx, tl.rl.CartPole(), ppo_config)
ppo = ppo_ctx.compile(bounds=ppo_config.bounds(ppo_ctx, 2, 4, 16),
                      outputs={"return": trained.episode_return, "loss": trained.loss})
print("compiled", ppo, len(ppo.passes.initial.ops))
"""


LLAMA_SETUP = """\
import os
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import numpy as np
import tempo_lab as tl
tl.config.progress = False
"""

# A Llama-style decoder written layer by layer (one tl.scope per layer, tl.nn.rope,
# tl.nn.attention, tl.nn.silu, the user's own rms_norm): 473 ops after the passes.
LLAMA = """\
def llama_decoder(layers=16, d=16, heads=2):
    rng = np.random.default_rng(0)
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    dh = d // heads

    def rms_norm(x, w):
        return x / tl.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6) * w

    with ctx:
        h = tl.from_array(rng.normal(size=(6, d)).astype(np.float32), domain=(t,))
        for layer in range(layers):
            with tl.scope(f"layer{layer}"):
                w = {k: rng.normal(size=(d, d)).astype(np.float32) * 0.3
                     for k in ("wq", "wk", "wv", "wo", "w1", "w2", "w3")}
                g = rng.uniform(0.5, 1.5, size=d).astype(np.float32)
                x = rms_norm(h, g)
                q = tl.nn.rope((x @ w["wq"]).reshape(heads, dh), t)
                k = tl.nn.rope((x @ w["wk"]).reshape(heads, dh), t)
                v = (x @ w["wv"]).reshape(heads, dh)
                att = tl.nn.attention(q, k, v, t)
                h = h + att.reshape(d) @ w["wo"]
                x = rms_norm(h, g)
                h = h + (tl.nn.silu(x @ w["w1"]) * (x @ w["w3"])) @ w["w2"]
        logits = rms_norm(h, np.ones(d, np.float32))
    return ctx.compile(bounds={T: 6}, outputs={"logits": logits})


llama = llama_decoder()
print("compiled", llama, len(llama.sdg.ops))
llama.explore()"""

# A dashboard opened with the time explore() took printed above it (test_explore_is_quick).
EXPLORE = """\
import time
start = time.perf_counter()
{0}_view = {0}.explore()
print(f"explore() took {{time.perf_counter() - start:.2f}} s")
{0}_view"""

# One browser and one JupyterLab for the module, on one xdist worker.
pytestmark = pytest.mark.xdist_group("browser")


def _open_and_run(page, name: str):
    """Open notebook ``name``, run all its cells once its kernel is idle, and wait for its
    dashboard: ``(panel, dashboard)``."""
    page.evaluate("() => { window.jupyterapp.commands.execute('docmanager:open', "
                  f"{{path: '{name}'}}); }}")
    page.wait_for_function(
        "() => { const w = window.jupyterapp.shell.currentWidget; "
        f"const k = w && w.context && w.context.path === '{name}' && "
        "w.sessionContext.session && w.sessionContext.session.kernel; "
        "return !!k && k.status === 'idle'; }", timeout=120_000)
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    panel = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)").last
    dash = panel.locator(".tempo-lab-dashboard")
    _wait(dash, 240_000)
    return panel, dash.first


def _notebook(path: Path, cells=None):
    cells = cells or [SETUP, "view = prog.explore()\nview", BIG, EXPLORE.format("big"), PPO,
                      EXPLORE.format("ppo")]
    nb = {"nbformat": 4, "nbformat_minor": 5,
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                      "language": "python"}},
          "cells": [{"cell_type": "code", "id": f"c{k}", "metadata": {}, "source": src,
                     "outputs": [], "execution_count": None} for k, src in enumerate(cells)]}
    path.write_text(json.dumps(nb))


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server of our own; yields its base URL and token, stops it afterwards."""
    _need("JupyterLab", shutil.which("jupyter-lab") is not None or
          subprocess.run([sys.executable, "-c", "import jupyterlab"]).returncode == 0)
    home = tmp_path_factory.mktemp("lab")
    _notebook(home / "explore.ipynb")
    news = home / ".settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True)   # no "get notified about Jupyter news?" toast over screenshots
    (news / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT),
           "JUPYTER_CONFIG_DIR": str(home / ".jupyter"),
           "JUPYTERLAB_SETTINGS_DIR": str(home / ".settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(home / ".workspaces")}
    log = open(home / "lab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", "--ServerApp.port_retries=0", "--allow-root",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={home}",
         "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        cwd=home, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    pytest.fail("JupyterLab did not start:\n" + (home / "lab.log").read_text())
                time.sleep(0.5)
        yield url, token, home
    finally:
        _stop(proc)
        log.close()


def _stop(proc: subprocess.Popen):
    """End the server we started and the kernels it started (its own process group)."""
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture(scope="module")
def page(lab):
    _need(f"chromium at {CHROMIUM}", os.path.exists(CHROMIUM))
    try:
        from playwright.sync_api import TimeoutError as PlaywrightTimeout
        from playwright.sync_api import sync_playwright
    except ImportError:
        _need("the playwright package (pip install playwright)", False)
    url, token, _ = lab
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox", "--disable-gpu",
                                           "--disable-dev-shm-usage"])
        try:
            pg = browser.new_page(viewport={"width": 1400, "height": 1000})
            pg.tl_errors = []     # uncaught errors in the page (test_no_page_errors)
            pg.on("pageerror", lambda e: pg.tl_errors.append(str(e)))
            pg.set_default_timeout(30_000)
            pg.goto(f"{url}/lab/tree/explore.ipynb?token={token}&reset",
                    wait_until="domcontentloaded", timeout=60_000)
            pg.wait_for_function("window.jupyterapp && document.querySelector("
                                 "'.jp-NotebookPanel .jp-Cell')", timeout=60_000)
            pg.wait_for_selector(".jp-NotebookPanel [data-status='idle'], "
                                 ".jp-Notebook-ExecutionIndicator[data-status='idle']",
                                 timeout=60_000, state="attached")
            try:  # a fresh profile may ask which kernel to start
                pg.wait_for_selector(".jp-Dialog .jp-mod-accept", timeout=5_000).click()
            except PlaywrightTimeout:
                pass
            # not awaited: the command's promise settles only when every cell has run
            pg.evaluate("() => { window.jupyterapp.commands.execute("
                        "'notebook:run-all-cells'); }")
            pg.wait_for_function("document.querySelectorAll('.tempo-lab-tabs').length >= 3",
                                 timeout=240_000)
            yield pg
        finally:
            browser.close()


def _dash(page, k: int = 0):
    """The k-th dashboard of the notebook: 0 the demo decoder, 1 the 16-layer one, 2 PPO."""
    return page.locator(".tempo-lab-dashboard").nth(k)


def _tab(page, title: str, k: int = 0):
    bar = _dash(page, k).locator(".tempo-lab-tabs > .lm-TabBar .lm-TabBar-tab") \
        .filter(has_text=title)
    bar.first.click()
    page.wait_for_timeout(300)


def _shot(page, name: str, k: int = 0):
    SHOTS.mkdir(exist_ok=True)
    _dash(page, k).scroll_into_view_if_needed()
    _dash(page, k).screenshot(path=str(SHOTS / f"{name}.png"))


def _wait(loc, timeout=30_000):
    loc.first.wait_for(timeout=timeout)
    return loc


def _inspector_shows(dash, text: str) -> str:
    """The inspector's text once it shows ``text``: it follows a selection through the kernel,
    so a read right after the selection may find the op selected before it (the full suite
    once did)."""
    inspector = dash.locator(".tempo-lab-inspector")
    _wait(inspector.filter(has_text=text))
    return inspector.inner_text()


# Whether each chart on show under a locator drew its traces: a blank chart (empty axes, the
# failure FigureWidget had) holds no data and draws no trace group. Counts what is drawn, not
# containers.
DRAWN = """(els) => els.filter((el) => el.getClientRects().length).map((el) => {
  const gd = el.matches('.js-plotly-plot') ? el : el.querySelector('.js-plotly-plot');
  return !!gd && (gd.data || []).length > 0 && (gd._fullData || []).length > 0
         && gd.querySelectorAll('g.trace').length > 0; })"""


def _charts_drawn(loc, at_least: int = 1, timeout: float = 30.0) -> list[bool]:
    """Wait until every chart shown under ``loc`` (at least ``at_least``) has drawn."""
    deadline = time.monotonic() + timeout
    while True:
        drawn = loc.locator(".tl-plotly").evaluate_all(DRAWN)
        if (len(drawn) >= at_least and all(drawn)) or time.monotonic() > deadline:
            return drawn
        time.sleep(0.25)


def test_dashboard_tabs_render(page):
    dash = _dash(page)
    titles = dash.locator(".tempo-lab-tabs > .lm-TabBar .lm-TabBar-tab").all_inner_texts()
    assert [t.strip() for t in titles] == list(TABS)

    _tab(page, "Program")
    assert "Program(outputs=(y)" in dash.locator(".tempo-lab-overview").inner_text()
    _shot(page, "1_program")

    _tab(page, "SDG")
    nodes = _wait(dash.locator(".tempo-lab-sdg .tl-graph-view svg g.node"))
    assert nodes.count() >= 20
    assert dash.locator(".tempo-lab-sdg svg g.cluster").count() >= 2
    assert "0:t + 1" in dash.locator(".tempo-lab-sdg svg").first.text_content()
    _shot(page, "2_sdg")

    _tab(page, "Passes")
    assert _wait(dash.locator(".tempo-lab-pass-rows option")).count() >= 2
    assert _wait(dash.locator(".tempo-lab-passes svg g.node")).count() >= 2
    _shot(page, "3_passes")

    _tab(page, "Schedule")
    assert "for n in 0..N" in _wait(dash.locator(".tempo-lab-code")).first.inner_text()
    dash.locator(".tempo-lab-schedule .lm-TabBar-tab").filter(has_text="isl schedule tree") \
        .first.click()
    _wait(dash.locator(".tempo-lab-tree details"))
    dash.locator(".tempo-lab-schedule .lm-TabBar-tab").filter(has_text="iteration space") \
        .first.click()
    points = _wait(dash.locator(".tempo-lab-schedule .js-plotly-plot .scatterlayer .point"))
    assert points.count() > 50
    assert _charts_drawn(dash.locator(".tempo-lab-schedule")) == [True]
    _shot(page, "4_schedule")

    _tab(page, "Memory")
    bars = _wait(dash.locator(".tempo-lab-memory .js-plotly-plot .barlayer .point"))
    assert bars.count() >= 20
    assert "peak" in dash.locator(".tempo-lab-memory .js-plotly-plot").first.inner_text()
    assert _charts_drawn(dash.locator(".tempo-lab-memory")) == [True]
    _shot(page, "5_memory")

    _tab(page, "Profile")   # nothing has run yet: the tab offers to run and profile
    _wait(dash.locator(".tempo-lab-run-button")).first.click()
    _wait(dash.locator(".tempo-lab-profile .js-plotly-plot .barlayer .point"), 120_000)
    assert dash.locator(".tempo-lab-profile .js-plotly-plot").count() >= 3
    drawn = _charts_drawn(dash.locator(".tempo-lab-profile"), at_least=3)
    assert len(drawn) >= 3 and all(drawn), drawn
    assert dash.locator(".tempo-lab-profile .icicletrace, .tempo-lab-profile "
                        "g.iciclelayer path").count() >= 1
    _shot(page, "6_profile")


# Where a chart's title and its toolbar (plotly's modebar, shown while the pointer is over the
# chart) are, relative to the chart.
TITLE_AND_TOOLBAR = """(gd) => { const g = gd.getBoundingClientRect();
  const box = (e) => { const r = e.getBoundingClientRect();
    return [r.left - g.left, r.top - g.top, r.right - g.left, r.bottom - g.top]; };
  return { title: box(gd.querySelector('.g-gtitle')), bar: box(gd.querySelector('.modebar')),
           width: g.width }; }"""


def test_the_timeline_title_clears_the_toolbar(page):
    """The profile timeline's title is not under plotly's toolbar at 900, 1400 and 1800 px
    (at 900 px the chart is about 430 px wide and its title ran under the toolbar), and it
    fits in the chart."""
    dash = _dash(page)
    _tab(page, "Profile")
    if dash.locator(".tempo-lab-timeline .js-plotly-plot").count() == 0:
        _wait(dash.locator(".tempo-lab-run-button")).first.click()
    chart = _wait(dash.locator(".tempo-lab-timeline .js-plotly-plot"), 120_000).first
    try:
        for width in (900, 1400, 1800):
            page.set_viewport_size({"width": width, "height": 1000})
            page.wait_for_timeout(600)
            chart.scroll_into_view_if_needed()
            chart.hover(position={"x": 120, "y": 120})       # the toolbar shows
            page.wait_for_timeout(300)
            at = chart.evaluate(TITLE_AND_TOOLBAR)
            (tl, tt, tr, tb), (bl, bt, br, bb) = at["title"], at["bar"]
            assert bl < br and not (tl < br and bl < tr and tt < bb and bt < tb), (width, at)
            assert tl >= 0 and tr <= at["width"], (width, at)
            SHOTS.mkdir(exist_ok=True)
            chart.screenshot(path=str(SHOTS / f"27_timeline_title_{width}.png"))
    finally:
        page.set_viewport_size({"width": 1400, "height": 1000})


def test_selection_is_linked_across_tabs(page):
    dash = _dash(page)
    picker = dash.locator(".tempo-lab-op-picker select")
    label = next(o for o in picker.locator("option").all_inner_texts() if o.startswith("h_in"))
    picker.select_option(label=label)
    _tab(page, "SDG")
    marked = _wait(dash.locator(".tempo-lab-sdg svg g.node.tl-selected"))
    assert marked.count() == 1 and "h_in" in marked.text_content()
    assert "h_in" in _inspector_shows(dash, "h_in")
    _shot(page, "7_selected_sdg")
    _tab(page, "Schedule")
    dash.locator(".tempo-lab-schedule .lm-TabBar-tab").filter(has_text="loop code").first.click()
    line = dash.locator(".tempo-lab-code mark").first.inner_text()
    assert line.lstrip().startswith("h_in·%") and "[n, t] = merge" in line, line
    _tab(page, "Memory")
    _shot(page, "8_selected_memory")


SERIES = r"/^layer\d+…layer\d+ ×\d+/"     # a folded run's title


def _fold(page, dash, on: bool):
    """Tick or untick *fold repeats* (on by default where sibling groups repeat) and wait
    until the graph draws the layers as one box, or as their own boxes."""
    box = dash.locator(".tempo-lab-fold input[type=checkbox]").first
    if box.is_checked() != on:
        box.click()
    el = dash.locator(".tl-graph").first.element_handle()
    page.wait_for_function("([el, on]) => [...el.querySelectorAll('svg text')].some((t) => "
                           f"{SERIES}.test(t.textContent)) === on", arg=[el, on])


def test_graph_canvas_at_scale(page):
    """The 16-layer decoder: the SDG opens grouped by tl.scope; a click on a node selects it,
    a click on a group expands it, the buttons zoom, the search finds an op in a collapsed
    layer and the graph centres on it."""
    dash = _dash(page, 1)
    _tab(page, "SDG", 1)
    canvas = _wait(dash.locator(".tl-graph"))
    _fold(page, dash, False)
    nodes = _wait(canvas.locator(".tl-graph-view svg g.node"))
    assert 16 <= nodes.count() <= 160
    titles = canvas.locator("svg g.cluster text").all_text_contents() + \
        canvas.locator("svg g.node[id^='g'] text").all_text_contents()
    assert sum("layer" in t for t in titles) >= 16        # one group per layer
    _shot(page, "9_big_sdg", 1)

    el = canvas.first.element_handle()
    zoom = int(canvas.first.get_attribute("data-zoom"))
    canvas.locator(".tl-zoom-in").first.click()
    page.wait_for_function("([el, z]) => Number(el.dataset.zoom) > z", arg=[el, zoom])
    canvas.locator(".tl-fit").first.click()
    page.wait_for_function("([el, z]) => Number(el.dataset.zoom) == z", arg=[el, zoom])

    ops_before = canvas.locator("svg g.node[id^='op']").count()
    canvas.locator("svg g.node[id^='g']").first.click()  # expand a collapsed group
    page.wait_for_function("([el, n]) => el.querySelectorAll(\"svg g.node[id^='op']\")"
                           ".length > n", arg=[el, ops_before])

    node = canvas.locator(f"svg g.node[id='{_in_view(page, el, 'op')}']").first
    node.click()
    _wait(canvas.locator("svg g.node.tl-selected"))
    op = canvas.first.get_attribute("data-selected")
    assert op != "-1" and "source" in _inspector_shows(dash, "source")
    picked = dash.locator(".tempo-lab-op-picker select").input_value()   # the linked picker
    assert picked.split(" · ")[0] in node.locator("text").first.text_content()

    canvas.locator(".tl-graph-search").first.fill("layer11")
    hit = _wait(canvas.locator(".tl-graph-hit"))
    assert "layer11" in hit.first.inner_text()
    canvas.locator(".tl-graph-search").first.press("Enter")
    page.wait_for_function("([el, op]) => el.dataset.selected !== op", arg=[el, op])
    _wait(canvas.locator("svg g.node.tl-selected"))
    assert "layer11" in _inspector_shows(dash, "layer11")
    _shot(page, "10_big_sdg_found", 1)


def test_repeated_layers_fold_into_one_box(page):
    """*fold repeats* draws the sixteen alike layers as one box titled ``layer0…layer15 ×16``
    that fits its box, overlaps no other title and opens to one layer's inside; unticked,
    the sixteen boxes are back."""
    dash = _dash(page, 1)
    _tab(page, "SDG", 1)
    canvas = _wait(dash.locator(".tl-graph"))
    el = canvas.first.element_handle()
    _fold(page, dash, True)
    dash.locator(".tempo-lab-sdg button").filter(has_text="collapse all").first.click()
    page.wait_for_function("(el) => [...el.querySelectorAll(\"svg g.node[id^='g'] > text\")]"
                           f".some((t) => {SERIES}.test(t.textContent))", arg=el)
    canvas.locator(".tl-fit").first.click()
    page.wait_for_function("(el) => Number(el.dataset.scale) > 0", arg=el)
    page.wait_for_timeout(300)
    title = page.evaluate(f"""(el) => {{
      const t = [...el.querySelectorAll("svg g.node[id^='g'] > text:first-of-type, "
                                        + "svg g.cluster > text")]
        .find((t) => {SERIES}.test(t.textContent));
      const r = t.getBoundingClientRect(),
        b = t.parentElement.querySelector(':scope > path').getBoundingClientRect();
      return [t.textContent, r.height > 0 && !t.classList.contains('tl-hide'),
              r.left >= b.left - 1 && r.right <= b.right + 1, t.parentElement.id]; }}""", el)
    assert title[0].startswith("layer0…layer15 ×16") and title[1] and title[2], title
    # the program's output y is made in layer15, folded into this box: the box says so
    label = canvas.locator(f"svg g.node[id='{title[3]}'] > text").all_text_contents()
    assert "→ y (layer15)" in label, label
    assert page.evaluate(TITLE_OVERLAPS, el) == []
    assert not page.evaluate(LAYERS, el)[1:]        # no box of its own for layer1…layer15
    _shot(page, "10b_big_sdg_folded", 1)
    canvas.locator(f"svg g.node[id='{title[3]}'] > path").first.click()     # open it
    page.wait_for_function("([el, k]) => el.querySelector(`svg g.cluster[id='${k}']`)",
                           arg=[el, title[3]])
    assert canvas.locator("svg g.node[id^='op']").count() >= 2     # one layer's inside
    assert page.evaluate(TITLE_OVERLAPS, el) == []
    _labels_read(page, canvas, el, "folded, the series opened")     # fit: labels read
    _shot(page, "10c_big_sdg_folded_open", 1)
    try:  # the series' titles fit at a narrow and a wide window too
        for width in (900, 1800):
            page.set_viewport_size({"width": width, "height": 1000})
            canvas.locator(".tl-fit").first.click()
            page.wait_for_timeout(300)
            assert page.evaluate(TITLE_OVERLAPS, el) == [], width
            _shot(page, f"10d_big_sdg_folded_open_{width}", 1)
    finally:
        page.set_viewport_size({"width": 1400, "height": 1000})
    _fold(page, dash, False)
    assert [k for k, *_ in page.evaluate(LAYERS, el)] == list(range(16))


def test_ppo_graph_by_phase(page):
    """PPO's SDG opens as its phases (rollout, gae, minibatch, loss, gradient, update,
    metrics); a click opens one, and the profiling run fills in measured time."""
    dash = _dash(page, 2)
    _tab(page, "SDG", 2)
    canvas = _wait(dash.locator(".tl-graph"))
    _wait(canvas.locator(".tl-graph-view svg g.node"))
    text = canvas.locator("svg").first.text_content()
    assert all(phase in text for phase in ("rollout", "gae", "loss", "update"))
    el = canvas.first.element_handle()
    before = canvas.locator("svg g.node").count()
    canvas.locator("svg g.node[id^='g']").first.click()
    page.wait_for_function("([el, n]) => el.querySelectorAll('svg g.node').length != n",
                           arg=[el, before])
    _shot(page, "12_ppo_sdg", 2)
    assert page.evaluate(LABEL_HEIGHT, el) >= 7
    _tab(page, "Profile", 2)
    _wait(dash.locator(".tempo-lab-run-button")).first.click()
    # the run goes on in the background, its steps shown in the tab as it goes
    page.wait_for_function("(el) => /step \\d of \\d/.test(el.querySelector("
                           "'.tempo-lab-run-status')?.textContent || '')",
                           arg=dash.first.element_handle(), timeout=60_000)
    _shot(page, "12b_ppo_profiling", 2)
    _wait(dash.locator(".tempo-lab-profile .js-plotly-plot"), 180_000)
    drawn = _charts_drawn(dash.locator(".tempo-lab-profile"), at_least=2, timeout=60)
    assert len(drawn) >= 2 and all(drawn), drawn
    _tab(page, "SDG", 2)
    options = [o.replace("\xa0", " ") for o in
               dash.locator(".tempo-lab-colour select option").all_inner_texts()]
    assert "kernel time (measured)" in options
    dash.locator(".tempo-lab-colour select").first.select_option(
        index=options.index("kernel time (measured)"))
    svg = dash.locator(".tl-graph svg").first   # the view was rebuilt with the run's data
    for _ in range(60):
        if re.search("µs|ms", svg.text_content() or ""):
            break
        page.wait_for_timeout(500)
    assert re.search("µs|ms", svg.text_content())
    _shot(page, "13_ppo_measured_time", 2)


# The y tick labels of a chart that overlap another, and the elements under ``root`` that
# scroll (their content wider or taller than they are, with a scrollbar to show for it).
TICKS_AND_SCROLLERS = """([gd, root]) => {
  const ts = [...gd.querySelectorAll('g.ytick text')].map((t) => t.getBoundingClientRect())
    .filter((r) => r.height > 0);
  let overlaps = 0;
  ts.forEach((r, i) => ts.slice(i + 1).forEach((q) => {
    if (r.top < q.bottom - 0.5 && q.top < r.bottom - 0.5 && r.left < q.right && q.left < r.right)
      overlaps += 1; }));
  const scrollers = [...root.querySelectorAll('*')].filter((e) => {
    const s = getComputedStyle(e);
    return (e.scrollWidth > e.clientWidth + 1 && /auto|scroll/.test(s.overflowX)) ||
           (e.scrollHeight > e.clientHeight + 1 && /auto|scroll/.test(s.overflowY)); })
    .map((e) => e.className);
  return { ticks: ts.length, overlaps, scrollers }; }"""


# The title's box (title and subtitle), the plot area's top and the subtitle, relative to
# the chart.
SUBTITLE = """(gd) => { const g = gd.getBoundingClientRect();
  const t = gd.querySelector('.g-gtitle').getBoundingClientRect();
  const s = gd.querySelector('.gtitle-subtitle');
  const plot = gd.querySelector('.nsewdrag').getBoundingClientRect();
  return { left: t.left - g.left, right: t.right - g.left, top: t.top - g.top,
           bottom: t.bottom - g.top, plot: plot.top - g.top, width: g.width,
           lines: s ? Math.max(1, s.querySelectorAll('tspan.line').length) : 0,
           text: s ? s.textContent : '' }; }"""


def test_ppo_iteration_space_ticks_do_not_overlap(page):
    """PPO's iteration space with the iterations slider at its most (12 x 2 x 2 = 48 rows of
    i, e, m; the RL tutorial's PPO opens on 96): its y tick labels never overlap (a tick per
    row wrote them over each other), and nothing in the tab scrolls (the slider grid did,
    sideways, by 2 px). Its title and subtitle (the bounds, what the bars and markers are)
    fit in the chart at 900, 1400 and 1800 px, below the toolbar's band and above the plot:
    on one line, the subtitle was cut off at 900 px (the chart is about 390 px wide)."""
    dash = _dash(page, 2)
    _tab(page, "Schedule", 2)
    dash.locator(".tempo-lab-schedule .lm-TabBar-tab").filter(has_text="iteration space") \
        .first.click()
    root = dash.locator(".tempo-lab-schedule").first
    chart = _wait(root.locator(".js-plotly-plot"))
    _wait(chart.locator(".scatterlayer .point"))
    slider = root.locator(".widget-slider").first
    assert slider.locator("label").first.inner_text().strip() == "I"
    slider.locator(".noUi-handle").first.press("End")
    page.wait_for_function("(gd) => /I=12/.test(gd.querySelector('.g-gtitle')?.textContent)",
                           arg=chart.first.element_handle(), timeout=30_000)
    page.wait_for_timeout(500)
    for width in (900, 1400, 1800):
        page.set_viewport_size({"width": width, "height": 1000})
        try:
            page.wait_for_timeout(600)
            got = page.evaluate(TICKS_AND_SCROLLERS,
                                [chart.first.element_handle(), root.element_handle()])
            assert 4 <= got["ticks"] <= 12 and got["overlaps"] == 0, (width, got)
            assert got["scrollers"] == [], (width, got)
            at = chart.first.evaluate(SUBTITLE)
            assert at["left"] >= 0 and at["right"] <= at["width"], (width, at)
            assert at["top"] >= 24 and at["bottom"] <= at["plot"], (width, at)
            assert "one marker per group and point" in at["text"], (width, at)
            assert width > 900 or at["lines"] >= 2, (width, at)
            _shot(page, f"28_ppo_iteration_space_{width}", 2)
            chart.first.screenshot(path=str(SHOTS / f"28b_ppo_iteration_title_{width}.png"))
        finally:
            page.set_viewport_size({"width": 1400, "height": 1000})


def test_export_svg_and_standalone_html(page, lab):
    """The graph downloads as SVG, with its colour legend; the dashboard exports to one HTML
    file that shows its sections and plots with no kernel and no network."""
    dash = _dash(page, 1)
    _tab(page, "SDG", 1)
    canvas = _wait(dash.locator(".tl-graph"))
    _fold(page, dash, False)
    with page.expect_download() as download:
        canvas.locator(".tl-svg").first.click()
    svg = Path(download.value.path()).read_text()
    assert svg.startswith("<svg") and "layer11" in svg
    assert re.search(r'<g class="tl-legend".*>colour:<.*>source<', svg)   # what colours mean

    dash.locator(".tempo-lab-export").first.click()
    link = _wait(dash.locator(".tempo-lab-export-link"))
    saved = Path(lab[2]) / link.first.get_attribute("href")
    assert saved.exists() and saved.stat().st_size > 100_000
    offline = page.context.browser.new_page()
    try:
        offline.route("**/*", lambda route: route.abort()
                      if not route.request.url.startswith("file:") else route.continue_())
        offline.goto(saved.as_uri())
        titles = offline.locator("details.tl-section > summary").all_inner_texts()
        assert titles[:5] == ["Program", "SDG", "Passes", "Schedule", "Memory"]
        assert offline.locator("svg g.node").count() >= 16
        canvas = _wait(offline.locator(".tl-graph"))       # the notebook's canvas, offline
        zoom = int(canvas.first.get_attribute("data-zoom"))
        canvas.locator(".tl-zoom-in").first.click()
        assert int(canvas.first.get_attribute("data-zoom")) > zoom
        canvas.locator(".tl-fit").first.click()
        canvas.locator("svg g.node[id^='op']").first.click()
        assert canvas.first.get_attribute("data-selected") != "-1"
        assert canvas.locator("svg g.node.tl-selected").count() == 1
        _wait(offline.locator(".js-plotly-plot .barlayer .point"))
        SHOTS.mkdir(exist_ok=True)
        offline.screenshot(path=str(SHOTS / "11_exported_html.png"))
    finally:
        offline.close()


# The median height on screen of the text drawn in the graph's view (hidden text and text
# outside the view left out).
LABEL_HEIGHT = """(el) => {
  const view = el.querySelector('.tl-graph-view').getBoundingClientRect();
  const hs = [...el.querySelectorAll('svg text')].map((t) => t.getBoundingClientRect())
    .filter((r) => r.height > 0 && r.bottom > view.top && r.top < view.bottom
                   && r.right > view.left && r.left < view.right)
    .map((r) => r.height).sort((a, b) => a - b);
  return hs.length ? hs[Math.floor(hs.length / 2)] : 0;
}"""


def _in_view(page, el, prefix: str) -> str:
    """The id of a node (``op``: an op, ``g``: a closed group) wholly inside the graph's view,
    the one nearest its middle: what a user can see to click."""
    key = page.evaluate("""([el, prefix]) => {
      const v = el.querySelector('.tl-graph-view').getBoundingClientRect();
      const mid = (v.top + v.bottom) / 2;
      const ns = [...el.querySelectorAll(`svg g.node[id^='${prefix}']`)].filter((g) => {
        const r = g.getBoundingClientRect();
        return r.top > v.top && r.bottom < v.bottom && r.left > v.left && r.right < v.right; });
      ns.sort((a, b) => Math.abs(a.getBoundingClientRect().top - mid)
                        - Math.abs(b.getBoundingClientRect().top - mid));
      return ns.length ? ns[0].id : null; }""", [el, prefix])
    assert key is not None, f"no {prefix} node inside the view"
    return key


def test_graph_reads_at_every_zoom_and_keeps_its_view(page):
    """The 16-layer decoder (307 ops): text on screen is readable after fit and when zoomed out
    (op labels give way to group names), "layer11 softmax" finds the op and selecting it zooms
    until its label reads, opening a group keeps the zoom, expand-all draws every op on the
    canvas in under 3 s, and collapse-all then fit shows every layer."""
    dash = _dash(page, 1)
    _tab(page, "SDG", 1)
    canvas = _wait(dash.locator(".tl-graph"))
    el = canvas.first.element_handle()
    canvas.locator(".tl-fit").first.click()
    assert page.evaluate(LABEL_HEIGHT, el) >= 7
    for _ in range(6):
        canvas.locator(".tl-zoom-out").first.click()
    assert el.get_attribute("data-far") == "1" and page.evaluate(LABEL_HEIGHT, el) >= 7
    canvas.locator(".tl-fit").first.click()

    search = canvas.locator(".tl-graph-search").first
    search.fill("layer11 softmax")
    hits = _wait(canvas.locator(".tl-graph-hit"))
    assert hits.count() >= 1 and "softmax" in hits.first.inner_text()
    assert "tl-active" in hits.first.get_attribute("class")
    search.press("Enter")
    _wait(canvas.locator("svg g.node.tl-selected"))
    facts = _inspector_shows(dash, "softmax")
    assert "softmax" in facts and "layer11" in facts
    height = page.evaluate("(el) => el.querySelector('svg g.node.tl-selected text')"
                           ".getBoundingClientRect().height", el)
    assert height >= 9, height
    _shot(page, "14_found_layer11_softmax", 1)

    canvas.locator(".tl-all").first.click()      # the whole graph, then a step closer
    canvas.locator(".tl-zoom-in").first.click()
    zoom = el.get_attribute("data-scale")
    key = _in_view(page, el, "g")
    canvas.locator(f"svg g.node[id='{key}'] > path").first.click()
    page.wait_for_function("([el, k]) => el.querySelector(`svg g.cluster[id='${k}']`)",
                           arg=[el, key])
    assert el.get_attribute("data-scale") == zoom           # opening a group keeps the zoom

    start = time.monotonic()
    dash.locator(".tempo-lab-sdg button").filter(has_text="expand all").first.click()
    page.wait_for_function("(el) => el.querySelectorAll(\"svg g.node[id^='op']\").length >= 200",
                           arg=el, timeout=30_000)
    took = time.monotonic() - start
    assert took <= 3.0, f"expand all took {took:.1f} s"
    assert canvas.locator(".tl-graph-view svg").count() == 1     # still the canvas
    _shot(page, "15_expanded_all", 1)

    dash.locator(".tempo-lab-sdg button").filter(has_text="collapse all").first.click()
    page.wait_for_function("(el) => el.querySelectorAll(\"svg g.node[id^='op']\").length < 50",
                           arg=el)
    canvas.locator(".tl-fit").first.click()
    inside = page.evaluate("""(el) => {
      const v = el.querySelector('.tl-graph-view').getBoundingClientRect();
      return [...el.querySelectorAll('svg g.node')].every((n) => {
        const r = n.getBoundingClientRect();
        return r.top >= v.top - 1 && r.bottom <= v.bottom + 1 && r.left >= v.left - 1
               && r.right <= v.right + 1; });
    }""", el)
    assert inside
    assert page.evaluate(LABEL_HEIGHT, el) >= 7
    _shot(page, "16_collapsed_fit", 1)


# The canvas's view, the notebook's scrolling area around it and where it is scrolled to.
SCROLLER = """(el) => {
  let p = el.closest('.jp-WindowedPanel-outer');
  const v = el.querySelector('.tl-graph-view').getBoundingClientRect();
  return { top: p.scrollTop, height: p.clientHeight, view: [v.left, v.top, v.width, v.height],
           focused: document.activeElement === el.querySelector('.tl-graph-view'),
           scale: el.dataset.scale }; }"""


def test_the_canvas_lets_the_page_scroll(page):
    """The wheel over the graph scrolls the notebook, and does not zoom, until the graph is
    clicked; then it zooms and the notebook stays. The canvas is never taller than the
    notebook's visible area, and the inspector sits beside it at 1400 px and below it at
    900 px."""
    dash = _dash(page, 1)
    _tab(page, "SDG", 1)
    canvas = _wait(dash.locator(".tl-graph"))
    el = canvas.first.element_handle()
    view = canvas.locator(".tl-graph-view").first
    view.scroll_into_view_if_needed()
    page.evaluate("(el) => el.querySelector('.tl-graph-view').blur()", el)
    before = page.evaluate(SCROLLER, el)
    assert not before["focused"]
    assert before["view"][3] <= before["height"], before      # all of it can be on screen
    x, y, w, h = before["view"]
    page.mouse.move(x + w / 2, y + min(h, 300) / 2)
    page.mouse.wheel(0, 240)
    page.wait_for_timeout(400)
    after = page.evaluate(SCROLLER, el)
    assert after["top"] != before["top"], (before, after)     # the notebook scrolled
    assert after["scale"] == before["scale"]                  # the graph did not zoom
    assert "tl-show" in canvas.locator(".tl-graph-tip").first.get_attribute("class")

    x, y, w, h = after["view"]
    page.mouse.click(x + 3, y + h / 2)                        # a click in it (left margin)
    focused = page.evaluate(SCROLLER, el)
    assert focused["focused"], focused
    page.mouse.move(x + w / 2, y + h / 2)
    page.mouse.wheel(0, -240)
    page.wait_for_function("([el, s]) => el.dataset.scale !== s", arg=[el, focused["scale"]])
    zoomed = page.evaluate(SCROLLER, el)
    assert zoomed["top"] == focused["top"], (focused, zoomed)  # the notebook stayed
    canvas.locator(".tl-fit").first.click()

    side = dash.locator(".tempo-lab-sdg-side").first.bounding_box()
    box = view.bounding_box()
    assert side["x"] >= box["x"] + box["width"] - 1 and side["y"] < box["y"] + box["height"]
    _shot(page, "22_canvas_and_inspector_1400", 1)
    page.set_viewport_size({"width": 900, "height": 1000})
    try:
        page.wait_for_timeout(500)
        side = dash.locator(".tempo-lab-sdg-side").first.bounding_box()
        box = view.bounding_box()
        assert side["y"] >= box["y"] + box["height"] - 1, (side, box)   # below it
        high = page.evaluate(SCROLLER, el)
        assert high["view"][3] <= high["height"], high
        _shot(page, "23_canvas_and_inspector_900", 1)
    finally:
        page.set_viewport_size({"width": 1400, "height": 1000})


# Each op drawn in a pane of the pass diff: its box relative to its pane's view, by id.
PANE_OPS = """(el) => { const v = el.querySelector('.tl-graph-view').getBoundingClientRect();
  return Object.fromEntries([...el.querySelectorAll("svg g.node[id^='op']")].map((g) => {
    const r = g.querySelector(':scope > path').getBoundingClientRect();
    return [g.id, [r.left - v.left, r.top - v.top, r.width, r.height]]; })); }"""


def test_pass_diff_places_ops_alike(page):
    """The pass stepper on the 16-layer decoder, at fuse (627 ops before, 307 after): every
    op drawn on both sides is at the same place in both panes (within 1 px), erased and
    rewritten ops are coloured, and zooming one pane zooms the other alike."""
    dash = _dash(page, 1)
    _tab(page, "Passes", 1)
    rows = _wait(dash.locator(".tempo-lab-pass-rows select"))
    names = [t.split()[1] for t in rows.first.locator("option").all_inner_texts()]
    rows.first.select_option(index=names.index("fuse"))
    panes = dash.locator(".tempo-lab-passes .tl-graph")
    page.wait_for_function("(els) => els.length === 2 && els.every((el) => "
                           "el.querySelectorAll(\"svg g.node[id^='op']\").length > 50 && "
                           "Number(el.dataset.scale) > 0)",
                           arg=panes.element_handles(), timeout=30_000)
    page.wait_for_timeout(500)

    def compare(what):
        before, after = (page.evaluate(PANE_OPS, el) for el in panes.element_handles())
        common = set(before) & set(after)
        assert len(common) >= 20 and len(before) > len(after), (what, len(common))
        for k in common:
            assert all(abs(a - b) <= 1 for a, b in zip(before[k], after[k])), \
                (what, k, before[k], after[k])
    compare("fit")
    fills = dash.locator(".tempo-lab-passes .tl-graph").first.evaluate(
        "(el) => new Set([...el.querySelectorAll(\"svg g.node[id^='op'] > path\")]"
        ".map((p) => p.getAttribute('fill'))).size")
    assert fills >= 3                        # erased and rewritten beside the categories
    _shot(page, "24_pass_diff_fuse", 1)
    panes.first.locator(".tl-zoom-in").first.click()
    panes.first.locator(".tl-zoom-in").first.click()
    page.wait_for_timeout(300)
    zooms = [el.get_attribute("data-zoom") for el in panes.element_handles()]
    assert zooms[0] == zooms[1] and zooms[0] != "100", zooms
    compare("zoomed in one pane")
    _shot(page, "25_pass_diff_zoomed", 1)


# The contrast (WCAG) of an element's text with the background behind it.
CONTRAST = """(el) => {
  const rgb = (c) => (c.match(/[\\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => { const f = (v) => { v /= 255;
    return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b); };
  let bg = null;
  for (let p = el; p && !bg; p = p.parentElement) {
    const c = rgb(getComputedStyle(p).backgroundColor);
    if (c.length === 3 || (c.length === 4 && c[3] > 0.5)) bg = c.slice(0, 3);
  }
  const a = lum(rgb(getComputedStyle(el).color)), b = lum(bg || [255, 255, 255]);
  return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05); }"""


# The drawing's background (the SVG's and its view's, and JupyterLab's --jp-layout-color0
# for comparison) and, of the text drawn and shown in it, the least contrast (WCAG) with what
# is behind it, by kind: an op's label on its box, a group's title and an edge's label on the
# background, a name drawn zoomed out on its halo; colours with alpha blended over it.
DRAWING = """(el) => {
  const rgb = (c) => (c.match(/[\\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => { const f = (v) => { v /= 255;
    return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b); };
  const ratio = (fg, bg) => { const [r, g, b, a = 1] = rgb(fg), u = rgb(bg);
    const x = lum([r, g, b].map((v, i) => a * v + (1 - a) * u[i])), y = lum(u);
    return (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05); };
  const probe = document.createElement('div');
  probe.style.background = 'var(--jp-layout-color0)';
  document.body.appendChild(probe);
  const theme = getComputedStyle(probe).backgroundColor;
  probe.remove();
  const bg = getComputedStyle(el.querySelector('svg .tl-bg, svg rect')).fill;
  const least = {};
  const put = (what, t, behind) => {
    if (!t.getBoundingClientRect().width) return;
    const cs = getComputedStyle(t), halo = parseFloat(cs.strokeWidth) > 0 && cs.stroke !== 'none';
    const r = ratio(cs.fill, halo ? cs.stroke : behind);
    const k = halo ? 'name on its halo' : what;
    if (!(k in least) || r < least[k][0]) least[k] = [r, t.textContent];
  };
  el.querySelectorAll('svg g.cluster > text').forEach((t) => put('group title', t, bg));
  el.querySelectorAll('svg g.edge text').forEach((t) => put('edge label', t, bg));
  el.querySelectorAll('svg g.node').forEach((g) => {
    const box = getComputedStyle(g.querySelector(':scope > path')).fill;
    g.querySelectorAll(':scope > text').forEach((t) => put('node label', t, box)); });
  return { theme, bg, view: getComputedStyle(el.querySelector('.tl-graph-view')).backgroundColor,
           least, legend: [...el.querySelectorAll('svg .tl-legend')]
             .some((g) => g.getBoundingClientRect().height > 0) }; }"""


def _drawing_reads(page, el, what: str, kinds: set):
    """The drawing's background is JupyterLab's (``--jp-layout-color0``), its own legend (in
    the SVG for a download) is not drawn on the canvas, and every kind of text in ``kinds``
    is drawn and reads at least 4.5:1 on what is behind it."""
    got = page.evaluate(DRAWING, el)
    assert got["bg"] == got["view"] == got["theme"], (what, got)
    assert not got["legend"], (what, got)
    assert kinds <= set(got["least"]), (what, got)
    assert all(r >= 4.5 for r, _ in got["least"].values()), (what, got)
    return got


def test_the_canvas_reads_in_the_dark_theme(page):
    """In JupyterLab's dark theme the canvas's buttons, its status line and the legend above
    it have text that contrasts with what is behind it (at least 4.5:1, WCAG AA), and so does
    the drawing: its background is the theme's (it stayed white), the groups' titles and the
    edges' labels drawn on it take the theme's text colour, and the ops keep their light
    fills with dark labels, zoomed in and zoomed out (names on a halo of the background)."""
    dash = _dash(page, 1)
    _tab(page, "SDG", 1)
    canvas = _wait(dash.locator(".tl-graph"))
    el = canvas.first.element_handle()
    light = page.evaluate(DRAWING, el)
    page.evaluate("() => window.jupyterapp.commands.execute('apputils:change-theme', "
                  "{theme: 'JupyterLab Dark'})")
    try:
        page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'",
                               timeout=20_000)
        page.wait_for_timeout(500)
        for what in (".tl-fit", ".tl-graph-status"):
            ratio = canvas.locator(what).first.evaluate(CONTRAST)
            assert ratio >= 4.5, (what, ratio)
        ratio = dash.locator(".tempo-lab-sdg .tempo-lab-legend").first.evaluate(CONTRAST)
        assert ratio >= 4.5, ("legend", ratio)
        canvas.locator(".tl-all").first.click()      # the whole graph: zoomed out
        page.wait_for_timeout(300)
        dark = _drawing_reads(page, el, "all", {"name on its halo"})
        assert dark["bg"] != light["bg"], (light, dark)
        _shot(page, "26_dark_theme", 1)
        canvas.locator(".tl-graph-search").first.fill("layer3 softmax")
        _wait(canvas.locator(".tl-graph-hit"))
        canvas.locator(".tl-graph-search").first.press("Enter")   # opens layer3, zooms in
        _wait(canvas.locator("svg g.node.tl-selected"))
        page.wait_for_timeout(500)
        _drawing_reads(page, el, "zoomed in", {"node label", "group title", "edge label"})
        _shot(page, "26b_dark_theme_zoomed_in", 1)
        canvas.locator(".tl-fit").first.click()
    finally:
        page.evaluate("() => window.jupyterapp.commands.execute('apputils:change-theme', "
                      "{theme: 'JupyterLab Light'})")
        page.wait_for_function("() => document.body.dataset.jpThemeLight === 'true'",
                               timeout=20_000)


# Every drawn node's and group's box on screen (its outline, not its title), by id.
BOXES = """(el) => Object.fromEntries([...el.querySelectorAll('svg g.node, svg g.cluster')]
  .map((g) => { const r = g.querySelector(':scope > path, :scope > polygon')
                             .getBoundingClientRect();
                return [g.id, [r.left, r.top, r.width, r.height]]; }))"""

# The pairs of titles on show (open groups' titles, closed groups' names) that overlap.
TITLE_OVERLAPS = """(el) => {
  const ts = [...el.querySelectorAll("svg g.cluster > text, svg g.node[id^='g'] > "
                                     + "text:first-of-type")]
    .map((t) => [t.textContent, t.getBoundingClientRect()]).filter(([, r]) => r.width > 0);
  const out = [];
  ts.forEach(([a, r], i) => ts.slice(i + 1).forEach(([b, q]) => {
    if (r.left < q.right - 0.5 && q.left < r.right - 0.5 && r.top < q.bottom - 0.5
        && q.top < r.bottom - 0.5) out.push([a, b]); }));
  return out; }"""

# Each layer's box on screen, [k, top, bottom, name drawn, left, right], found by its title
# or closed node's name.
LAYERS = """(el) => [...el.querySelectorAll("svg g.cluster, svg g.node[id^='g']")].map((g) => {
  const t = g.querySelector(':scope > text'), m = /^layer(\\d+)[ :]/.exec(t.textContent);
  if (!m) return null;
  const r = g.querySelector(':scope > path, :scope > polygon').getBoundingClientRect();
  return [Number(m[1]), r.top, r.bottom, t.getBoundingClientRect().height > 0, r.left,
          r.right]; })
  .filter(Boolean).sort((a, b) => a[0] - b[0])"""

# The labels whose node's or group's box is in the graph's view (ops' names, open groups'
# titles, closed groups' names): how many there are, how many are drawn, how many of those at
# 8 px or more, and the median font size on screen of those drawn (px: the font size, not the
# height of the text's box).
LABELS = """(el) => {
  const v = el.querySelector('.tl-graph-view').getBoundingClientRect();
  const s = Number(el.dataset.scale), sizes = [];
  let all = 0;
  el.querySelectorAll("svg g.node > text:first-of-type, svg g.cluster > text").forEach((t) => {
    const b = t.parentElement.querySelector(':scope > path, :scope > polygon')
      .getBoundingClientRect();
    if (b.right < v.left || b.left > v.right || b.bottom < v.top || b.top > v.bottom) return;
    all += 1;
    if (t.getBoundingClientRect().height > 0)
      sizes.push(parseFloat(getComputedStyle(t).fontSize) * s); });
  sizes.sort((a, b) => a - b);
  return { all, drawn: sizes.length, read: sizes.filter((x) => x >= 7.99).length,
           median: sizes.length ? sizes[Math.floor(sizes.length / 2)] : 0 }; }"""


def _in_reading_order(layers) -> bool:
    """Program order reads top to bottom: each layer's box starts below the previous one's
    bottom, and the two share some width (one vertical chain, not side by side)."""
    return all(b[1] >= a[2] - 0.5 and b[4] < a[5] and a[4] < b[5]
               for a, b in zip(layers, layers[1:]))


def _reads_well(page, el, what: str, least: int = 15):
    """After fit: the whole graph, or its start at a size that reads where the whole would
    not (and the status line says so); the layers read top to bottom, each layer's box below
    the previous one's, and every layer's name is drawn; of the labels in view (at least
    ``least``) at least half are drawn at 8 px or more, their median font size is 8 px or
    more, and no two titles overlap."""
    fit = el.get_attribute("data-fit")
    assert fit in ("all", "part"), (what, fit)
    if fit == "part":
        assert "part of the graph, at a size that reads" in \
            el.query_selector(".tl-graph-status").text_content(), what
    layers = page.evaluate(LAYERS, el)
    assert [k for k, *_ in layers] == list(range(16)), what
    assert _in_reading_order(layers), (what, layers)
    assert all(shown for _, _, _, shown, _, _ in layers), (what, layers)   # every name drawn
    got = page.evaluate(LABELS, el)
    assert got["all"] >= least and got["read"] >= 0.5 * got["all"], (what, fit, got)
    assert got["median"] >= 8, (what, fit, got)
    assert page.evaluate(TITLE_OVERLAPS, el) == [], what
    return fit, got


def test_nested_layout_is_stable_and_reads(page, lab):
    """The 16-layer Llama-style decoder (473 ops), in a notebook of its own: at the default
    view the layers read top to bottom, labels read and titles do not overlap; opening one
    group, then closing it, keeps it and every node and group outside it where they were on
    screen (within 2 px); expand-all and collapse-all each paint within 2 s and fit."""
    _, _, home = lab
    _notebook(home / "llama.ipynb", [LLAMA_SETUP, LLAMA])
    try:
        _, dash = _open_and_run(page, "llama.ipynb")
        _check_nested_layout(page, dash)
    finally:  # saved first: a dialog asking to save would block the next notebook's checks
        page.evaluate("async () => { const c = window.jupyterapp.commands; "
                      "await c.execute('docmanager:save'); "
                      "await c.execute('application:close'); }")


def _kept_outside(before: dict, after: dict, key: str, what: str):
    """The toggled group ``key`` keeps its box on screen, and so does every node and group
    drawn before and after the toggle that is not inside it (within 2 px)."""
    gx, gy, gw, gh = after[key]
    assert all(abs(a - b) <= 2 for a, b in zip(before[key], after[key])), (what, key)
    kept = 0
    for k, (x, y, w, h) in before.items():
        if k == key or k not in after:
            continue
        if x >= gx - 1 and y >= gy - 1 and x + w <= gx + gw + 1 and y + h <= gy + gh + 1:
            continue      # inside the group
        ax, ay, aw, ah = after[k]
        assert max(abs(ax - x), abs(ay - y), abs(aw - w), abs(ah - h)) <= 2, \
            (what, k, before[k], after[k])
        kept += 1
    assert kept >= 10, (what, kept)


def _check_nested_layout(page, dash):
    def shot(name):
        SHOTS.mkdir(exist_ok=True)
        dash.scroll_into_view_if_needed()
        dash.screenshot(path=str(SHOTS / f"{name}.png"))

    dash.locator(".tempo-lab-tabs > .lm-TabBar .lm-TabBar-tab").filter(has_text="SDG") \
        .first.click()
    canvas = _wait(dash.locator(".tl-graph"))
    el = canvas.first.element_handle()
    _wait(canvas.locator(".tl-graph-view svg g.node"))
    _fold(page, dash, False)
    canvas.locator(".tl-fit").first.click()
    page.wait_for_function("(el) => Number(el.dataset.scale) > 0", arg=el)
    shot("18_llama_default")
    # one vertical chain of layers is far taller than wide: fit shows its start at 9-px labels,
    # where the decoder's first group, its two ops, layer0's title and its first closed groups
    # (each with the room it has open) are what the view holds (7 labels)
    _reads_well(page, el, "default view", least=5)

    canvas.locator(".tl-zoom-in").first.click()
    key = _in_view(page, el, "g")
    before = page.evaluate(BOXES, el)
    canvas.locator(f"svg g.node[id='{key}'] > path").first.click()
    page.wait_for_function("([el, k]) => el.querySelector(`svg g.cluster[id='${k}']`)",
                           arg=[el, key])
    after = page.evaluate(BOXES, el)
    assert sum(k not in before for k in after) >= 2        # what it holds is drawn now
    _kept_outside(before, after, key, "opened")
    shot("19_llama_opened_one")
    # closed again by its title: nothing outside it moves either
    canvas.locator(f"svg g.cluster[id='{key}'] > text").first.dispatch_event("click")
    page.wait_for_function("([el, k]) => el.querySelector(`svg g.node[id='${k}']`)",
                           arg=[el, key])
    _kept_outside(after, page.evaluate(BOXES, el), key, "closed")

    for button, least, name in (("expand all", 300, "20_llama_expanded"),
                                ("collapse all", 0, "21_llama_collapsed")):
        start = time.monotonic()
        dash.locator(".tempo-lab-sdg button").filter(has_text=button).first.click()
        page.wait_for_function("([el, n]) => { const k = el.querySelectorAll("
                               "\"svg g.node[id^='op']\").length; return n ? k >= n : k < 10; }",
                               arg=[el, least], timeout=30_000)
        took = time.monotonic() - start
        page.wait_for_timeout(400)
        shot(name)
        assert took <= 2.0, f"{button} took {took:.1f} s"
        _reads_well(page, el, button)
    # collapsed and fitted: the middle of what each closed group draws (its box and its
    # name, drawn larger than its box) is on its box, where a click there lands
    off = page.evaluate("""(el) => [...el.querySelectorAll("svg g.node[id^='g']")]
      .filter((g) => { const a = g.getBoundingClientRect();
        const b = g.querySelector(':scope > path').getBoundingClientRect();
        const x = a.left + a.width / 2, y = a.top + a.height / 2;
        return !(x >= b.left && x <= b.right && y >= b.top && y <= b.bottom); })
      .map((g) => g.id)""", el)
    assert off == []


def _stable_toggle(page, canvas, el, what: str):
    """Zoomed in one step from the whole graph: a closed group in view opened, then closed
    by its title, keeps its box, and every node and group outside it keeps its box (2 px)."""
    canvas.locator(".tl-all").first.click()
    canvas.locator(".tl-zoom-in").first.click()
    page.wait_for_timeout(200)
    key = _in_view(page, el, "g")
    before = page.evaluate(BOXES, el)
    canvas.locator(f"svg g.node[id='{key}'] > path").first.click()
    page.wait_for_function("([el, k]) => el.querySelector(`svg g.cluster[id='${k}']`)",
                           arg=[el, key])
    after = page.evaluate(BOXES, el)
    assert sum(k not in before for k in after) >= 1, what     # what it holds is drawn now
    _kept_outside(before, after, key, f"{what}: opened")
    canvas.locator(f"svg g.cluster[id='{key}'] > text").first.dispatch_event("click")
    page.wait_for_function("([el, k]) => el.querySelector(`svg g.node[id='${k}']`)",
                           arg=[el, key])
    _kept_outside(after, page.evaluate(BOXES, el), key, f"{what}: closed")


def _labels_read(page, canvas, el, what: str, least: int = 10):
    """After fit: of the labels in view (at least ``least``) half are drawn at 8 px or more,
    their median font size is 8 px or more, and no two titles overlap."""
    canvas.locator(".tl-fit").first.click()
    page.wait_for_timeout(300)
    got = page.evaluate(LABELS, el)
    assert got["all"] >= least and got["read"] >= 0.5 * got["all"], (what, got)
    assert got["median"] >= 8, (what, got)
    assert page.evaluate(TITLE_OVERLAPS, el) == [], what
    return got


def test_ppo_graph_is_stable_and_reads(page):
    """PPO (352 traced ops, its phases as groups): at the default view and after expand-all,
    fit draws most labels in view at 8 px or more and no titles overlap; opening a phase,
    then closing it, moves nothing outside it by more than 2 px."""
    dash = _dash(page, 2)
    _tab(page, "SDG", 2)
    canvas = _wait(dash.locator(".tl-graph"))
    el = canvas.first.element_handle()
    _wait(canvas.locator(".tl-graph-view svg g.node"))
    _labels_read(page, canvas, el, "default view")
    _shot(page, "29_ppo_default_fit", 2)
    _stable_toggle(page, canvas, el, "ppo")
    dash.locator(".tempo-lab-sdg button").filter(has_text="expand all").first.click()
    page.wait_for_function("(el) => el.querySelectorAll(\"svg g.node[id^='op']\").length >= 100",
                           arg=el, timeout=30_000)
    page.wait_for_timeout(400)
    _labels_read(page, canvas, el, "expand all")
    _shot(page, "29b_ppo_expanded_fit", 2)
    dash.locator(".tempo-lab-sdg button").filter(has_text="collapse all").first.click()
    page.wait_for_function("(el) => el.querySelectorAll(\"svg g.node[id^='op']\").length < 10",
                           arg=el)


@pytest.fixture(scope="class")
def llama(page, lab):
    """The 16-layer Llama-style decoder's dashboard in a notebook of its own, opened with the
    time explore() took printed above it; saved and closed afterwards. Its tests run
    together (a class): while it is open, the first notebook's dashboards are hidden."""
    _, _, home = lab
    _notebook(home / "llama_dash.ipynb", [LLAMA_SETUP, LLAMA.replace("llama.explore()", ""),
                                          EXPLORE.format("llama")])
    try:
        panel, dash = _open_and_run(page, "llama_dash.ipynb")
        yield panel, dash
    finally:
        page.evaluate("async () => { const c = window.jupyterapp.commands; "
                      "await c.execute('docmanager:save'); "
                      "await c.execute('application:close'); }")


def _llama_tab(page, dash, title: str):
    dash.locator(".tempo-lab-tabs > .lm-TabBar .lm-TabBar-tab").filter(has_text=title) \
        .first.click()


def _llama_shot(dash, name: str):
    SHOTS.mkdir(exist_ok=True)
    dash.scroll_into_view_if_needed()
    dash.screenshot(path=str(SHOTS / f"{name}.png"))


# What each tab shows once painted (nothing has run yet: the profile tab offers to run).
FIRST_PAINT = {"Program": ".tempo-lab-overview", "SDG": ".tl-graph-view svg g.node",
               "Passes": ".tempo-lab-passes svg g.node", "Schedule": ".tempo-lab-code",
               "Memory": ".tempo-lab-memory .js-plotly-plot .barlayer .point",
               "Profile": ".tempo-lab-run-button"}


# The scope chart's x tick labels (text, box relative to the chart), the chart's size and
# the legend's box.
SCOPE_TICKS = """(gd) => { const g = gd.getBoundingClientRect();
  const box = (e) => { const r = e.getBoundingClientRect();
    return [r.left - g.left, r.top - g.top, r.right - g.left, r.bottom - g.top]; };
  const legend = gd.querySelector('g.legend');
  return { width: g.width, height: g.height, legend: legend ? box(legend) : null,
           ticks: [...gd.querySelectorAll('g.xtick text')].map((t) => [t.textContent,
                                                                       ...box(t)]) }; }"""


class TestLlamaDashboard:
    """The 16-layer Llama-style decoder's dashboard (473 ops), opened once for these tests."""

    def test_llama_opens_and_paints_each_tab_quickly(self, page, llama):
        """On the 16-layer Llama-style decoder (473 ops), explore() returns within 2 s and each
        tab, shown for the first time, paints its content within 2 s of the click."""
        panel, dash = llama
        text = "\n".join(panel.locator(".jp-OutputArea-output").all_text_contents())
        took = [float(t) for t in re.findall(r"explore\(\) took ([\d.]+) s", text)]
        assert len(took) == 1 and took[0] <= 2.0, took
        paints = {}
        for tab in TABS[1:] + TABS[:1]:     # the Program tab is shown first: clicked again last
            start = time.monotonic()
            _llama_tab(page, dash, tab)
            dash.locator(FIRST_PAINT[tab]).first.wait_for(timeout=30_000)
            paints[tab] = round(time.monotonic() - start, 2)
        assert max(paints.values()) <= 2.0, paints

    def test_llama_search_finds_by_scope(self, page, llama):
        """The graph's search box on the real dashboard: ``rope`` and ``att`` list ops of such
        scopes in every layer, ``layer1`` lists only layer1's ops (not layer10 to layer15's), and
        ``kind:softmax scope:layer11`` finds exactly one op, which Enter selects."""
        _, dash = llama
        _llama_tab(page, dash, "SDG")
        canvas = _wait(dash.locator(".tl-graph"))
        search = canvas.locator(".tl-graph-search").first

        def hits(query: str) -> list[str]:
            search.fill(query)
            rows = _wait(canvas.locator(".tl-graph-hit"))
            return rows.all_inner_texts()

        for query in ("rope", "att"):    # the ops of rope and attention scopes (and fused ops
            named = [t for t in hits(query) if query in t.lower()]     # that hold some of theirs)
            assert len(named) >= 32, (query, named)
            assert all(any(re.search(rf"\blayer{k}\b", t) for t in named) for k in range(16)), \
                (query, named)
        found = hits("layer1")
        assert len(found) >= 10, found
        assert all(re.search(r"\blayer1\b", t) for t in found), found
        assert not any(re.search(r"layer1\d", t) for t in found), found
        found = hits("kind:softmax scope:layer11")
        assert len(found) == 1 and "softmax" in found[0] and "layer11" in found[0], found
        _llama_shot(dash, "30_llama_search_softmax_layer11")
        search.press("Enter")
        _wait(canvas.locator("svg g.node.tl-selected"))
        facts = _inspector_shows(dash, "softmax")
        assert "layer11" in facts

    def test_llama_pass_diff_places_ops_alike_at_fit(self, page, llama):
        """The pass stepper on the 16-layer Llama-style decoder, at fuse, fitted: every op drawn
        on both sides is at the same place in both panes (within 1 px)."""
        _, dash = llama
        _llama_tab(page, dash, "Passes")
        rows = _wait(dash.locator(".tempo-lab-pass-rows select"))
        names = [t.split()[1] for t in rows.first.locator("option").all_inner_texts()]
        rows.first.select_option(index=names.index("fuse"))
        panes = dash.locator(".tempo-lab-passes .tl-graph")
        page.wait_for_function("(els) => els.length === 2 && els.every((el) => "
                               "el.querySelectorAll(\"svg g.node[id^='op']\").length > 20 && "
                               "Number(el.dataset.scale) > 0)",
                               arg=panes.element_handles(), timeout=30_000)
        panes.first.locator(".tl-fit").first.click()
        page.wait_for_timeout(500)
        before, after = (page.evaluate(PANE_OPS, el) for el in panes.element_handles())
        common = set(before) & set(after)
        assert len(common) >= 20, len(common)
        for k in common:
            assert all(abs(a - b) <= 1 for a, b in zip(before[k], after[k])), \
                (k, before[k], after[k])
        _llama_shot(dash, "31_llama_pass_diff_fit")

    def test_llama_scope_profile_reads(self, page, llama):
        """The profile by scope on the 16-layer Llama-style decoder: the 16 layers' names and
        "(outside scopes)" are drawn as x tick labels wholly inside the chart, and none is under
        the legend (a row under the plot covered the first layers' names, and "(outside
        scopes)" was cut off at the bottom)."""
        _, dash = llama
        _llama_tab(page, dash, "Profile")
        _wait(dash.locator(".tempo-lab-run-button")).first.click()
        chart = _wait(dash.locator(".tempo-lab-scopes .js-plotly-plot"), 240_000)
        assert _charts_drawn(dash.locator(".tempo-lab-scopes"), at_least=1, timeout=60) == [True]
        page.wait_for_timeout(500)
        chart.first.scroll_into_view_if_needed()
        got = chart.first.evaluate(SCOPE_TICKS)
        ticks = {t[0]: t[1:] for t in got["ticks"]}
        assert all(f"layer{k}" in ticks for k in range(16)), sorted(ticks)
        for name, (left, top, right, bottom) in ticks.items():
            assert left >= 0 and top >= 0 and right <= got["width"] and bottom <= got["height"], \
                (name, ticks[name], got["width"], got["height"])
            if got["legend"]:
                gl, gt, gr, gb = got["legend"]
                assert not (left < gr and gl < right and top < gb and gt < bottom), \
                    (name, ticks[name], got["legend"])
        SHOTS.mkdir(exist_ok=True)
        chart.first.screenshot(path=str(SHOTS / "32_llama_scope_profile.png"))


def test_charts_draw_on_ten_fresh_kernels(page, lab):
    """Every chart draws, in ten fresh kernels in a row: a notebook of its own is restarted and
    run ten times, and each time the memory chart and the iteration space (built in tabs that
    are hidden when built) must draw their traces. FigureWidget drew blank about one time in
    four, when its 5 MB script loaded past anywidget's 2 s deadline."""
    url, token, home = lab
    _notebook(home / "charts.ipynb", [SETUP, "view = prog.explore()\nview"])
    page.evaluate("() => { window.jupyterapp.commands.execute('docmanager:open', "
                  "{path: 'charts.ipynb'}); }")
    panel = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)").filter(
        has=page.locator("[data-path='charts.ipynb'], .jp-Notebook")).last
    results = []
    try:
        for trial in range(10):
            # the notebook's kernel is up and idle (the first time: it is still starting)
            page.wait_for_function(
                "() => { const w = window.jupyterapp.shell.currentWidget; "
                "const k = w && w.context && w.context.path === 'charts.ipynb' && "
                "w.sessionContext.session && w.sessionContext.session.kernel; "
                "return !!k && k.status === 'idle'; }", timeout=120_000)
            page.evaluate("() => { const c = window.jupyterapp.commands; "
                          "c.execute('notebook:clear-all-cell-outputs'); "
                          "c.execute('notebook:restart-run-all'); }")
            try:
                page.locator(".jp-Dialog .jp-mod-accept").first.click(timeout=10_000)
            except Exception:
                pass    # no confirmation asked
            dash = panel.locator(".tempo-lab-dashboard").first
            dash.wait_for(timeout=120_000)
            drawn = []
            for tab, inner in (("Memory", None), ("Schedule", "iteration space")):
                dash.locator(".tempo-lab-tabs > .lm-TabBar .lm-TabBar-tab").filter(
                    has_text=tab).first.click()
                if inner:
                    dash.locator(".tempo-lab-schedule .lm-TabBar-tab").filter(
                        has_text=inner).first.click()
                drawn += _charts_drawn(dash.locator(f".tempo-lab-{tab.lower()}"))
            results.append(drawn)
            if trial == 0:
                SHOTS.mkdir(exist_ok=True)
                dash.screenshot(path=str(SHOTS / "17_fresh_kernel_iteration_space.png"))
    finally:
        page.evaluate("() => { window.jupyterapp.commands.execute('application:close'); }")
    blank = sum(d.count(False) + (len(d) < 2) for d in results)
    assert len(results) == 10 and blank == 0, results


def test_explore_is_quick(page):
    """explore() on the 16-layer decoder and on PPO returns within 2 s (tabs build on first
    show)."""
    text = "\n".join(page.locator(".jp-OutputArea-output").all_text_contents())
    took = [float(t) for t in re.findall(r"explore\(\) took ([\d.]+) s", text)]
    assert len(took) == 2 and max(took) <= 2.0, took


def test_no_page_errors(page):
    """Nothing the dashboards, the canvas or the charts did raised in the page."""
    assert page.tl_errors == []
