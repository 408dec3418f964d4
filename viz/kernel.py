"""`viz.kernel(...)`: one kernel at every stage — AST, linear program, and source per language.

What a student sees, top to bottom:
- the kernel's name, device, why its result is stored and what it fused (chapter 6), its launch
  sizes (one loop per output axis: `LinearProgram.global_sizes`) and the optimizations opt/
  applied to it (upcast tiles, vector lanes, threads — chapter 7);
- the AST: the kernel as the scheduler built it, SINK(STORE(DEFINE_GLOBAL 0, value));
- the linear program: loops, loads, accumulators and index arithmetic in order (chapter 7);
- the source every renderer in `tinyteach/render/` writes for it (chapter 8), highlighted with
  pygments. Rendering is only string building, so OpenCL, CUDA and WGSL source is shown on a
  machine without those devices. A renderer module that cannot be imported (or its renderer
  made) gets a section of its own that names it and says why, instead of vanishing.

Accepts a Tensor or UOp (its kernels are planned, nothing runs; `index` picks one, the last by
default), a ScheduleItem, or a Launch from `record_launches` (adds the measured time).

Builds on: tinyteach.codegen.lower, tinyteach.render, viz/plan.py. Used by: viz/magic.py.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any

from tinyteach.codegen.lower import LinearProgram, lower
from tinyteach.engine.schedule import ScheduleItem
from tinyteach.ir.uop import pretty
from tinyteach.opt.heuristic import heuristic_plan
from tinyteach.render import CStyleRenderer
from viz.figure import Figure, escape, notice, preformatted, table, wrap
from viz.plan import make_plan

# module name in tinyteach/render/ -> (language shown, pygments lexer); others are C-like
LANGUAGES = {"c": ("C", "c"), "opencl": ("OpenCL C", "c"), "cuda": ("CUDA C", "cuda"),
             "wgsl": ("WGSL", "wgsl"), "metal": ("Metal", "c")}
NO_OPTIMIZER = ("none: the kernel runs exactly as lowered (opt/ found nothing worth doing, "
                "or NOOPT=1)")


@dataclass
class RendererInfo:
    """A renderer found in tinyteach/render/, with the language it writes."""

    module: str
    language: str
    lexer: str
    renderer: CStyleRenderer


@dataclass
class RendererFailure:
    """A module of tinyteach/render/ that could not give a renderer, and why."""

    module: str
    reason: str  # "ImportError: cannot import name ..."

    def describe(self) -> str:
        return f"tinyteach/render/{self.module}.py gave no renderer: {self.reason}"


def discover_renderers() -> tuple[list[RendererInfo], list[RendererFailure]]:
    """Every concrete CStyleRenderer in tinyteach/render/ (C first, then the others by name),
    and every module that failed to import or whose renderer failed to construct, with the
    error. A failure never breaks the view (another chapter may be half-written), and it is
    never hidden either: `kernel()` shows it."""
    import tinyteach.render as render_package

    names = sorted(info.name for info in pkgutil.iter_modules(render_package.__path__))
    names.sort(key=lambda name: (list(LANGUAGES).index(name) if name in LANGUAGES else 99))
    found: list[RendererInfo] = []
    failures: list[RendererFailure] = []
    for name in names:
        try:
            module = importlib.import_module(f"tinyteach.render.{name}")
        except Exception as error:  # noqa: BLE001 - reported, not raised
            failures.append(RendererFailure(name, f"{type(error).__name__}: {error}"))
            continue
        for cls in _renderer_classes(module):
            language, lexer = LANGUAGES.get(name, (cls.__name__.removesuffix("Renderer"), "c"))
            try:
                found.append(RendererInfo(name, language, lexer, cls()))
            except Exception as error:  # noqa: BLE001 - reported, not raised
                reason = f"{cls.__name__}() raised {type(error).__name__}: {error}"
                failures.append(RendererFailure(name, reason))
    return found, failures


def find_renderers() -> list[RendererInfo]:
    """The renderers that work (`discover_renderers` also says which modules failed, and why)."""
    return discover_renderers()[0]


def _renderer_classes(module: Any) -> list[type[CStyleRenderer]]:
    classes = []
    for value in vars(module).values():
        concrete = (isinstance(value, type) and issubclass(value, CStyleRenderer)
                    and value.__module__ == module.__name__
                    and value.render_kernel is not CStyleRenderer.render_kernel)
        if concrete:
            classes.append(value)
    return classes


# ---- what to show: a ScheduleItem, maybe with the launch that ran it ----

@dataclass
class KernelInfo:
    item: ScheduleItem
    number: int | None = None      # position in its schedule, when known
    runner: Any = None             # the Runner that ran it (from a Launch)
    seconds: float | None = None


def resolve(target: Any, index: int, device: str | None) -> KernelInfo | str:
    """The kernel to show, or a sentence saying why there is none."""
    if isinstance(target, ScheduleItem):
        return KernelInfo(target)
    if isinstance(getattr(target, "item", None), ScheduleItem):  # a Launch
        return KernelInfo(target.item, None, target.runner, target.seconds)
    plan = make_plan((target,), device)
    kernels = [(n, item) for n, item in enumerate(plan.items) if item.kind == "kernel"]
    if not kernels:
        return "nothing to compute: this tensor is already realized (or only copies data)"
    number, item = kernels[index]
    return KernelInfo(item, number)


def kernel(target: Any, index: int = -1, device: str | None = None,
           languages: list[str] | None = None) -> Figure:
    """Show one kernel at every stage; `languages` limits the source shown (e.g. ["C"])."""
    info = resolve(target, index, device)
    if isinstance(info, str):
        return Figure("kernel", wrap("kernel", notice(info)), info)
    if info.item.kind != "kernel":
        text = f"{info.item.name}: a copy between devices has no kernel source"
        return Figure(info.item.name, wrap(info.item.name, notice(text)), text)
    stages = kernel_stages(info, languages)
    title = f"kernel {info.item.name} on {info.item.device}"
    html_parts = [summary_table(info, stages.linear)]
    text_parts = [title, summary_text(info, stages.linear)]
    for heading, body_html, body_text in stages.sections:
        html_parts.append(section(heading, body_html))
        text_parts.append(f"--- {heading}\n{body_text}")
    return Figure(title, wrap(title, "".join(html_parts)), "\n".join(text_parts))


@dataclass
class Stages:
    linear: LinearProgram | None
    sections: list[tuple[str, str, str]]  # (heading, html, text)


def kernel_stages(info: KernelInfo, languages: list[str] | None = None) -> Stages:
    """The AST, the linear program and each renderer's source, as (heading, html, text)."""
    ast_text = pretty(info.item.ast)
    sections = [("1 · AST: the kernel as scheduled", preformatted(ast_text), ast_text)]
    linear = getattr(info.runner, "linear", None)
    try:
        linear = linear or lower(info.item.ast, heuristic_plan(info.item.ast))
    except Exception as error:  # noqa: BLE001 - show the failure, never raise from a view
        message = f"lowering failed: {type(error).__name__}: {error}"
        sections.append(("2 · linear program", notice(message), message))
        return Stages(None, sections)
    sections.append(("2 · linear program: loops, loads and index math in order",
                     preformatted(str(linear)), str(linear)))
    renderers, failures = discover_renderers()
    for renderer in renderers:
        if languages is not None and renderer.language not in languages:
            continue
        sections.append(source_section(info, renderer, linear))
    for failure in failures:
        message = failure.describe()
        sections.append((f"3 · {failure.module}: no source", notice(message), message))
    return Stages(linear, sections)


def source_section(info: KernelInfo, found: RendererInfo,
                   linear: LinearProgram) -> tuple[str, str, str]:
    heading = f"3 · {found.language} source ({type(found.renderer).__name__})"
    ran = getattr(info.runner, "source", None)
    if ran is not None and getattr(info.runner, "device", None) == found.renderer.device:
        # the source that ran, verbatim (its device's renderer: e.g. the CPU's vector width and
        # fused multiply-adds, which a default renderer would not write)
        return heading + ": this is what ran", highlight(ran, found.lexer), ran
    try:
        source = found.renderer.render(info.item.name, linear)
    except Exception as error:  # noqa: BLE001
        message = f"{found.language} cannot render this kernel: {type(error).__name__}: {error}"
        return heading, notice(message), message
    return heading, highlight(source, found.lexer), source


def highlight(source: str, lexer_name: str) -> str:
    """Source as HTML with inline colors (pygments), or plain <pre> without pygments."""
    try:
        from pygments import highlight as pygments_highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import get_lexer_by_name
    except ImportError:
        return preformatted(source)
    formatter = HtmlFormatter(noclasses=True, cssclass="tinyteach-source highlight")
    return pygments_highlight(source, get_lexer_by_name(lexer_name), formatter)


def section(heading: str, body: str) -> str:
    return (f'<details open style="margin:6px 0"><summary style="font-weight:bold">'
            f"{escape(heading)}</summary>{body}</details>")


# ---- the summary at the top ----

def summary_rows(info: KernelInfo, linear: LinearProgram | None) -> list[tuple[str, str]]:
    item = info.item
    rows = [("kernel", item.name), ("device", item.device),
            ("stored because", item.boundary_reason),
            ("fused", "; ".join(item.fusions) or "nothing: a single op"),
            ("reads", "; ".join(item.input_reasons) or "no buffers")]
    if linear is not None:
        sizes = linear.global_sizes
        rows.append(("launch sizes", f"global {sizes}: one loop per output axis"
                     if sizes else "global (): a single output element"))
        applied = linear.applied_opts
        rows.append(("optimizations", "; ".join(applied) if applied else NO_OPTIMIZER))
    if info.seconds is not None:
        rows.append(("time", f"{info.seconds * 1e6:.1f} us"))
    return rows


def summary_table(info: KernelInfo, linear: LinearProgram | None) -> str:
    rows = [[escape(key), escape(value)] for key, value in summary_rows(info, linear)]
    return table(rows, ["", ""])


def summary_text(info: KernelInfo, linear: LinearProgram | None) -> str:
    return "\n".join(f"{key}: {value}" for key, value in summary_rows(info, linear))
