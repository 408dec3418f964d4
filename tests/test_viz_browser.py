"""End to end in a real browser: JupyterLab runs a notebook that uses viz and `%%tinyteach`, and
Debian's Chromium (driven by Playwright) checks that the graph SVG, the highlighted source and
the rewrite widget actually rendered.

Launch details (../shared/ENVIRONMENT.md): Chromium is /usr/bin/chromium, never a Playwright
download; JupyterLab listens on 127.0.0.1 with a token and exposes `window.jupyterapp`, so the
test can wait until the kernel is connected before Run All (a click before that is lost).
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]
OVERRIDES = {
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false",
                                                    "checkForUpdates": False},
    "@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"},
}
NOTEBOOK_CELLS = [
    "%load_ext tinyteach\nimport numpy as np\nimport viz\nfrom tinyteach import Tensor\n"
    "rng = np.random.default_rng(0)\n"
    "a, b, c = (Tensor(rng.standard_normal((4, 4)).astype(np.float32)) for _ in range(3))\n"
    "out = ((a + b) * c).relu().sum(1)",
    "viz.graph(out)",
    "viz.kernel(out, languages=['C'])",
    "viz.rewrites(out)",
    "%%tinyteach --show kernels,source\nout",
]
KERNEL_CONNECTED = """() => {
  const app = window.jupyterapp;
  const panel = app && app.shell.currentWidget;
  const session = panel && panel.sessionContext && panel.sessionContext.session;
  const kernel = session && session.kernel;
  return !!kernel && kernel.connectionStatus === 'connected' && kernel.status === 'idle';
}"""


def _missing() -> str | None:
    if not os.path.exists(CHROMIUM):
        return "Debian's chromium is not installed (apt-get install chromium)"
    if shutil.which("dot") is None:
        return "graphviz's dot is not installed (apt-get install graphviz)"
    for module in ("playwright", "jupyterlab", "ipywidgets", "nbformat"):
        try:
            __import__(module)
        except ImportError:
            return f"{module} is not installed (pip install -e '.[test]')"
    return None


pytestmark = [pytest.mark.slow, pytest.mark.skipif(_missing() is not None,
                                                   reason=_missing() or "")]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_server(url: str, server: subprocess.Popen[bytes], log: Path,
                     seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"JupyterLab exited while starting:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"JupyterLab did not answer at {url}")


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A JupyterLab server on 127.0.0.1 serving tmp_path; yields (base url, token)."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    notebook = new_notebook(cells=[new_code_cell(source) for source in NOTEBOOK_CELLS],
                            metadata={"kernelspec": kernelspec})  # else Lab asks which kernel
    nbformat.write(notebook, tmp_path / "demo.ipynb")
    settings = tmp_path / "app_settings"
    settings.mkdir()
    (settings / "overrides.json").write_text(json.dumps(OVERRIDES))
    token, port = secrets.token_hex(16), _free_port()
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
           "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "user_settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces")}
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1",
               f"--port={port}", f"--IdentityProvider.token={token}",
               f"--ServerApp.root_dir={tmp_path}", "--LabApp.expose_app_in_browser=True",
               f"--LabApp.app_settings_dir={settings}"]
    if os.geteuid() == 0:
        command.append("--allow-root")  # CI runs as root
    log = open(tmp_path / "lab.log", "wb")  # noqa: SIM115 - closed below
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_for_server(f"{base}/api/status?token={token}", server, tmp_path / "lab.log", 60)
        yield base, token
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def test_notebook_renders_graph_source_and_widget(lab: tuple[str, str]) -> None:
    from playwright.sync_api import sync_playwright

    base, token = lab
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{base}/lab/tree/demo.ipynb?token={token}")
            page.wait_for_function(KERNEL_CONNECTED, timeout=90_000)
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
            outputs = ".jp-OutputArea-output"
            page.wait_for_selector(f"{outputs} .tinyteach-graph svg", timeout=60_000)
            page.wait_for_selector(f"{outputs} .tinyteach-source span[style]", timeout=60_000)
            page.wait_for_selector(f"{outputs} .widget-slider", timeout=60_000)
            page.wait_for_selector(f"{outputs} >> text=kernel launch", timeout=60_000)
            svg_text = page.text_content(f"{outputs} .tinyteach-graph svg >> nth=0") or ""
            assert "REDUCE_AXIS" in svg_text and "kernel 1: r_4_4" in svg_text
            source = page.inner_text(f"{outputs} .tinyteach-source >> nth=0")
            assert "void r_4_4(" in source
            colour = page.eval_on_selector(f"{outputs} .tinyteach-source span[style]",
                                           "e => getComputedStyle(e).color")
            assert colour not in ("rgb(0, 0, 0)", "")  # highlighted, not plain
            widget_text = page.inner_text(f"{outputs} .jupyter-widgets >> nth=0")
            assert "rewrite explorer" in widget_text or "step" in widget_text
        finally:
            browser.close()
