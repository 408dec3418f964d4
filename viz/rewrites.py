"""`viz.rewrites(...)`: step through the rewrite rules a pass applied, one rule at a time.

What a student sees: a slider (and previous/next buttons) over the recorded `RewriteStep`s of
chapter 5; for each step the pass and the rule's name (`(a*c+b)//c -> a+b//c`), the expression
before and after written the usual way, and the two small graphs side by side. Where no widget
can run (a notebook not trusted yet, a static viewer), the step it showed is there as HTML.

Accepts what `record_rewrites()` gave you (a RewriteLog or a list of RewriteSteps), or a Tensor,
UOp or ScheduleItem, whose kernels are then lowered under `record_rewrites()` to collect the
steps (lowering runs the `symbolic` pass over the index arithmetic; nothing is executed).

Builds on: tinyteach.ir.rewrite, viz/figure.py. Used by: the chapters.
"""
from __future__ import annotations

from typing import Any

from tinyteach.codegen.lower import lower
from tinyteach.engine.schedule import ScheduleItem
from tinyteach.ir.rewrite import RewriteLog, RewriteStep, record_rewrites
from tinyteach.ir.uop import Ops, UOp
from tinyteach.opt.heuristic import heuristic_plan
from viz.figure import DotWriter, Figure, escape, graph_figure, preformatted, wrap
from viz.plan import make_plan

SYMBOLS = {Ops.ADD: "+", Ops.MUL: "*", Ops.IDIV: "//", Ops.MOD: "%", Ops.CMPLT: "<",
           Ops.CMPNE: "!=", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^"}
MAX_DRAWN = 30  # nodes per before/after graph


def collect_steps(target: Any, device: str | None = None) -> list[RewriteStep]:
    """The rewrite steps in `target`, recording them by lowering its kernels if needed."""
    if isinstance(target, RewriteLog):
        return list(target.steps)
    if isinstance(target, (list, tuple)) and all(isinstance(s, RewriteStep) for s in target):
        return list(target)
    items = [target] if isinstance(target, ScheduleItem) else make_plan((target,), device).items
    with record_rewrites() as log:
        for item in items:
            if item.kind == "kernel":
                lower(item.ast, heuristic_plan(item.ast))
    return log.steps


# ---- one step, as text and as graphs ----

MAX_DEPTH = 12  # deeper sub-expressions are written `…`


def _leaf_text(node: UOp) -> str | None:
    if node.op is Ops.CONST:
        return str(node.arg)
    if node.op is Ops.RANGE:
        return ("gidx" if node.arg[0] == "g" else "ridx") + str(node.arg[1])
    if node.op in (Ops.DEFINE_VAR, Ops.BIND):  # a Variable, bound or not, by its name
        return node.expr
    return None


def _formula(node: UOp, sources: list[str]) -> str:
    if node.op in SYMBOLS and len(sources) == 2:
        return f"({sources[0]}{SYMBOLS[node.op]}{sources[1]})"
    if node.op is Ops.WHERE:
        return f"({sources[0]} ? {sources[1]} : {sources[2]})"
    return f"{node.op.name.lower()}({', '.join(sources)})"


def expression(root: UOp) -> str:
    """A node as a formula: ADD(MUL(gidx0, 4), ridx0) -> ((gidx0*4)+ridx0).

    Written with a stack, not recursion: each (node, depth) is turned into text once its
    sources have been."""
    text: dict[tuple[UOp, int], str] = {}
    stack: list[tuple[UOp, int, bool]] = [(root, 0, False)]
    while stack:
        node, depth, sources_done = stack.pop()
        if (node, depth) in text:
            continue
        leaf = "…" if depth > MAX_DEPTH else _leaf_text(node)
        if leaf is not None:
            text[(node, depth)] = leaf
        elif sources_done:
            sources = [text[(source, depth + 1)] for source in node.src]
            text[(node, depth)] = _formula(node, sources)
        else:
            stack.append((node, depth, True))
            stack.extend((source, depth + 1, False) for source in node.src)
    return text[(root, 0)]


def node_label(node: UOp) -> str:
    if node.op is Ops.CONST:
        return f"CONST {node.arg}\n{node.dtype.name}"
    if node.op is Ops.RANGE:
        return f"RANGE {expression(node)} < {node.arg[2]}"
    return f"{node.op.name}\n{node.dtype.name}"


def uop_dot(root: UOp, name: str) -> str:
    """A small UOp graph (the last MAX_DRAWN nodes before the root) as DOT."""
    nodes = root.toposort[-MAX_DRAWN:]
    number = {node: i for i, node in enumerate(nodes)}
    dot = DotWriter(name, rankdir="TB", nodesep="0.2", ranksep="0.3")
    for node in nodes:
        color = "#fdb462" if node is root else "#f4f4f4"
        dot.node(f"n{number[node]}", node_label(node), shape="box", style="rounded,filled",
                 fillcolor=color, fontsize=10)
    for node in nodes:
        for source in dict.fromkeys(node.src):
            if source in number:
                dot.edge(f"n{number[source]}", f"n{number[node]}")
    return dot.source()


def step_title(steps: list[RewriteStep], index: int) -> str:
    step = steps[index]
    return f"step {index + 1} of {len(steps)} · pass {step.pass_name} · rule {step.rule}"


def step_html(steps: list[RewriteStep], index: int) -> str:
    """Before and after, side by side, under the rule's name."""
    if not steps:
        return wrap("rewrites", "<div>no rewrite rule fired</div>")
    step = steps[index]
    columns = []
    for label, root in (("before", step.before), ("after", step.after)):
        figure = graph_figure(label, uop_dot(root, label), expression(root))
        formula = preformatted(f"{label}: {expression(root)}")
        columns.append(f'<div style="flex:1;min-width:200px">{formula}{figure.html}</div>')
    row = f'<div style="display:flex;gap:16px;align-items:flex-start">{"".join(columns)}</div>'
    return wrap(step_title(steps, index), row)


def steps_text(steps: list[RewriteStep]) -> str:
    lines = [f"{len(steps)} rewrite steps"]
    for index, step in enumerate(steps):
        lines.append(f"{index + 1:3d}. [{step.pass_name}] {step.rule}: "
                     f"{expression(step.before)}  ->  {expression(step.after)}")
    return "\n".join(lines)


# ---- the widget ----

class RewriteExplorer:
    """A slider with previous/next buttons over the steps; `.view` shows the current one."""

    def __init__(self, steps: list[RewriteStep]):
        import ipywidgets as widgets

        self.steps = steps
        last = max(len(steps) - 1, 0)
        self.slider = widgets.IntSlider(value=0, min=0, max=last, description="step",
                                        continuous_update=False)
        self.previous = widgets.Button(description="◀ previous")
        self.next = widgets.Button(description="next ▶")
        self.title = widgets.HTML()
        self.view = widgets.HTML()
        self._rendered: dict[int, str] = {}
        self.slider.observe(self._on_slider, names="value")
        self.previous.on_click(lambda _button: self.go(self.slider.value - 1))
        self.next.on_click(lambda _button: self.go(self.slider.value + 1))
        buttons = widgets.HBox([self.previous, self.slider, self.next])
        self.widget = widgets.VBox([self.title, buttons, self.view])
        self._show(0)

    @property
    def step(self) -> int:
        return int(self.slider.value)

    def go(self, index: int) -> None:
        """Move to step `index` (clamped to the steps that exist)."""
        self.slider.value = min(max(index, 0), self.slider.max)

    def _on_slider(self, change: dict[str, Any]) -> None:
        self._show(change["new"])

    def _show(self, index: int) -> None:
        if index not in self._rendered:
            self._rendered[index] = step_html(self.steps, index)
        self.view.value = self._rendered[index]
        self.title.value = f"<b>{escape(self._summary())}</b>"

    def _summary(self) -> str:
        if not self.steps:
            return "rewrite explorer: no rewrite rule fired"
        return f"rewrite explorer: {step_title(self.steps, self.step)}"

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        """The widget, and for where it cannot run the step it shows now as HTML: a notebook
        not trusted yet shows no widget (JupyterLab renders its HTML instead), nor does a static
        viewer without the widget's saved state."""
        bundle: dict[str, Any] = self.widget._repr_mimebundle_(**kwargs) or {}
        bundle["text/plain"] = self._summary()  # deterministic: nbval compares it
        bundle["text/html"] = self.view.value
        return bundle

    def __repr__(self) -> str:
        return self._summary()


def rewrites(target: Any, device: str | None = None) -> RewriteExplorer | Figure:
    """An explorer over recorded rewrite steps (a static list when ipywidgets is missing)."""
    steps = collect_steps(target, device)
    try:
        return RewriteExplorer(steps)
    except ImportError:
        text = steps_text(steps)
        return Figure("rewrite steps", wrap("rewrite steps", preformatted(text)), text)
