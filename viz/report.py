"""What `%%tinyteach` shows after a cell ran: the kernels it launched, why, their source and time.

What a student sees:
- how many kernels ran, on which devices, and the total time;
- one row per launch: the kernel's name, its time, how many buffers it touched, why its result
  was stored and what it fused (the same words as DEBUG=3 and `viz.schedule`);
- for each distinct kernel, the source that was compiled and run (an interpreted device such as
  NUMPY has none; then the C that the C renderer would write is shown instead);
- optionally the schedule drawing, every stage of each kernel (`viz.kernel`) and, for `graph`,
  the kernels that ran with the buffers between them (`viz.launch_graph`), plus the lazy graph
  of the cell's value when that was a lazy Tensor. When there is nothing to draw (no kernel ran
  and the value is not lazy), the report says so.

Timings change from run to run: they are printed as `12.3 us` so a notebook validator can mask
them with one regular expression (chapters/nbval_sanitize.cfg).

Builds on: tinyteach.engine.realize (Launch), viz/kernel.py, viz/schedule.py, viz/graph.py,
viz/launches.py.
Used by: viz/magic.py.
"""
from __future__ import annotations

from typing import Any

from tinyteach.ir.uop import UOp
from viz.figure import Figure, escape, notice, table, wrap
from viz.kernel import find_renderers, highlight, kernel, section

SHOW_CHOICES = ("kernels", "source", "kernel", "schedule", "graph")
DEFAULT_SHOW = ("kernels", "source")
MAX_ROWS = 30
LEXER_OF_DEVICE = {"CPU": "c", "OPENCL": "c", "CUDA": "cuda", "WEBGPU": "wgsl"}
NOTHING_TO_DRAW = ("--show graph: nothing to draw: no kernel ran in this cell and its value is "
                   "not a lazy Tensor")


def microseconds(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us"


def headline(launches: list[Any]) -> str:
    if not launches:
        return "no kernels were launched"
    total = sum(launch.seconds for launch in launches)
    devices = ", ".join(dict.fromkeys(launch.item.device for launch in launches))
    distinct = len(distinct_launches(launches))
    noun = "launch" if len(launches) == 1 else "launches"
    return (f"{len(launches)} kernel {noun} ({distinct} distinct) on {devices}, "
            f"total {microseconds(total)}")


def distinct_launches(launches: list[Any]) -> list[Any]:
    """The first launch of each distinct kernel (same device, name and AST)."""
    first: dict[tuple[str, str, UOp], Any] = {}
    for launch in launches:
        key = (launch.item.device, launch.item.name, launch.item.ast)
        first.setdefault(key, launch)
    return list(first.values())


def launch_rows(launches: list[Any]) -> list[list[str]]:
    rows = []
    for number, launch in enumerate(launches[:MAX_ROWS]):
        item = launch.item
        rows.append([str(number + 1), escape(item.name), escape(item.device),
                     escape(microseconds(launch.seconds)), str(len(item.buffers)),
                     escape(item.boundary_reason),
                     "<br>".join(escape(note) for note in item.fusions) or "—"])
    if len(launches) > MAX_ROWS:
        rows.append(["…", f"and {len(launches) - MAX_ROWS} more launches", "", "", "", "", ""])
    return rows


def launches_text(launches: list[Any]) -> str:
    lines = [headline(launches)]
    for number, launch in enumerate(launches[:MAX_ROWS]):
        item = launch.item
        lines.append(f"{number + 1:3d}. {item.name} on {item.device}  "
                     f"{microseconds(launch.seconds)}  stored because {item.boundary_reason}")
        lines.extend(f"       fused: {note}" for note in item.fusions)
    return "\n".join(lines)


def source_of(launch: Any) -> tuple[str, str]:
    """(heading, html) for the source a launch ran, or the C it would be for an interpreter."""
    runner, item = launch.runner, launch.item
    if item.kind != "kernel":
        return f"{item.name}: a copy", notice("a copy between devices: no kernel source")
    if runner is not None and runner.source is not None:
        lexer = LEXER_OF_DEVICE.get(item.device, "c")
        return f"source of {item.name} ({item.device}): what ran", highlight(runner.source, lexer)
    c_renderers = [r for r in find_renderers() if r.module == "c"]
    note = notice(f"{item.device} interprets the kernel's ops one by one: there is no source. "
                  "The C renderer would write:")
    if not c_renderers or runner is None:
        return f"source of {item.name} ({item.device})", note
    from tinyteach.codegen.lower import lower
    from tinyteach.opt.heuristic import heuristic_plan

    linear = runner.linear or lower(item.ast, heuristic_plan(item.ast))
    source = c_renderers[0].renderer.render(item.name, linear)
    return f"source of {item.name} ({item.device}: interpreted)", note + highlight(source, "c")


def launch_report(launches: list[Any], show: tuple[str, ...] = DEFAULT_SHOW,
                  graph_of: UOp | None = None, notes: tuple[str, ...] = ()) -> Figure:
    """The report `%%tinyteach` displays for the launches recorded while a cell ran."""
    title = headline(launches)
    parts = [notice(note) for note in notes]
    if "kernels" in show and launches:
        header = ["#", "kernel", "device", "time", "buffers", "stored because", "fused"]
        parts.append(table(launch_rows(launches), header))
    text_lines = [*notes, launches_text(launches)]
    if "graph" in show:
        graph_html, graph_text = graph_parts(launches, graph_of)
        parts.extend(graph_html)
        text_lines.extend(graph_text)
    parts.extend(_optional_parts(launches, show))
    return Figure(title, wrap(title, "".join(parts)), "\n".join(text_lines))


def graph_parts(launches: list[Any], graph_of: UOp | None) -> tuple[list[str], list[str]]:
    """`--show graph`: the lazy graph of a lazy value and the kernels that ran (html, text)."""
    from viz.graph import graph
    from viz.launches import launch_graph

    if not launches and graph_of is None:
        return [notice(NOTHING_TO_DRAW)], [NOTHING_TO_DRAW]
    html_parts, text_parts = [], []
    if graph_of is not None:
        figure = graph(graph_of)
        html_parts.append(section("the lazy graph of the cell's value", figure.html))
        text_parts.append(figure.title)  # the whole text view is as long as the graph
    if launches:
        figure = launch_graph(launches)
        html_parts.append(section("the kernels that ran and the buffers between them",
                                  figure.html))
        text_parts.append(figure.text)
    return html_parts, text_parts


def _optional_parts(launches: list[Any], show: tuple[str, ...]) -> list[str]:
    from viz.schedule import schedule

    parts = []
    if "schedule" in show and launches:
        parts.append(section("the schedule", schedule(launches).html))
    for launch in distinct_launches(launches):
        if "source" in show:
            heading, body = source_of(launch)
            parts.append(section(heading, body))
        if "kernel" in show and launch.item.kind == "kernel":
            parts.append(section(f"every stage of {launch.item.name}", kernel(launch).html))
    return parts
