"""The IPython extension: `%load_ext tinyteach`, the `%%tinyteach` magic and rich display.

What it gives a notebook:
- `%%tinyteach` (cell magic) runs the cell while recording every kernel launch, then shows the
  report of viz/report.py: count, names, fusion reasons, source, timing. If the cell's value is
  a lazy Tensor it is realized first (otherwise nothing would run and there would be nothing to
  show). Options: `--device CPU` runs the cell with that default device; `--show kernels,source,
  kernel,schedule,graph` picks the parts of the report (`graph` draws the kernels that ran and
  the buffers between them, and the lazy graph too when the cell's value was a lazy Tensor);
- `%tinyteach expr` (line magic) does the same for one expression and does not keep its value
  (the same options go before the expression);
- rich display: a Tensor shows its shape, dtype, device, whether it is lazy or realized and, if
  realized, a few values; a ScheduleItem or a Launch shows its kernel at every stage
  (`viz.kernel`). A formatter that fails shows the error as text: a display hook never raises.

Builds on: viz/report.py, viz/kernel.py, viz/plan.py; IPython. Used by:
`tinyteach.load_ipython_extension`, which imports this module only when the extension is loaded.
"""
from __future__ import annotations

import ast
import contextlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import display

from tinyteach import Tensor
from tinyteach.codegen.lower import LinearProgram
from tinyteach.device import Device
from tinyteach.engine.realize import Launch, record_launches
from tinyteach.engine.schedule import ScheduleItem, is_contiguous_buffer
from viz.figure import escape, notice, preformatted, table
from viz.report import DEFAULT_SHOW, SHOW_CHOICES, launch_report

OPTION = re.compile(r"^\s*--(?P<name>[a-z]+)(?:=|\s+)(?P<value>\S+)")
USAGE = ("usage: %%tinyteach [--device NAME] [--show PARTS]  (cell)\n"
         "       %tinyteach [--device NAME] [--show PARTS] EXPRESSION  (line)\n"
         f"PARTS: comma-separated, from {', '.join(SHOW_CHOICES)}")


@dataclass
class Options:
    device: str | None = None
    show: tuple[str, ...] = DEFAULT_SHOW


def parse_options(line: str) -> tuple[Options, str]:
    """`--device CPU --show source,graph (a+b).sum()` -> (Options, "(a+b).sum()")."""
    options = Options()
    rest = line
    while (match := OPTION.match(rest)) is not None:
        name, value = match["name"], match["value"]
        if name == "device":
            options.device = value.upper()
        elif name == "show":
            options.show = _parse_show(value)
        else:
            raise UsageError(f"unknown option --{name}\n{USAGE}")
        rest = rest[match.end():]
    if rest.strip().startswith("--"):
        raise UsageError(f"an option needs a value: {rest.strip()}\n{USAGE}")
    return options, rest.strip()


def _parse_show(value: str) -> tuple[str, ...]:
    parts = tuple(part.strip() for part in value.split(",") if part.strip())
    unknown = [part for part in parts if part not in SHOW_CHOICES]
    if unknown:
        raise UsageError(f"--show does not know {unknown}\n{USAGE}")
    return parts


@contextlib.contextmanager
def default_device(name: str | None) -> Iterator[None]:
    """Make `name` the default device inside the block (tensors created there land on it)."""
    if name is None:
        yield
        return
    if not Device.is_available(name):
        raise UsageError(f"device {name} is not available here; available: {Device.available()}")
    previous = Device.DEFAULT
    Device.DEFAULT = name
    try:
        yield
    finally:
        Device.DEFAULT = previous


def is_lazy(value: Any) -> bool:
    return isinstance(value, Tensor) and not is_contiguous_buffer(value.uop)


def run_cell_code(shell: Any, cell: str) -> Any:
    """Run a cell's code in the user's namespace; return the value of its last expression."""
    tree = ast.parse(shell.transform_cell(cell))
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, "<%%tinyteach cell>", "exec"), shell.user_ns)  # noqa: S102
    if last is None:
        return None
    return eval(compile(last, "<%%tinyteach cell>", "eval"), shell.user_ns)  # noqa: S307


@magics_class
class TinyteachMagics(Magics):
    """`%%tinyteach` and `%tinyteach`: run code, then show the kernels it launched."""

    @line_cell_magic
    def tinyteach(self, line: str, cell: str | None = None) -> Any:
        options, expression = parse_options(line)
        if cell is None:
            if not expression:
                raise UsageError(f"%tinyteach needs an expression\n{USAGE}")
            self._line(options, expression)
            return None
        return self._cell(options, cell)

    def _line(self, options: Options, expression: str) -> None:
        notes: list[str] = []
        graph_of = None
        with default_device(options.device), record_launches() as launches:
            shell: Any = self.shell  # IPython's stubs do not all know `ev`
            value = shell.ev(expression)
            if is_lazy(value):
                graph_of = value.uop
                Tensor(value.uop, value.device).realize()  # a copy: `value` itself stays lazy
                notes.append("the expression's value was a lazy Tensor: realized it to run "
                             "its kernels (the value is not kept)")
        display(launch_report(launches, options.show, graph_of, tuple(notes)))

    def _cell(self, options: Options, cell: str) -> Any:
        notes: list[str] = []
        graph_of = None
        with default_device(options.device), record_launches() as launches:
            try:
                value = run_cell_code(self.shell, cell)
                if is_lazy(value):
                    graph_of = value.uop
                    value.realize()
                    notes.append("the cell's value was a lazy Tensor: realized it to run "
                                 "its kernels")
            finally:
                display(launch_report(launches, options.show, graph_of, tuple(notes)))
        return value


# ---- rich display ----

def tensor_values(tensor: Tensor, limit: int = 8) -> str:
    """A few values of a realized tensor, numpy-style (reading its buffer launches nothing)."""
    array = tensor.numpy()
    return np.array2string(array, threshold=limit, edgeitems=2, precision=4)


def tensor_state(tensor: Tensor) -> str:
    if is_contiguous_buffer(tensor.uop):
        return "realized"
    from viz.plan import graph_nodes, is_plannable, make_plan

    nodes = graph_nodes([tensor.uop])
    if not is_plannable(nodes):
        return f"lazy: a graph of {len(nodes)} nodes, planned into kernels when it is realized"
    items = make_plan((tensor,)).items
    names = ", ".join(item.name for item in items)
    noun = "kernel" if len(items) == 1 else "kernels"
    return f"lazy: {len(items)} {noun} will run when it is realized ({names})"


def tensor_html(tensor: Tensor) -> str:
    state = tensor_state(tensor)
    rows = [["shape", escape(str(tensor.shape))], ["dtype", escape(tensor.dtype.name)],
            ["device", escape(tensor.device)], ["state", escape(state)]]
    if state == "realized":
        rows.append(["values", preformatted(tensor_values(tensor))])
    else:
        rows.append(["values", "not computed yet: call .realize() or .numpy()"])
    return '<div class="tinyteach-tensor"><b>Tensor</b>' + table(rows, ["", ""]) + "</div>"


def schedule_item_html(item: ScheduleItem) -> str:
    from viz.kernel import kernel

    return kernel(item).html


def launch_html(launch: Launch) -> str:
    from viz.kernel import kernel

    return kernel(launch).html


def linear_program_html(program: LinearProgram) -> str:
    return preformatted(str(program))


def never_raise(format_html: Callable[[Any], str]) -> Callable[[Any], str]:
    """A display formatter that shows its own failure as text instead of raising."""
    def safe(value: Any) -> str:
        try:
            return format_html(value)
        except Exception as error:  # noqa: BLE001 - a display hook must not raise
            return notice(f"viz could not draw this {type(value).__name__}: "
                          f"{type(error).__name__}: {error}") + preformatted(repr(value))
    safe.__name__ = f"safe_{format_html.__name__}"
    return safe


FORMATTERS: dict[type, Callable[[Any], str]] = {
    Tensor: tensor_html,
    ScheduleItem: schedule_item_html,
    Launch: launch_html,
    LinearProgram: linear_program_html,
}


def load_ipython_extension(ipython: Any) -> None:
    """Register the magics and the HTML formatters with an IPython shell."""
    ipython.register_magics(TinyteachMagics)
    html_formatter = ipython.display_formatter.formatters["text/html"]
    for cls, format_html in FORMATTERS.items():
        html_formatter.for_type(cls, never_raise(format_html))


def unload_ipython_extension(ipython: Any) -> None:
    html_formatter = ipython.display_formatter.formatters["text/html"]
    for cls in FORMATTERS:
        html_formatter.pop(cls, None)
