"""The dashboard in a real browser: JupyterLab on loopback (random port, token), headless
Chromium driven by Playwright, a notebook that runs ``prog.explore()`` on the demo decoder.
Each tab must render its content (DOM checks); screenshots go to ``screenshots/`` (ignored).

Chromium is the system one (``/usr/bin/chromium``, installed by ``.ci/run``); Playwright never
downloads a browser here. Without chromium or Playwright the test skips, except under
``CI=true``, where it fails."""
from __future__ import annotations

import json
import os
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

ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "screenshots"
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


def _need(what: str, ok: bool):
    if not ok:
        (pytest.fail if IN_CI else pytest.skip)(f"browser test needs {what}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _notebook(path: Path):
    cells = [SETUP, "view = prog.explore()\nview"]
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
        yield url, token
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
    url, token = lab
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox", "--disable-gpu",
                                           "--disable-dev-shm-usage"])
        try:
            pg = browser.new_page(viewport={"width": 1400, "height": 1000})
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
            pg.wait_for_selector(".tempo-lab-tabs", timeout=120_000)
            yield pg
        finally:
            browser.close()


def _tab(page, title: str):
    bar = page.locator(".tempo-lab-tabs > .lm-TabBar .lm-TabBar-tab").filter(has_text=title)
    bar.first.click()
    page.wait_for_timeout(300)


def _shot(page, name: str):
    SHOTS.mkdir(exist_ok=True)
    page.locator(".tempo-lab-dashboard").first.screenshot(path=str(SHOTS / f"{name}.png"))


def test_dashboard_tabs_render(page):
    titles = page.locator(".tempo-lab-tabs > .lm-TabBar .lm-TabBar-tab").all_inner_texts()
    assert [t.strip() for t in titles] == list(TABS)

    _tab(page, "Program")
    assert "Program(outputs=(y)" in page.locator(".tempo-lab-overview").inner_text()
    _shot(page, "1_program")

    _tab(page, "SDG")
    page.wait_for_selector(".tempo-lab-sdg svg g.node", timeout=30_000)
    assert page.locator(".tempo-lab-sdg svg g.node").count() >= 20
    assert page.locator(".tempo-lab-sdg svg g.cluster").count() >= 3
    assert "0:t + 1" in page.locator(".tempo-lab-sdg svg").first.text_content()
    _shot(page, "2_sdg")

    _tab(page, "Passes")
    assert page.locator(".tempo-lab-pass-table tr").count() >= 2
    assert page.locator(".tempo-lab-passes svg g.node").count() >= 2
    _shot(page, "3_passes")

    _tab(page, "Schedule")
    assert "for n in 0..N" in page.locator(".tempo-lab-code").inner_text()
    page.locator(".tempo-lab-schedule .lm-TabBar-tab").filter(has_text="isl schedule tree") \
        .first.click()
    page.wait_for_selector(".tempo-lab-tree details", timeout=15_000)
    page.locator(".tempo-lab-schedule .lm-TabBar-tab").filter(has_text="iteration space") \
        .first.click()
    page.wait_for_selector(".tempo-lab-schedule .js-plotly-plot .scatterlayer .point",
                           timeout=30_000)
    assert page.locator(".tempo-lab-schedule .js-plotly-plot .scatterlayer .point").count() > 50
    _shot(page, "4_schedule")

    _tab(page, "Memory")
    page.wait_for_selector(".tempo-lab-memory .js-plotly-plot .barlayer .point",
                           timeout=30_000)
    assert page.locator(".tempo-lab-memory .js-plotly-plot .barlayer .point").count() >= 20
    assert "peak" in page.locator(".tempo-lab-memory .js-plotly-plot").first.inner_text()
    _shot(page, "5_memory")

    _tab(page, "Profile")
    page.wait_for_selector(".tempo-lab-profile .js-plotly-plot .barlayer .point",
                           timeout=30_000)
    assert page.locator(".tempo-lab-profile .js-plotly-plot").count() >= 3
    assert page.locator(".tempo-lab-profile .icicletrace, .tempo-lab-profile "
                        "g.iciclelayer path").count() >= 1
    _shot(page, "6_profile")


def test_selection_is_linked_across_tabs(page):
    picker = page.locator(".tempo-lab-op-picker select")
    label = next(o for o in picker.locator("option").all_inner_texts() if o.startswith("h_in"))
    picker.select_option(label=label)
    _tab(page, "SDG")
    marked = page.locator(".tempo-lab-sdg svg g.node:has([stroke='#d62728'])")
    marked.first.wait_for(timeout=30_000)
    assert marked.count() == 1 and "h_in" in marked.text_content()
    assert "h_in" in page.locator(".tempo-lab-inspector").inner_text()
    _shot(page, "7_selected_sdg")
    _tab(page, "Schedule")
    page.locator(".tempo-lab-schedule .lm-TabBar-tab").filter(has_text="loop code").first.click()
    assert "h_in[n, t] = merge" in page.locator(".tempo-lab-code mark").first.inner_text()
    _tab(page, "Memory")
    _shot(page, "8_selected_memory")
