"""viz: the graph, schedule, kernel and rewrite views — what their SVG/HTML must contain.

The expected content comes from what the scheduler and the renderers must do for each graph
(an ADD node, a kernel per stored reduction, a `for` loop in C), never from copied output.
"""
from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
from html.parser import HTMLParser
from xml.etree import ElementTree

import numpy as np
import pytest

from tinyteach import Context, Tensor
from tinyteach.engine.schedule import create_schedule
from tinyteach.ir.rewrite import record_rewrites

pytest.importorskip("graphviz", reason="viz tests need the graphviz Python package")
pytest.importorskip("pygments", reason="viz tests need pygments")

import viz  # noqa: E402
from viz.figure import INSTALL_DOT  # noqa: E402
from viz.kernel import find_renderers  # noqa: E402

NO_DOT = "graphviz's `dot` is not installed (apt-get install graphviz)"
needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason=NO_DOT)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def inputs(device: str = "CPU") -> tuple[Tensor, Tensor, Tensor]:
    rng = np.random.default_rng(0)
    return tuple(Tensor(rng.standard_normal((4, 4)).astype(np.float32), device=device)
                 for _ in range(3))  # type: ignore[return-value]


def seed_example() -> Tensor:
    a, b, c = inputs()
    return ((a + b) * c).relu().sum(1)


def softmax_example() -> Tensor:
    x = Tensor(np.arange(15, dtype=np.float32).reshape(3, 5), device="CPU")
    return x.softmax(1)


@pytest.fixture
def rows_stored():
    """softmax as three kernels (FUSE_ROWS=0: each row reduction stored), for the drawings of a
    schedule of several kernels (tests/test_fuse_rows.py draws the fused one)."""
    with Context(FUSE_ROWS=0):
        yield


# ---- graph ----

@needs_dot
def test_graph_nodes_show_op_shape_dtype_and_roles() -> None:
    figure = viz.graph(seed_example())
    assert figure.svg is not None and figure.svg.startswith("<svg")
    for text in ("ADD", "MUL", "WHERE", "REDUCE_AXIS sum", "(4, 4) float32", "(4,) float32",
                 "input: a realized buffer", "output, stored by kernel 1", "kernel 1: r_4_4"):
        assert text in figure.svg, text
    assert figure.html.count("<svg") == 1
    assert "stored because it is an output" in figure.html  # the legend


class ImagesAndElements(HTMLParser):
    """The elements of an HTML string as a browser's parser sees them, and each <img>'s URL."""

    def __init__(self, markup: str):
        super().__init__()
        self.tags: list[str] = []
        self.sources: list[str] = []
        self.feed(markup)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag == "img":
            self.sources.append(dict(attrs).get("src") or "")


def drawn_svgs(markup: str) -> list[str]:
    """The SVG documents that the <img> elements of `markup` draw (data: URLs decoded)."""
    prefix = "data:image/svg+xml,"
    sources = ImagesAndElements(markup).sources
    assert all(source.startswith(prefix) for source in sources), sources
    return [urllib.parse.unquote(source[len(prefix):]) for source in sources]


@needs_dot
def test_drawings_are_images_that_an_untrusted_notebook_keeps() -> None:
    """JupyterLab strips an inline <svg> from the HTML of an untrusted notebook, leaving its
    strings (tests/test_viz_browser.py shows it in Chromium): the figure's HTML holds no <svg>
    element, only an <img> whose data: URL decodes to the same drawing, as XML."""
    for figure in (viz.graph(seed_example()), viz.schedule(softmax_example())):
        parsed = ImagesAndElements(figure.html)
        assert "svg" not in parsed.tags and parsed.tags.count("img") == 1
        [drawn] = drawn_svgs(figure.html)
        assert figure.svg is not None
        reference = ElementTree.fromstring(figure.svg)
        image = ElementTree.fromstring(drawn)  # well-formed XML: a browser can draw it
        assert image.attrib == reference.attrib
        assert [e.text for e in image.iter()] == [e.text for e in reference.iter()]
        assert [e.attrib for e in image.iter()] == [e.attrib for e in reference.iter()]
        # graphviz titles each edge "a->b": every edge of the DOT source is drawn
        titles = {e.text for e in image.iter("{http://www.w3.org/2000/svg}title")}
        edges = {f"{a}->{b}" for a, b in re.findall(r"(\w+) -> (\w+)", figure.dot or "")}
        assert edges and edges <= titles, edges - titles


@needs_dot
def test_graph_does_not_realize_the_tensor() -> None:
    out = seed_example()
    before = repr(out)
    viz.graph(out)
    viz.schedule(out)
    viz.kernel(out)
    assert repr(out) == before and "lazy" in before


@needs_dot
def test_graph_colours_nodes_by_kernel_and_stripes_recomputed_ones(rows_stored: None) -> None:
    figure = viz.graph(softmax_example())
    dot = figure.dot or ""
    assert dot.count("subgraph cluster_kernel") == 3
    assert 'style="striped"' in dot  # exp(x - max) is recomputed in two kernels
    assert "recomputed in kernels 2, 3" in (figure.svg or "")
    assert 'shape="cylinder"' in dot and "dashed" in dot  # an input, a constant


def test_graph_folds_movement_chains() -> None:
    a, b, _ = inputs()
    out = (a.reshape(16).reshape(2, 8).permute(1, 0) + b.reshape(8, 2)).sum()
    folded = viz.graph(out).text
    unfolded = viz.graph(out, collapse_movement=False).text
    assert "RESHAPE → PERMUTE" in folded or "RESHAPE → RESHAPE" in folded
    assert len(folded.splitlines()) < len(unfolded.splitlines())


def test_big_graphs_are_drawn_one_box_per_kernel() -> None:
    x = Tensor(np.ones((3, 5), dtype=np.float32), device="CPU")
    for _ in range(6):
        x = x.softmax(1) * 2 + 1
    figure = viz.graph(x, max_nodes=20)
    assert "more than max_nodes=20" in figure.text
    assert "kernel 1:" in figure.text


def deep_chain(depth: int) -> tuple[Tensor, Tensor]:
    """`depth` lazy elementwise ops in a chain over one input: (input, result)."""
    x = Tensor(np.arange(4, dtype=np.float32), device="CPU")
    out = x
    for _ in range(depth // 2):
        out = out * 1.5 + 1
    return x, out


def test_a_20000_deep_lazy_chain_draws_without_recursion() -> None:
    _, out = deep_chain(20_000)
    total = len(out.uop.toposort)
    depth_of: dict[object, int] = {}
    for node in out.uop.toposort:
        depth_of[node] = 1 + max((depth_of[s] for s in node.src), default=0)
    assert depth_of[out.uop] > 20_000  # 20,000 ops, plus the input and the constants' views
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)  # Python's default
    try:
        figure = viz.graph(out)
    finally:
        sys.setrecursionlimit(limit)
    assert f"This graph has {total} nodes and is {depth_of[out.uop]} deep" in figure.text
    drawn = [line for line in figure.text.splitlines() if line.startswith("n")]
    assert 0 < len(drawn) <= 90  # about max_nodes=80 boxes, not 40,000
    assert "left out: computed by nodes not drawn" in figure.text
    assert "CONST 1.5" in figure.text and "MUL" in figure.text and "ADD" in figure.text
    assert "lazy" in repr(out)  # drawing computed nothing


def test_a_cut_graph_says_how_many_nodes_were_left_out() -> None:
    _, out = deep_chain(600)  # deeper than viz plans whole
    nodes = out.uop.toposort
    figure = viz.graph(out, max_nodes=40)
    match = re.search(r"the (\d+) before them are left out", figure.text)
    assert match is not None
    # drawn: the last 40 nodes, the two constants' CONST -> RESHAPE -> EXPAND views they
    # read and the stand-ins for the values coming in from below the cut
    assert int(match[1]) == len(nodes) - 40 - 2 * 3
    drawn = [line for line in figure.text.splitlines() if re.match(r"n\d+:", line)]
    stand_ins = [line for line in drawn if "left out: computed by nodes not drawn" in line]
    assert len(stand_ins) == 1  # a chain enters the drawn part through one value
    assert len(drawn) == 40 + 2 + 1  # constants folded into one box each


def test_a_cut_graph_draws_no_more_than_can_be_planned(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: object) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # the text view: `dot` takes minutes on 200 nodes
    _, out = deep_chain(1_000)
    figure = viz.graph(out, max_nodes=5_000)  # asks for more than viz plans at once
    assert "drawn are the 200 nodes nearest the result" in figure.text
    assert "left out: computed by nodes not drawn" in figure.text


def test_launch_graph_draws_kernels_and_buffers() -> None:
    from tinyteach.engine.realize import record_launches

    a, b, _ = inputs()
    with record_launches() as launches:
        (a @ b).relu().realize()
    figure = viz.launch_graph(launches)
    noun = "launch" if len(launches) == 1 else "launches"
    # two inputs, and one buffer written by each launch
    assert figure.text.splitlines()[0] == (f"the kernels that ran: {len(launches)} {noun}, "
                                           f"{len(launches) + 2} buffers drawn")
    for number, launch in enumerate(launches):
        assert f"k{number + 1}: {launch.item.name} on CPU" in figure.text
    assert "b0: buffer (4, 4) float32 on CPU  (input" in figure.text
    assert "b1: buffer (4, 4) float32 on CPU  (input" in figure.text
    assert "reads b0, b1" in figure.text  # the matmul reads both inputs


def test_launch_graph_draws_a_rewritten_buffer_twice() -> None:
    from tinyteach.engine.realize import record_launches
    from viz.launches import build_launch_graph

    w = Tensor(np.zeros(3, dtype=np.float32), device="CPU")
    with record_launches() as launches:
        w.assign(w + 1).realize()
        w.assign(w * 2).realize()
    np.testing.assert_allclose(w.numpy(), [2.0, 2.0, 2.0])
    graph = build_launch_graph(launches)
    memory = launches[0].buffers[0].storage  # assign() writes into the tensor's own memory
    versions = [node for node in graph.buffers if node.buffer.storage is memory]
    assert len(versions) == 3  # before, after the first write, after the second
    assert [v.writer for v in versions] == [None, 0, 1]
    assert graph.launches[1].reads == [versions[1]]  # the second step reads the first's result
    assert "over earlier contents" in viz.launch_graph(launches).text


def test_launch_graph_draws_the_last_launches_of_a_long_recording() -> None:
    from tinyteach.engine.realize import record_launches

    x = Tensor(np.ones(4, dtype=np.float32), device="CPU")
    with record_launches() as launches:
        for _ in range(5):
            x = (x + 1).realize()
    np.testing.assert_allclose(x.numpy(), np.full(4, 6.0))
    figure = viz.launch_graph(launches, max_launches=2)
    assert "the first 3 launches are left out: drawn are the last 2" in figure.text
    assert "k4: E_4 on CPU" in figure.text and "k5: E_4 on CPU" in figure.text
    assert "k3:" not in figure.text
    assert "written by an earlier launch (left out)" in (figure.dot or "")


def test_limits_must_be_positive_and_launches_must_be_launches() -> None:
    out = seed_example()
    with pytest.raises(ValueError, match="max_nodes must be at least 1"):
        viz.graph(out, max_nodes=0)
    with pytest.raises(ValueError, match="max_kernels must be at least 1"):
        viz.schedule(out, max_kernels=0)
    with pytest.raises(ValueError, match="max_launches must be at least 1"):
        viz.launch_graph([], max_launches=-1)
    with pytest.raises(TypeError, match="what record_launches"):
        viz.launch_graph([out])  # type: ignore[list-item]


def test_a_too_deep_lazy_tensor_displays_without_planning() -> None:
    pytest.importorskip("IPython")
    from viz.magic import tensor_html

    _, out = deep_chain(1_000)
    html_text = tensor_html(out)
    assert f"lazy: a graph of {len(out.uop.toposort)} nodes" in html_text
    assert "not computed yet" in html_text


def test_schedule_draws_the_last_kernels_of_a_long_schedule(rows_stored: None) -> None:
    x = Tensor(np.ones((3, 5), dtype=np.float32), device="CPU")
    for _ in range(4):
        x = x.softmax(1) * 2 + 1
    items, _ = create_schedule([x.uop], "CPU")
    assert len(items) > 5
    figure = viz.schedule(x, max_kernels=5)
    assert (figure.dot or "").count("subgraph cluster_k") == 5
    assert f"drawn are the last 5, the first {len(items) - 5} are left out" in figure.text
    assert f"kernel {len(items)}: {items[-1].name}" in figure.text
    assert "kernel 1:" not in figure.text


# ---- schedule ----

@needs_dot
def test_schedule_has_one_cluster_per_kernel_and_every_reason(rows_stored: None) -> None:
    out = softmax_example()
    items, _ = create_schedule([out.uop], "CPU")
    figure = viz.schedule(out)
    assert (figure.dot or "").count("subgraph cluster_k") == len(items) == 3
    for item in items:
        assert item.boundary_reason in figure.text
        for note in item.fusions + item.input_reasons:
            assert note in figure.text
    assert "broadcast back" in (figure.svg or "")
    assert "used by 2 kernels:" in (figure.svg or "")


def test_schedule_accepts_items_and_launches() -> None:
    out = seed_example()
    items, _ = create_schedule([out.uop], "CPU")
    assert "r_4_4" in viz.schedule(items).text
    from tinyteach.engine.realize import record_launches

    with record_launches() as launches:
        out.realize()
    assert "r_4_4" in viz.schedule(launches).text


# ---- kernel ----

def test_kernel_shows_every_stage_and_every_renderer() -> None:
    figure = viz.kernel(seed_example())
    assert "DEFINE_GLOBAL" in figure.text and "SINK" in figure.text  # the AST
    assert "RANGE" in figure.text and "ACCUMULATE" in figure.text   # the linear program
    assert "launch sizes: global (4,)" in figure.text
    # a sum of 4 is too short to split into vector lanes (lower.SIMD_MIN_LOOP); a long
    # contiguous row is split (opt/ / codegen/lower.py)
    assert "vector lanes" not in figure.text
    rows = Tensor(np.ones((4, 64), dtype=np.float32), device="CPU")
    assert "optimizations: vector lanes: the sum over ridx0" in viz.kernel(rows.sum(1)).text
    with Context(NOOPT=1):
        assert "optimizations: none" in viz.kernel(seed_example()).text
    assert "void r_4_4(" in figure.text and "for (int gidx0 = 0; gidx0 < 4" in figure.text
    for found in find_renderers():
        assert f"{found.language} source" in figure.text
    assert '<div class="tinyteach-source highlight"' in figure.html
    assert "<span style=" in figure.html  # pygments colours, inline


def test_a_renderer_that_fails_to_import_is_named_with_its_error(monkeypatch) -> None:
    """A broken module in tinyteach/render/ does not break viz.kernel, and does not vanish
    either: its own section names the file and the error."""
    import sys

    kernel_module = sys.modules["viz.kernel"]  # (viz.kernel is also the function)
    monkeypatch.setitem(sys.modules, "tinyteach.render.wgsl", None)  # its import now fails
    renderers, failures = kernel_module.discover_renderers()
    assert [f.module for f in failures] == ["wgsl"]
    assert "WGSL" not in [r.language for r in renderers] and renderers
    text = viz.kernel(seed_example()).text
    assert "tinyteach/render/wgsl.py gave no renderer: ModuleNotFoundError: " in text
    assert "C source" in text  # the others are still shown


def test_kernel_index_and_schedule_item(rows_stored: None) -> None:
    out = softmax_example()
    items, _ = create_schedule([out.uop], "CPU")
    assert "kernel E_3_5" in viz.kernel(out).title
    assert "a max over axes" in viz.kernel(out, index=0).text
    assert viz.kernel(items[1]).text == viz.kernel(out, index=1).text


def test_kernel_of_a_realized_tensor_says_so() -> None:
    a, _, _ = inputs()
    assert "already realized" in viz.kernel(a).text


# ---- rewrites ----

def test_rewrite_explorer_steps_through_rules() -> None:
    pytest.importorskip("ipywidgets")
    x = Tensor(np.arange(24, dtype=np.float32).reshape(2, 3, 4), device="CPU")
    # a detour through (6, 4): the views leave out trivial terms themselves (view.index_add),
    # so a plain permute leaves the rewriter one step; this view leaves it several
    explorer = viz.rewrites(x.reshape(6, 4).reshape(2, 3, 4).permute(2, 0, 1).sum(0))
    steps = explorer.steps
    assert len(steps) > 3
    assert explorer.step == 0 and html.escape(steps[0].rule) in explorer.view.value
    first = explorer.view.value
    explorer.next.click()
    assert explorer.step == 1 and explorer.slider.value == 1
    assert html.escape(steps[1].rule) in explorer.title.value and explorer.view.value != first
    explorer.slider.value = len(steps) - 1
    assert f"step {len(steps)} of {len(steps)}" in explorer.view.value
    explorer.next.click()  # clamped at the end
    assert explorer.step == len(steps) - 1
    explorer.previous.click()
    assert explorer.step == len(steps) - 2
    assert "before:" in explorer.view.value and "after:" in explorer.view.value
    bundle = explorer._repr_mimebundle_()
    assert bundle["text/plain"].startswith("rewrite explorer: step")
    # where no widget runs (untrusted, or a static viewer): the step shown, drawn, as HTML
    step = html.escape(steps[len(steps) - 2].rule)
    assert step in bundle["text/html"] and "application/vnd.jupyter.widget-view+json" in bundle
    if shutil.which("dot"):
        assert len(drawn_svgs(bundle["text/html"])) == 2  # before and after


def test_rewrite_formulas_of_deep_expressions_are_cut_without_recursion() -> None:
    import importlib

    from tinyteach.dtype import dtypes
    from tinyteach.ir.uop import Ops, UOp

    rewrites_module = importlib.import_module("viz.rewrites")  # `viz.rewrites` is the function
    index = UOp(Ops.RANGE, dtypes.int32, (), ("g", 0, 4))
    for _ in range(5_000):
        index = UOp(Ops.ADD, dtypes.int32, (index, UOp(Ops.CONST, dtypes.int32, (), 1)))
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)  # Python's default
    try:
        formula = rewrites_module.expression(index)
    finally:
        sys.setrecursionlimit(limit)
    # 13 levels are written out (depths 0..12); below them everything is `…`
    assert formula == "(" * 12 + "(…+…)" + "+1)" * 12
    short = UOp(Ops.ADD, dtypes.int32, (UOp(Ops.RANGE, dtypes.int32, (), ("r", 1, 4)),
                                        UOp(Ops.CONST, dtypes.int32, (), 3)))
    assert rewrites_module.expression(short) == "(ridx1+3)"


def test_rewrites_from_a_recorded_log() -> None:
    pytest.importorskip("ipywidgets")
    from tinyteach.codegen.lower import lower
    from tinyteach.opt.heuristic import heuristic_plan

    items, _ = create_schedule([seed_example().uop], "CPU")
    with record_rewrites() as log:
        lower(items[0].ast, heuristic_plan(items[0].ast))
    explorer = viz.rewrites(log)
    assert [s.rule for s in explorer.steps] == [s.rule for s in log.steps]


# ---- without `dot` ----

def test_fallback_without_dot(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no `dot` anywhere on PATH
    for figure in (viz.graph(seed_example()), viz.schedule(softmax_example())):
        assert figure.svg is None
        assert "apt-get install graphviz" in figure.html
        assert "<pre" in figure.html and "kernel 1" in figure.html
    assert "apt-get install graphviz" in INSTALL_DOT


def test_fallback_in_the_widget(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    pytest.importorskip("ipywidgets")
    monkeypatch.setenv("PATH", str(tmp_path))
    explorer = viz.rewrites(seed_example())
    assert "apt-get install graphviz" in explorer.view.value


# ---- determinism ----

DETERMINISM_SCRIPT = """
import hashlib, numpy as np, viz
from tinyteach import Context, Tensor
rng = np.random.default_rng(0)
a, b, c = (Tensor(rng.standard_normal((4, 4)).astype(np.float32), device="CPU") for _ in range(3))
out = ((a + b) * c).relu().sum(1)
x = Tensor(np.arange(15, dtype=np.float32).reshape(3, 5), device="CPU").softmax(1)
from tinyteach.engine.realize import record_launches
with record_launches() as launches:
    x.softmax(0).realize()
parts = [viz.graph(out).html, viz.graph(x).html, viz.schedule(x).html, viz.kernel(out).html,
         viz.rewrites(out).view.value, viz.launch_graph(launches).html]
print(hashlib.sha256("".join(parts).encode()).hexdigest())
"""


def test_output_is_byte_identical_across_processes() -> None:
    pytest.importorskip("ipywidgets")
    env = {**os.environ, "PYTHONHASHSEED": "random"}
    digests = [subprocess.run([sys.executable, "-c", DETERMINISM_SCRIPT], capture_output=True,
                              text=True, check=True, cwd=ROOT, env=env).stdout
               for _ in range(2)]
    assert digests[0] == digests[1] and len(digests[0].strip()) == 64


def test_same_input_same_output_in_one_process() -> None:
    out = softmax_example()
    assert viz.graph(out).html == viz.graph(out).html
    assert viz.schedule(out).html == viz.schedule(softmax_example()).html
    assert "0x" not in viz.graph(out).html  # no memory addresses


def test_the_source_shown_as_what_ran_is_the_source_that_ran():
    """viz.kernel on a launch shows the source its device compiled, verbatim: a CPU matmul's
    explicit fused multiply-adds (issue 24: a default CRenderer re-rendered it without them)."""
    from tinyteach.engine.realize import record_launches
    from viz.kernel import KernelInfo, kernel_stages

    a = Tensor(np.ones((64, 64), np.float32)).realize()
    b = Tensor(np.ones((64, 64), np.float32) * 2).realize()
    with record_launches() as launches:
        (a @ b).realize()
    launch = launches[-1]
    stages = kernel_stages(KernelInfo(launch.item, None, launch.runner, launch.seconds),
                           languages=["C"])
    ran = [text for heading, _, text in stages.sections if heading.endswith("what ran")]
    assert ran == [launch.runner.source]
