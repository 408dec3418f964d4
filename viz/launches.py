"""`viz.launch_graph(launches)`: the kernels that ran, and the buffers that flowed between them.

What a student sees:
- one box per kernel launch (`k1`, `k2`, ... in the order they ran), labelled with the kernel's
  name and device, and one cylinder per buffer, labelled with the shape and dtype the kernel sees
  it as. An arrow goes from a buffer to each kernel that reads it and from a kernel to the buffer
  it writes, so the drawing reads top to bottom like the run itself;
- buffers nobody in the recording wrote are inputs (white); a buffer written twice (an assign,
  an optimizer step) gets a new cylinder for its new contents, so the drawing has no cycles;
- recordings longer than `max_launches` are cut: the last launches are drawn, with a note of how
  many came before. Buffers those earlier launches wrote are drawn as inputs, marked so.

It draws what `record_launches()` (tinyteach/engine/realize.py) recorded: the ScheduleItem and
buffers of every launch. Nothing is run again. Output is deterministic: names come from the order of
the launches, never from `id()` (used only as a key, to tell memories apart).

Builds on: tinyteach.engine.realize (Launch), viz/figure.py. Used by: viz/report.py
(`%%tinyteach --show graph`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tinyteach.device import Buffer
from tinyteach.engine.realize import Launch
from tinyteach.engine.schedule import ScheduleItem
from tinyteach.ir.uop import Ops
from viz.figure import DotWriter, Figure, escape, graph_figure, kernel_color, swatch, table

DEFAULT_MAX_LAUNCHES = 40


@dataclass
class BufferNode:
    """One version of a buffer: its contents from one write (or from before the recording)."""

    name: str
    buffer: Buffer
    shape: tuple[int, ...] | None
    writer: int | None           # number of the launch that wrote it; None for an input
    left_out_writer: bool = False  # written by a launch that is not drawn
    rewritten: bool = False        # a write over contents an earlier launch wrote


@dataclass
class LaunchNode:
    """One drawn launch: which buffer versions it read and which it wrote."""

    name: str
    number: int                  # position in the whole recording (0-based)
    item: ScheduleItem
    reads: list[BufferNode] = field(default_factory=list)
    writes: BufferNode | None = None


@dataclass
class LaunchGraph:
    """The launches and buffers of a recording, ready to draw."""

    launches: list[LaunchNode]
    buffers: list[BufferNode]
    left_out: int                # launches before the drawn ones


def buffer_shapes(item: ScheduleItem) -> dict[int, tuple[int, ...]]:
    """For each buffer argument of a launch, the shape the kernel views it as (if it says)."""
    if item.kind == "copy":
        return {0: item.ast.shape, 1: item.ast.shape}
    shapes: dict[int, tuple[int, ...]] = {}
    for node in item.ast.toposort:
        if node.op is Ops.RESHAPE and node.src[0].op is Ops.DEFINE_GLOBAL:
            shapes.setdefault(node.src[0].arg[0], node.shape)
        elif node.op is Ops.STORE and node.src[0].op is Ops.DEFINE_GLOBAL:
            shapes[node.src[0].arg[0]] = node.src[1].shape
    return shapes


def reads_own_output(item: ScheduleItem) -> bool:
    """An in-place assign reads the buffer it writes: its kernel uses global 0 (the output)
    as a value somewhere, not only as the place a STORE writes."""
    if item.kind != "kernel":
        return False
    output = memory_of(item.output)
    if any(memory_of(b) == output for b in item.old_contents_read):
        return True
    for node in item.ast.toposort:
        sources = node.src[1:] if node.op is Ops.STORE else node.src
        if any(s.op is Ops.DEFINE_GLOBAL and s.arg[0] == 0 for s in sources):
            return True
    return False


def memory_of(buffer: Buffer) -> int:
    """Which memory a buffer handle points at. After assign() a tensor holds a new handle on the
    same memory (`Buffer.alias`), so handles are told apart by their storage. (Every buffer of a
    launch was allocated before it ran; the id is only a key here, never shown.)"""
    return id(buffer.storage)


class _Builder:
    """Walks the launches in order, keeping the newest version of every memory."""

    def __init__(self) -> None:
        self.buffers: list[BufferNode] = []
        self.newest: dict[int, BufferNode] = {}
        self.written_before: set[int] = set()  # by launches that are not drawn

    def read(self, buffer: Buffer, shape: tuple[int, ...] | None) -> BufferNode:
        node = self.newest.get(memory_of(buffer))
        if node is None:
            left_out = memory_of(buffer) in self.written_before
            node = self._add(BufferNode("", buffer, shape, None, left_out_writer=left_out))
        return node

    def write(self, buffer: Buffer, shape: tuple[int, ...] | None, number: int) -> BufferNode:
        memory = memory_of(buffer)
        rewritten = memory in self.newest or memory in self.written_before
        return self._add(BufferNode("", buffer, shape, number, rewritten=rewritten))

    def skip(self, item: ScheduleItem) -> None:
        """A launch that is not drawn: remember that it wrote its output."""
        self.written_before.add(memory_of(item.output))

    def _add(self, node: BufferNode) -> BufferNode:
        node.name = f"b{len(self.buffers)}"
        self.buffers.append(node)
        self.newest[memory_of(node.buffer)] = node
        return node


def build_launch_graph(launches: list[Launch], max_launches: int | None = DEFAULT_MAX_LAUNCHES
                       ) -> LaunchGraph:
    """Buffer versions and launches, in the order they ran (the last `max_launches` of them)."""
    if max_launches is not None and max_launches < 1:
        raise ValueError(f"max_launches must be at least 1 (or None for no limit), "
                         f"got {max_launches}")
    if not all(isinstance(launch, Launch) for launch in launches):
        raise TypeError("launch_graph draws what record_launches() recorded: a list of Launch")
    first_drawn = 0 if max_launches is None else max(0, len(launches) - max_launches)
    builder = _Builder()
    drawn: list[LaunchNode] = []
    for number, launch in enumerate(launches):
        item = launch.item
        if number < first_drawn:
            builder.skip(item)
            continue
        buffers = list(launch.buffers) or list(item.buffers)
        shapes = buffer_shapes(item)
        node = LaunchNode(f"k{number + 1}", number, item)
        inputs = list(enumerate(buffers))[1:]
        if reads_own_output(item):
            inputs.insert(0, (0, buffers[0]))
        for index, buffer in inputs:
            version = builder.read(buffer, shapes.get(index))
            if version not in node.reads:
                node.reads.append(version)
        node.writes = builder.write(buffers[0], shapes.get(0), number)
        drawn.append(node)
    return LaunchGraph(drawn, builder.buffers, first_drawn)


# ---- what the nodes say ----

def shape_text(node: BufferNode) -> str:
    shape = str(node.shape) if node.shape is not None else f"{node.buffer.size} elements"
    return f"{shape} {node.buffer.dtype.name}"


def buffer_role(node: BufferNode) -> str:
    if node.writer is not None:
        again = ", over earlier contents" if node.rewritten else ""
        return f"written by k{node.writer + 1}{again}"
    if node.left_out_writer:
        return "written by an earlier launch (left out)"
    return "input: there before these launches ran"


def buffer_label(node: BufferNode) -> str:
    return f"buffer {shape_text(node)} on {node.buffer.device}\n{buffer_role(node)}"


def launch_label(node: LaunchNode) -> str:
    return f"{node.name}: {node.item.name}\non {node.item.device}"


def _buffer_style(node: BufferNode) -> dict[str, str | int | float]:
    attrs: dict[str, str | int | float] = {"shape": "cylinder", "style": "filled",
                                           "fillcolor": "white" if node.writer is None
                                           else "#f4f4f4"}
    if node.left_out_writer:
        attrs["style"] = "filled,dashed"
    return attrs


# ---- DOT, legend, text ----

def _launch_dot(graph: LaunchGraph) -> str:
    dot = DotWriter("launches", rankdir="TB", nodesep="0.3", ranksep="0.35")
    for buffer in graph.buffers:
        dot.node(buffer.name, buffer_label(buffer), **_buffer_style(buffer))
    for launch in graph.launches:
        dot.node(launch.name, launch_label(launch), shape="box", style="rounded,filled",
                 fillcolor=kernel_color(launch.number))
        for buffer in launch.reads:
            dot.edge(buffer.name, launch.name)
        if launch.writes is not None:
            dot.edge(launch.name, launch.writes.name, penwidth=2, color="#444444")
    return dot.source()


def left_out_note(graph: LaunchGraph) -> str:
    if not graph.left_out:
        return ""
    noun = "launch" if graph.left_out == 1 else "launches"
    return (f"the first {graph.left_out} {noun} are left out: drawn are the last "
            f"{len(graph.launches)}")


def launch_legend(graph: LaunchGraph) -> str:
    rows = [[swatch(kernel_color(launch.number)), launch.name,
             escape(launch.item.name), escape(launch.item.device),
             escape(launch.item.boundary_reason)] for launch in graph.launches]
    key = ("box: a kernel launch · cylinder: a buffer · arrow into a kernel: it reads the "
           "buffer · bold arrow out of a kernel: it writes the buffer")
    note = left_out_note(graph)
    kernels = table(rows, ["", "launch", "kernel", "device", "stored because"]) if rows else ""
    extra = f"<div>{escape(note)}</div>" if note else ""
    return kernels + extra + f'<div style="font-size:11px;color:#555;margin-top:4px">{key}</div>'


def launch_title(graph: LaunchGraph) -> str:
    total = graph.left_out + len(graph.launches)
    noun = "launch" if total == 1 else "launches"
    return f"the kernels that ran: {total} {noun}, {len(graph.buffers)} buffers drawn"


def text_view(graph: LaunchGraph) -> str:
    """The drawing as lines of text, for terminals and when `dot` is missing."""
    lines = [launch_title(graph)]
    if graph.left_out:
        lines.append(left_out_note(graph))
    for buffer in graph.buffers:
        if buffer.writer is None:
            lines.append(f"{buffer.name}: buffer {shape_text(buffer)} on {buffer.buffer.device}"
                         f"  ({buffer_role(buffer)})")
    for launch in graph.launches:
        reads = ", ".join(buffer.name for buffer in launch.reads) or "nothing"
        writes = launch.writes
        written = "nothing"
        if writes is not None:
            again = ", over earlier contents" if writes.rewritten else ""
            written = f"{writes.name} ({shape_text(writes)}{again})"
        lines.append(f"{launch.name}: {launch.item.name} on {launch.item.device}  "
                     f"reads {reads}  writes {written}")
    return "\n".join(lines)


def launch_graph(launches: list[Launch], max_launches: int | None = DEFAULT_MAX_LAUNCHES) -> Figure:
    """Draw recorded launches (`record_launches()`) and the buffers between them as SVG."""
    graph = build_launch_graph(launches, max_launches)
    return graph_figure(launch_title(graph), _launch_dot(graph), text_view(graph),
                        launch_legend(graph))
