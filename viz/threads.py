"""Threads and memory, drawn from the PYTHON emulator's record (tinyteach/runtime/python.py).

What a student sees:
- `thread_map(trace, "data1")`: GPU-Puzzles style, one square per element of a buffer, coloured
  by the thread that read (or wrote) it and labelled with that thread's number in its group:
  a group reduction paints each row of the input with 16 colours, one thread per output paints
  a row with one colour;
- `access_pattern(trace)`: for every load and store of the program, the addresses that the
  first threads of a group touch in the same step. Neighbouring threads at neighbouring
  addresses (stride 1) are *coalesced*: the GPU serves them with one wide memory transaction.
  A stride of a whole row means one transaction per thread;
- `shared_traffic(trace)`: reads and writes of shared memory in each barrier phase (the steps
  between two barriers), per group: the tree's halving shows as phases with half the traffic;
- `launch_summary(trace)`: groups, threads per group, shared bytes, barriers, and the loads and
  stores of one thread;
- `fragment_layout(trace)`: a tensor core's fragments — A, B and D of the instruction, each
  element labelled with the lane of the warp that holds it;
- `block_layout(block)`: a tensor-core block (wmma.TensorCoreBlock): which warp computes which
  16x8 tile of the work-group's block of outputs.

Every function but `block_layout` reads a `Trace` recorded with `record_threads()` (or
`emulate(..., record=True)`) and returns a `Figure`: an SVG image in a notebook, text in a
terminal. Nothing runs again; output is deterministic (the same trace gives the same bytes).

Builds on: tinyteach.runtime.python (Trace, AccessEvent), viz/figure.py.

>>> import numpy as np
>>> from tinyteach import Tensor
>>> from tinyteach.runtime.python import record_threads
>>> with record_threads() as traces:
...     _ = (Tensor(np.ones((2, 4), np.float32), device="PYTHON") * 2).numpy()
>>> print(launch_summary(traces[0]).text.splitlines()[1])
work-groups: 1 x 1 x 1 = 1, threads per group: 4 x 2 x 1 = 8
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from tinyteach.runtime.python import AccessEvent, Trace
from tinyteach.wmma import TensorCoreBlock
from viz.figure import PALETTE, Figure, escape, preformatted, svg_image, table, wrap

CELL = 26       # pixels per drawn element
MAX_CELLS = 1024  # larger buffers are drawn in part, with a note


@dataclass(frozen=True)
class Stride:
    """How far apart neighbouring threads' addresses are in one step (None: irregular)."""

    step: int
    buffer: str
    kind: str
    stride: int | None
    addresses: tuple[int, ...]   # of the first threads of the first group

    @property
    def verdict(self) -> str:
        if len(self.addresses) == 1:
            return "one thread"
        if self.stride == 1:
            return "coalesced"
        if self.stride == 0:
            return "broadcast"
        if self.stride is None:
            return "irregular"
        return f"strided ({self.stride})"


def thread_color(thread: int) -> str:
    return PALETTE[thread % len(PALETTE)]


def _linear_thread(threads: np.ndarray, local_size: tuple[int, int, int]) -> np.ndarray:
    return threads[:, 0] + local_size[0] * (threads[:, 1] + local_size[1] * threads[:, 2])


def _svg(width: int, height: int, parts: list[str]) -> str:
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="Helvetica" font-size="10">')
    return "\n".join([head, *parts, "</svg>"])


def _cell(x: int, y: int, fill: str, label: str, tip: str) -> str:
    return (f'<g><title>{escape(tip)}</title><rect x="{x}" y="{y}" width="{CELL - 2}" '
            f'height="{CELL - 2}" fill="{fill}" stroke="#666" stroke-width="0.5"/>'
            f'<text x="{x + CELL // 2 - 1}" y="{y + CELL // 2 + 3}" text-anchor="middle">'
            f'{escape(label)}</text></g>')


def _figure(title: str, svg: str, text: str, notes: list[str]) -> Figure:
    notes_html = "".join(f'<div style="font-size:12px">{escape(n)}</div>' for n in notes)
    body = f'<div class="tinyteach-threads">{svg_image(svg, title)}</div>{notes_html}'
    return Figure(title, wrap(title, body), text, None, svg, notes)


# ---- which thread touches which element ----

def thread_map(trace: Trace, buffer: str = "data1", kind: str = "read",
               columns: int | None = None) -> Figure:
    """One square per element of `buffer`, coloured and labelled by the thread (its number
    within its group) that read it (`kind="write"`: wrote it); `*` marks an element touched
    by several threads, blank squares were not touched. `columns`: elements per row."""
    if buffer not in trace.buffer_sizes:
        raise ValueError(f"{trace.name} has no buffer {buffer!r}; it has "
                         f"{sorted(trace.buffer_sizes)}")
    size = min(trace.buffer_sizes[buffer], MAX_CELLS)
    owners: dict[int, set[tuple[int, int]]] = {}
    for event in trace.accesses(kind, buffer):
        group_ids = _linear_thread(event.groups, trace.launch.groups)
        thread_ids = _linear_thread(event.threads, trace.launch.local_size)
        for group, thread, address in zip(group_ids, thread_ids, event.addresses):
            owners.setdefault(int(address), set()).add((int(group), int(thread)))
    columns = columns or min(size, 16)
    rows = -(-size // columns)
    parts, lines = [], []
    for address in range(size):
        x, y = (address % columns) * CELL, (address // columns) * CELL
        who = sorted(owners.get(address, set()))
        if not who:
            parts.append(_cell(x, y, "#ffffff", "", f"{buffer}[{address}]: not touched"))
            continue
        label = str(who[0][1]) if len(who) == 1 else "*"
        tip = f"{buffer}[{address}]: " + ", ".join(f"group {g} thread {t}" for g, t in who)
        parts.append(_cell(x, y, thread_color(who[0][1]), label, tip))
        lines.append(tip)
    notes = [] if size == trace.buffer_sizes[buffer] else \
        [f"the first {size} of {trace.buffer_sizes[buffer]} elements"]
    verb = "reads" if kind == "read" else "writes"
    title = f"{trace.name}: which thread {verb} each element of {buffer}"
    return _figure(title, _svg(columns * CELL, rows * CELL, parts), "\n".join([title, *lines]),
                   notes)


# ---- coalesced or strided ----

def strides(trace: Trace, threads: int = 8) -> list[Stride]:
    """For each load and store step of global memory (in program order, first time only): the
    addresses of the first `threads` threads of the first group that ran it, and their stride."""
    found: dict[tuple[int, str], Stride] = {}
    for event in trace.events:
        if event.is_shared or (event.step, event.kind) in found:
            continue
        found[(event.step, event.kind)] = _stride_of(event, trace, threads)
    return [found[key] for key in sorted(found)]


def _stride_of(event: AccessEvent, trace: Trace, threads: int) -> Stride:
    group_ids = _linear_thread(event.groups, trace.launch.groups)
    first = event.addresses[group_ids == group_ids.min()]
    thread_ids = _linear_thread(event.threads, trace.launch.local_size)[group_ids ==
                                                                        group_ids.min()]
    order = np.argsort(thread_ids, kind="stable")[:threads]
    addresses = tuple(int(a) for a in first[order])
    gaps = {b - a for a, b in zip(addresses, addresses[1:])}
    stride = gaps.pop() if len(gaps) == 1 else None
    return Stride(event.step, event.buffer, event.kind, stride, addresses)


def access_pattern(trace: Trace, threads: int = 8) -> Figure:
    """A row per global load or store: the addresses of threads 0, 1, 2, ... in one step, and
    whether they are coalesced (neighbours at neighbouring addresses) or strided."""
    found = strides(trace, threads)
    parts, lines = [], [f"{trace.name}: addresses of threads 0..{threads - 1} in one step"]
    label_width = 170
    for row, stride in enumerate(found):
        y = row * CELL
        caption = f"%{stride.step} {stride.kind} {stride.buffer}: {stride.verdict}"
        parts.append(f'<text x="0" y="{y + CELL // 2 + 3}">{escape(caption)}</text>')
        for column, address in enumerate(stride.addresses):
            parts.append(_cell(label_width + column * CELL, y, thread_color(column),
                               str(address), f"thread {column}: {stride.buffer}[{address}]"))
        lines.append(f"{caption:<40} {list(stride.addresses)}")
    width = label_width + threads * CELL
    svg = _svg(width, max(len(found), 1) * CELL, parts)
    return _figure(lines[0], svg, "\n".join(lines),
                   ["coalesced: one memory transaction serves neighbouring threads; strided: "
                    "one per thread"])


# ---- shared memory per barrier phase ----

def phase_traffic(trace: Trace) -> list[tuple[int, int, int]]:
    """(phase, reads, writes) of shared memory per work-group, phases in order."""
    groups = max(trace.launch.group_count, 1)
    reads: Counter[int] = Counter()
    writes: Counter[int] = Counter()
    for event in trace.events:
        if event.is_shared:
            (reads if event.kind == "read" else writes)[event.phase] += len(event.addresses)
    phases = sorted(set(reads) | set(writes))
    return [(p, reads[p] // groups, writes[p] // groups) for p in phases]


def shared_traffic(trace: Trace) -> Figure:
    """Bars of shared-memory reads and writes per group in each barrier phase."""
    traffic = phase_traffic(trace)
    title = f"{trace.name}: shared memory per barrier phase (per work-group)"
    if not traffic:
        return Figure(title, wrap(title, preformatted("no shared memory used")),
                      f"{title}\nno shared memory used")
    largest = max(max(r, w) for _, r, w in traffic)
    scale = 160 / max(largest, 1)
    parts, lines = [], [title]
    for row, (phase, reads, writes) in enumerate(traffic):
        y = row * 2 * CELL
        parts.append(f'<text x="0" y="{y + 14}">phase {phase}</text>')
        for offset, (name, count, color) in enumerate((("reads", reads, "#80b1d3"),
                                                       ("writes", writes, "#fb8072"))):
            top = y + offset * (CELL - 4)
            parts.append(f'<rect x="60" y="{top + 2}" width="{max(count * scale, 1):.1f}" '
                         f'height="{CELL - 8}" fill="{color}"/>')
            parts.append(f'<text x="{66 + count * scale:.1f}" y="{top + 14}">'
                         f'{count} {name}</text>')
        lines.append(f"phase {phase}: {reads} reads, {writes} writes")
    svg = _svg(300, len(traffic) * 2 * CELL, parts)
    return _figure(title, svg, "\n".join(lines),
                   ["a phase is the steps between two barriers"])


# ---- the launch in numbers ----

def launch_summary(trace: Trace) -> Figure:
    """Groups, threads, shared bytes, barriers, and one thread's loads and stores (global and
    shared; the most any thread did)."""
    launch = trace.launch
    per_thread: dict[tuple[str, bool], Counter[tuple[int, int]]] = {}
    for event in trace.events:
        counts = per_thread.setdefault((event.kind, event.is_shared), Counter())
        keys = zip(_linear_thread(event.groups, launch.groups).tolist(),
                   _linear_thread(event.threads, launch.local_size).tolist())
        counts.update(keys)
    g, size = launch.groups, launch.local_size
    rows = [
        ["work-groups", f"{g[0]} x {g[1]} x {g[2]} = {launch.group_count}"],
        ["threads per group", f"{size[0]} x {size[1]} x {size[2]} = "
                              f"{launch.threads_per_group}"],
        ["shared memory", f"{trace.shared_bytes} bytes per group"],
        ["barriers", str(trace.barriers)],
    ]
    for kind, shared in (("read", False), ("write", False), ("read", True), ("write", True)):
        counts = per_thread.get((kind, shared), Counter())
        most = max(counts.values(), default=0)
        place = "shared" if shared else "global"
        name = f"{place} {'loads' if kind == 'read' else 'stores'} per thread (max)"
        rows.append([name, str(most)])
    title = f"{trace.name}: launch summary"
    text = "\n".join([title, f"work-groups: {rows[0][1]}, threads per group: {rows[1][1]}",
                      *[f"{name}: {value}" for name, value in rows[2:]]])
    html = table([[escape(name), escape(value)] for name, value in rows], ["", ""])
    return Figure(title, wrap(title, html), text)


# ---- a tensor core's fragments: which lane holds which element ----

def _fragment_grid(name: str, cells: np.ndarray, rows: int, columns: int, x0: int,
                   y0: int) -> tuple[list[str], list[str]]:
    """SVG cells and text rows of one matrix: `cells[lane, i]` is the (row, column) of lane's
    i-th element; each square shows the lane that holds it."""
    holder = np.full((rows, columns), -1)
    element = np.full((rows, columns), -1)
    for lane in range(cells.shape[0]):
        for i in range(cells.shape[1]):
            row, column = (int(v) for v in cells[lane, i])
            holder[row, column], element[row, column] = lane, i
    parts = [f'<text x="{x0}" y="{y0 - 6}" font-size="12">{escape(name)}</text>']
    for row in range(rows):
        for column in range(columns):
            lane, i = int(holder[row, column]), int(element[row, column])
            tip = f"{name}[{row}, {column}]: lane {lane}, element {i}"
            parts.append(_cell(x0 + column * CELL, y0 + row * CELL, thread_color(lane),
                               str(lane), tip))
    text = [f"{name} (lane holding each element):"]
    text += [" ".join(f"{int(lane):2d}" for lane in holder[row]) for row in range(rows)]
    return parts, text


def fragment_layout(trace: Trace) -> Figure:
    """The layout of the first tensor-core instruction the trace ran: three matrices, A (m x k),
    B (k x n) and D (m x n), each square labelled with the lane (thread of the warp) that holds
    that element in its registers, coloured by lane. Read from the record (FragmentEvent)."""
    if not trace.fragments:
        raise ValueError(f"{trace.name} ran no tensor-core instruction (WMMA): record a kernel "
                         "lowered with KernelOptions(tensor_core=True)")
    first = trace.fragments[0]
    events = [e for e in trace.fragments if e.instruction == first.instruction]
    m, n, k = first.shape
    c_cells = np.zeros((first.c_cells.shape[0], max(e.element for e in events) + 1, 2), int)
    for event in events:
        c_cells[:, event.element] = event.c_cells
    grids = [("A", first.a_cells, m, k), ("B", first.b_cells, k, n), ("D", c_cells, m, n)]
    parts, lines, x = [], [f"{trace.name}: fragments of {first.instruction}"], 0
    for name, cells, rows, columns in grids:
        grid, text = _fragment_grid(name, cells, rows, columns, x, 18)
        parts += grid
        lines += text
        x += columns * CELL + 20
    height = 18 + max(rows for _, _, rows, _ in grids) * CELL
    notes = [f"{first.instruction}: each of {first.a_cells.shape[0]} lanes holds "
             f"{first.a_cells.shape[1]} elements of A, {first.b_cells.shape[1]} of B and "
             f"{c_cells.shape[1]} of D"]
    title = f"{trace.name}: which lane holds which element ({first.instruction})"
    return _figure(title, _svg(x, height, parts), "\n".join(lines), notes)


def block_layout(block: TensorCoreBlock) -> Figure:
    """The tiles of a tensor-core block, each square one tile of the instruction (m x n
    outputs) labelled and coloured by the warp that computes it (`TensorCoreBlock.warp_map`,
    the definition the lowering uses)."""
    owner = block.warp_map
    core = block.core
    parts, lines = [], [f"{block!r}: warp computing each {core.m}x{core.n} tile"]
    for row in range(owner.shape[0]):
        for column in range(owner.shape[1]):
            warp = int(owner[row, column])
            tip = (f"rows {row * core.m}..{(row + 1) * core.m - 1}, columns "
                   f"{column * core.n}..{(column + 1) * core.n - 1}: warp {warp}")
            parts.append(_cell(column * CELL, row * CELL, thread_color(warp), str(warp), tip))
        lines.append(" ".join(str(int(w)) for w in owner[row]))
    notes = [f"{block.warp_count} warps of {core.threads} threads; each tile is one "
             f"{core.name} per {core.k} steps of the reduction"]
    title = f"tensor-core block {block.rows}x{block.columns}: which warp computes which tile"
    svg = _svg(owner.shape[1] * CELL, owner.shape[0] * CELL, parts)
    return _figure(title, svg, "\n".join(lines), notes)
