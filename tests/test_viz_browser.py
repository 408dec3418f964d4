"""End to end in a real browser: what a student sees in JupyterLab, before and after running a cell.

- First contact: every chapter, opened as a fresh clone's student opens it (not trusted, no cell
  run, no kernel), shows each of its stored drawings (viz's graphs, schedules, thread maps and
  fragment layouts) as a drawn image, not as the strings of an SVG that JupyterLab's sanitizer
  took apart. A stored inline <svg> is shown taken apart, so the test sees an untrusted notebook.
- After running: a notebook that uses viz and `%%tinyteach` runs in a kernel, and the graph
  image, the highlighted source, the rewrite widget and the magic's own graph render.
- A quiet start: with the course's settings (binder/overrides.json) JupyterLab asks nothing
  about Jupyter news.

Launch details (../shared/ENVIRONMENT.md): Chromium is /usr/bin/chromium, never a Playwright
download; JupyterLab listens on 127.0.0.1 with a token and exposes `window.jupyterapp`, so the
test opens notebooks through its commands and can wait until a kernel is connected (a click
before that is lost). `notebook_starts_kernel=False`: opening a chapter starts no kernel.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]
# every cell drawn, not only those in view (JupyterLab 4 renders cells lazily by default)
TEST_SETTINGS = {"@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"}}
KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}
NOTEBOOK_CELLS = [
    "%load_ext tinyteach\nimport numpy as np\nimport viz\nfrom tinyteach import Tensor\n"
    "rng = np.random.default_rng(0)\n"
    "a, b, c = (Tensor(rng.standard_normal((4, 4)).astype(np.float32)) for _ in range(3))\n"
    "out = ((a + b) * c).relu().sum(1)",
    "viz.graph(out)",
    "viz.kernel(out, languages=['C'])",
    "viz.rewrites(out)",
    "%%tinyteach --show kernels,source,graph\nout",
]
# the drawings in a stored output: viz wraps each in one of these (viz/figure.py, threads.py)
DRAWING = re.compile(r'<div class="tinyteach-(?:graph|threads)">')
KERNEL_CONNECTED = """() => {
  const app = window.jupyterapp;
  const panel = app && app.shell.currentWidget;
  const session = panel && panel.sessionContext && panel.sessionContext.session;
  const kernel = session && session.kernel;
  return !!kernel && kernel.connectionStatus === 'connected' && kernel.status === 'idle';
}"""
# opens a notebook with no kernel, waits until its drawings are in the page and decoded, and
# describes each drawing: images (with their decoded width), inline <svg>s, and stray text
OPEN_AND_DESCRIBE = """async ([path, expected]) => {
  const app = window.jupyterapp;
  const panel = await app.commands.execute('docmanager:open', {path, factory: 'Notebook',
      kernelPreference: {shouldStart: false, shouldReuse: false}});
  await panel.context.ready;
  await panel.revealed;
  const node = panel.content.node;
  const drawings = () => node.querySelectorAll('.tinyteach-graph, .tinyteach-threads');
  const deadline = Date.now() + 30000;
  while (drawings().length < expected && Date.now() < deadline) {
    await new Promise(resolve => setTimeout(resolve, 100));
  }
  const images = [...node.querySelectorAll('.jp-OutputArea-output img')];
  await Promise.all(images.map(image => image.decode().catch(() => null)));
  const cells = panel.content.model.cells;
  const trusted = [...Array(cells.length).keys()].some(i => cells.get(i).trusted);
  const described = [...drawings()].map(d => ({
    images: [...d.querySelectorAll('img')].map(image => image.naturalWidth),
    svgs: d.querySelectorAll('svg').length,
    text: d.innerText.trim().slice(0, 120)}));
  panel.dispose();
  return {trusted, drawings: described};
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


def stored_drawings(notebook: Path) -> int:
    """How many viz drawings the stored outputs of `notebook` hold."""
    count = 0
    for cell in json.loads(notebook.read_text())["cells"]:
        for output in cell.get("outputs", []):
            markup = output.get("data", {}).get("text/html", "")
            count += len(DRAWING.findall("".join(markup)))
    return count


def explorers_without_html(notebook: Path) -> int:
    """Stored rewrite explorers (viz.rewrites) with no HTML: untrusted, they show as one line of
    text, since JupyterLab runs no widget there."""
    count = 0
    for cell in json.loads(notebook.read_text())["cells"]:
        for output in cell.get("outputs", []):
            text = "".join(output.get("data", {}).get("text/plain", ""))
            count += text.startswith("rewrite explorer") and "text/html" not in output["data"]
    return count


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


def _write_notebooks(root: Path) -> None:
    """Copies of the chapters, the demo that runs, and a probe: a stored output with an inline
    <svg>, which an untrusted notebook shows taken apart."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    for chapter in CHAPTERS:
        shutil.copy(chapter, root / chapter.name)
    demo = new_notebook(cells=[new_code_cell(source) for source in NOTEBOOK_CELLS],
                        metadata={"kernelspec": KERNELSPEC})  # else Lab asks which kernel
    nbformat.write(demo, root / "demo.ipynb")
    svg = ('<svg xmlns="http://www.w3.org/2000/svg" width="40" height="20"><text x="2" y="15">'
           "stripped</text></svg>")
    probe = new_code_cell("probe")
    probe.outputs = [new_output("display_data", data={
        "text/html": f'<div class="tinyteach-graph">{svg}</div>', "text/plain": "probe"})]
    nbformat.write(new_notebook(cells=[probe], metadata={"kernelspec": KERNELSPEC}),
                   root / "probe.ipynb")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A JupyterLab server on 127.0.0.1 with the course's settings, serving copies of the
    chapters in a fresh Jupyter data folder (nothing trusted); yields (base url, token)."""
    root = tmp_path_factory.mktemp("lab")
    _write_notebooks(root)
    settings = root / "app_settings"
    settings.mkdir()
    course = json.loads((ROOT / "binder" / "overrides.json").read_text())
    (settings / "overrides.json").write_text(json.dumps({**course, **TEST_SETTINGS}))
    token, port = secrets.token_hex(16), _free_port()
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
           "JUPYTER_DATA_DIR": str(root / "data"),  # its own notebook signatures: none trusted
           "JUPYTER_CONFIG_DIR": str(root / "config"),
           "JUPYTERLAB_SETTINGS_DIR": str(root / "user_settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(root / "workspaces")}
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1",
               f"--port={port}", f"--IdentityProvider.token={token}",
               f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True",
               "--LabApp.notebook_starts_kernel=False", f"--LabApp.app_settings_dir={settings}"]
    if os.geteuid() == 0:
        command.append("--allow-root")  # CI runs as root
    log = open(root / "lab.log", "wb")  # noqa: SIM115 - closed below
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_for_server(f"{base}/api/status?token={token}", server, root / "lab.log", 60)
        yield base, token
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            yield chromium
        finally:
            chromium.close()


def open_lab(browser: Any, lab: tuple[str, str]) -> Any:
    """A page with JupyterLab loaded and its layout restored."""
    base, token = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{base}/lab?token={token}")
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell", timeout=60_000)
    page.evaluate("() => window.jupyterapp.restored")
    return page


def test_every_chapter_shows_its_stored_drawings_before_any_cell_runs(
        browser: Any, lab: tuple[str, str]) -> None:
    page = open_lab(browser, lab)
    probe = page.evaluate(OPEN_AND_DESCRIBE, ["probe.ipynb", 1])
    assert not probe["trusted"]
    assert probe["drawings"] == [{"images": [], "svgs": 0, "text": "stripped"}], probe
    problems = []
    for chapter in CHAPTERS:
        expected = stored_drawings(chapter)
        if explorers_without_html(chapter):
            problems.append(f"{chapter.name}: {explorers_without_html(chapter)} rewrite "
                            "explorer(s) stored with no HTML to show untrusted")
        seen = page.evaluate(OPEN_AND_DESCRIBE, [chapter.name, expected])
        assert not seen["trusted"], chapter.name
        if len(seen["drawings"]) != expected:
            problems.append(f"{chapter.name}: {len(seen['drawings'])} of {expected} drawings")
        for number, drawing in enumerate(seen["drawings"], start=1):
            drawn = len(drawing["images"]) == 1 and drawing["images"][0] > 0
            if not drawn or drawing["svgs"] or drawing["text"]:
                problems.append(f"{chapter.name}, drawing {number}: {drawing}")
    page.close()
    assert not problems, "\n".join(problems)


def test_notebook_renders_graph_source_and_widget(browser: Any, lab: tuple[str, str]) -> None:
    page = open_lab(browser, lab)
    # opened with a kernel (the server starts none by itself); a kernel started later, with
    # changeKernel, leaves the widget "Loading widget..."
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:open', {path: "
                  "'demo.ipynb', factory: 'Notebook', kernelPreference: {shouldStart: true, "
                  "name: 'python3'}})")
    page.wait_for_function(KERNEL_CONNECTED, timeout=90_000)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    outputs = ".jp-OutputArea-output"
    page.wait_for_selector(f"{outputs} .tinyteach-graph img", timeout=60_000)
    page.wait_for_selector(f"{outputs} .tinyteach-source span[style]", timeout=60_000)
    page.wait_for_selector(f"{outputs} .widget-slider", timeout=60_000)
    page.wait_for_selector(f"{outputs} >> text=kernel launch", timeout=60_000)
    drawing = page.get_attribute(f"{outputs} .tinyteach-graph img >> nth=0", "src") or ""
    assert drawing.startswith("data:image/svg+xml,")
    svg = urllib.parse.unquote(drawing)
    assert "REDUCE_AXIS" in svg and "kernel 1: r_4_4" in svg
    source = page.inner_text(f"{outputs} .tinyteach-source >> nth=0")
    assert "void r_4_4(" in source
    colour = page.eval_on_selector(f"{outputs} .tinyteach-source span[style]",
                                   "e => getComputedStyle(e).color")
    assert colour not in ("rgb(0, 0, 0)", "")  # highlighted, not plain
    widget_text = page.inner_text(f"{outputs} .jupyter-widgets >> nth=0")
    assert "rewrite explorer" in widget_text or "step" in widget_text
    # the last cell, %%tinyteach --show graph: the kernels that ran, drawn
    magic = page.locator(".jp-CodeCell").nth(len(NOTEBOOK_CELLS) - 1)
    magic.locator(".tinyteach-graph img").first.wait_for(timeout=60_000)
    assert "the kernels that ran and the buffers between them" in magic.inner_text()
    widths = magic.locator(".tinyteach-graph img").evaluate_all(
        "images => images.map(image => image.naturalWidth)")
    assert widths and all(width > 0 for width in widths), widths
    page.close()


def test_no_news_popup_with_the_course_settings(browser: Any, lab: tuple[str, str]) -> None:
    """JupyterLab asks "Would you like to get notified about official Jupyter news?" a moment
    after it starts, unless fetchNews is set (binder/overrides.json sets it to "false")."""
    page = open_lab(browser, lab)
    page.wait_for_timeout(5000)  # without the setting, it shows by then (seen in Chromium)
    assert page.locator("text=official Jupyter news").count() == 0
    page.close()
