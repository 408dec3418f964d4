"""The IPython extension: `%load_ext tinyteach`, `%%tinyteach`, `%tinyteach` and rich display,
driven through a real `IPython.core.interactiveshell.InteractiveShell`."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("IPython", reason="the magic tests need IPython")
pytest.importorskip("pygments", reason="the magic tests need pygments")

from IPython.core.interactiveshell import InteractiveShell  # noqa: E402
from IPython.utils.capture import capture_output  # noqa: E402

NO_DOT = "graphviz's `dot` is not installed (apt-get install graphviz)"
needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason=NO_DOT)

SETUP = """
import numpy as np
from tinyteach import Tensor
rng = np.random.default_rng(0)
a, b, c = (Tensor(rng.standard_normal((4, 4)).astype(np.float32), device="CPU") for _ in range(3))
"""


@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "tinyteach")
    assert ip.run_cell(SETUP).success
    yield ip
    from viz.magic import unload_ipython_extension

    unload_ipython_extension(ip)


def run(shell: InteractiveShell, code: str) -> tuple[Any, list[dict[str, str]], str]:
    with capture_output() as captured:
        result = shell.run_cell(code, store_history=False)
    result.raise_error()
    return result, [output.data for output in captured.outputs], captured.stdout


def test_cell_magic_shows_the_kernels_it_launched(shell: InteractiveShell) -> None:
    _, outputs, _ = run(shell, "%%tinyteach\nout = ((a + b) * c).relu().sum(1)\nout")
    report = outputs[0]
    assert report["text/plain"].startswith("the cell's value was a lazy Tensor")
    assert "1 kernel launch (1 distinct) on CPU" in report["text/plain"]
    html = report["text/html"]
    assert "r_4_4" in html and "it is an output: realize() asked for it" in html
    assert "elementwise ops fused into the reduction&#x27;s input" in html
    # the highlighted C source (after an attribute line, the lexer leaves the name unstyled)
    assert any(form in html for form in ("void r_4_4(", "r_4_4</span>(", "</span>r_4_4("))
    assert " us" in html
    assert shell.user_ns["out"].numpy().shape == (4,)  # the cell really ran


def test_cell_magic_options(shell: InteractiveShell) -> None:
    code = ("%%tinyteach --device NUMPY --show kernels,schedule,graph,kernel\n"
            "x = Tensor([[1.0, 2.0], [3.0, 4.0]])\n(x * x).sum(0)")
    _, outputs, _ = run(shell, code)
    html = outputs[0]["text/html"]
    assert "on NUMPY" in html
    assert "the schedule" in html and "the lazy graph" in html and "every stage of" in html
    assert html.count("<svg") >= 2
    assert "source of" not in html  # `source` was not asked for


def test_cell_magic_counts_several_kernels(shell: InteractiveShell) -> None:
    code = "%%tinyteach --show kernels\ny = (a @ b).softmax(1)\ny.realize()\nz = y + 1"
    _, outputs, _ = run(shell, code)
    text = outputs[0]["text/plain"]
    assert "kernel launches" in text
    assert "reduction" in text
    assert shell.user_ns["z"] is not None


def test_line_magic_does_not_keep_the_value(shell: InteractiveShell) -> None:
    result, outputs, _ = run(shell, "%tinyteach --show kernels,source (a * 2).sum()")
    assert result.result is None
    text = outputs[0]["text/plain"]
    assert "the value is not kept" in text and "r_1_4_4" in text


def test_line_magic_keeps_a_named_tensor_lazy(shell: InteractiveShell) -> None:
    run(shell, "lazy = (a + c).max(1)")
    run(shell, "%tinyteach lazy")
    assert "lazy" in repr(shell.user_ns["lazy"])


def test_interpreted_device_shows_the_c_it_would_be(shell: InteractiveShell) -> None:
    _, outputs, _ = run(shell, "%tinyteach --device NUMPY Tensor([1.0, 2.0]).exp()")
    html = outputs[0]["text/html"]
    plain = re.sub(r"<[^>]+>", "", html)
    assert "NUMPY interprets the kernel" in plain and "void E_2(" in plain


def test_bad_options_are_usage_errors(shell: InteractiveShell) -> None:
    with capture_output():
        result = shell.run_cell("%tinyteach --show nonsense a")
    assert result.error_in_exec is not None and "nonsense" in str(result.error_in_exec)
    with capture_output():
        result = shell.run_cell("%tinyteach --device NOPE a")
    assert result.error_in_exec is not None


def test_rich_display_of_tensors(shell: InteractiveShell) -> None:
    lazy = shell.ev("(a + b).sum(1)")
    data, _ = shell.display_formatter.format(lazy)
    assert "lazy: 1 kernel will run when it is realized" in data["text/html"]
    assert "not computed yet" in data["text/html"]
    realized = shell.ev("Tensor([1.5, 2.5, 3.5])")
    html = shell.display_formatter.format(realized)[0]["text/html"]
    for text in ("(3,)", "float32", "CPU", "realized", "1.5", "3.5"):
        assert text in html


def test_rich_display_of_schedule_items(shell: InteractiveShell) -> None:
    item = shell.ev("__import__('tinyteach.engine.schedule').engine.schedule.create_schedule("
                    "[(a + b).sum(1).uop], 'CPU')[0][0]")
    html = shell.display_formatter.format(item)[0]["text/html"]
    assert "linear program" in html and "C source" in html
    launches = shell.ev("__import__('tinyteach.engine.realize').engine.realize.record_launches")
    with launches() as recorded:
        shell.ev("(a - b).realize()")
    html = shell.display_formatter.format(recorded[0])[0]["text/html"]
    assert "this is what ran" in html and " us" in html


# ---- --show graph: the kernels that ran ----

def svg_titles(html: str) -> list[str]:
    """The node and edge names of the SVGs in `html` (graphviz writes each as a <title>)."""
    titles = re.findall(r"<title>([^<]*)</title>", html)
    return [title.replace("&#45;&gt;", "->") for title in titles]


def names_that_run(shell: InteractiveShell, code: str) -> list[str]:
    """The kernels `code` launches, recorded outside the magic."""
    from tinyteach.engine.realize import record_launches

    with record_launches() as launches:
        shell.ev(code)
    return [launch.item.name for launch in launches]


@needs_dot
def test_show_graph_draws_the_kernels_of_a_cell_ending_in_numpy(shell: InteractiveShell) -> None:
    expected = names_that_run(shell, "(a @ b).softmax(1).numpy()")
    _, outputs, _ = run(shell, "%%tinyteach --show graph\ny = (a @ b).softmax(1)\ny.numpy()")
    html, text = outputs[0]["text/html"], outputs[0]["text/plain"]
    assert "the kernels that ran and the buffers between them" in html
    assert "the lazy graph" not in html  # the value is a numpy array, not a lazy Tensor
    assert f"the kernels that ran: {len(expected)} launches" in text
    titles = svg_titles(html)
    kernels = [f"k{n + 1}" for n in range(len(expected))]
    assert [t for t in titles if re.fullmatch(r"k\d+", t)] == kernels  # one box per launch
    for number, name in enumerate(expected):
        assert f"k{number + 1}: {name}" in html
    assert "r_4_4_4" in expected  # the matmul: 4x4 outputs, each a sum over 4
    # the matmul reads the two inputs (the first two buffers) and writes a third
    assert {"b0->k1", "b1->k1", "k1->b2"} <= set(titles)
    assert html.count("input: there before these launches ran") >= 2
    assert "buffer (4, 4) float32 on CPU" in html


@needs_dot
def test_show_graph_draws_the_kernels_of_a_cell_ending_in_realize(
        shell: InteractiveShell) -> None:
    expected = names_that_run(shell, "(a + b).sum(1).realize()")
    assert expected == ["r_4_4"]  # one fused kernel: a 4-row sum over 4
    _, outputs, _ = run(shell, "%%tinyteach --show graph\n(a + b).sum(1).realize()")
    html = outputs[0]["text/html"]
    assert "the lazy graph" not in html
    assert "k1: r_4_4" in html and html.count("<svg") == 1
    titles = set(svg_titles(html))
    assert {"b0->k1", "b1->k1", "k1->b2"} <= titles
    assert "buffer (4,) float32 on CPU" in html  # the sum's result: one value per row


@needs_dot
def test_show_graph_of_a_lazy_value_draws_its_lazy_graph(shell: InteractiveShell) -> None:
    _, outputs, _ = run(shell, "%%tinyteach --show graph\n(a * b).sum(0)")
    html = outputs[0]["text/html"]
    assert "the lazy graph of the cell&#x27;s value" in html
    assert "REDUCE_AXIS sum" in html and "MUL" in html
    assert "the kernels that ran and the buffers between them" in html  # it was realized
    assert html.count("<svg") == 2


def test_show_graph_with_nothing_to_draw_says_so(shell: InteractiveShell) -> None:
    _, outputs, _ = run(shell, "%%tinyteach --show graph\ndef add_one(x):\n    return x + 1")
    message = ("--show graph: nothing to draw: no kernel ran in this cell and its value is "
               "not a lazy Tensor")
    assert message in outputs[0]["text/plain"]
    assert message in outputs[0]["text/html"]
    assert "<svg" not in outputs[0]["text/html"]
    assert callable(shell.user_ns["add_one"])


def test_show_graph_without_dot_shows_the_kernels_as_text(
        shell: InteractiveShell, monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no `dot` (and no C compiler: NUMPY interprets)
    code = ("%%tinyteach --device NUMPY --show graph\n"
            "x = Tensor([[1.0, 2.0], [3.0, 4.0]])\n(x - 1).max(1).numpy()")
    _, outputs, _ = run(shell, code)
    html = outputs[0]["text/html"]
    assert "<svg" not in html and "apt-get install graphviz" in html
    assert "k1: r_2_2 on NUMPY  reads b0  writes b1" in html  # a 2-row max over 2


def test_display_hooks_never_raise(shell: InteractiveShell) -> None:
    from viz.magic import never_raise

    def broken(value: object) -> str:
        raise RuntimeError("boom")

    html = never_raise(broken)(object())
    assert "could not draw" in html and "boom" in html


def test_tinyteach_does_not_import_viz_or_ipython() -> None:
    code = ("import sys, tinyteach; bad = [m for m in sys.modules if m.split('.')[0] in "
            "('viz', 'IPython', 'ipywidgets', 'graphviz')]; print(bad)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"
