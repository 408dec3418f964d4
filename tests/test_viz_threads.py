"""viz/threads.py: drawings of the PYTHON emulator's record, checked against the addresses
each thread must touch (worked out here from the kernel's index math, not from our output)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from tinyteach import Tensor
from tinyteach.codegen.lower import lower
from tinyteach.codegen.plan import KernelOptions
from tinyteach.engine.schedule import create_schedule
from tinyteach.runtime.python import emulate, record_threads
from viz.threads import (
    access_pattern,
    launch_grid,
    launch_summary,
    phase_traffic,
    shared_traffic,
    strides,
    thread_color,
    thread_map,
)

ROWS, COLUMNS = 2, 40


def row_sum_trace(options: KernelOptions):
    array = np.arange(ROWS * COLUMNS, dtype=np.float32).reshape(ROWS, COLUMNS)
    items, _ = create_schedule([Tensor(array, device="PYTHON").sum(axis=1).uop], "PYTHON")
    item = items[-1]
    output = np.zeros(ROWS, np.float32)
    trace = emulate(lower(item.ast, options), [output, array.reshape(-1).copy()], item.name,
                    record=True)
    np.testing.assert_allclose(output, array.sum(axis=1))
    return trace


def test_thread_map_labels_each_element_with_its_thread():
    trace = row_sum_trace(KernelOptions(group=8))
    figure = thread_map(trace, "data1", columns=COLUMNS)
    lines = figure.text.splitlines()[1:]
    assert len(lines) == ROWS * COLUMNS
    for address, line in enumerate(lines):  # element i of row r: group r, thread i % 8
        row, column = divmod(address, COLUMNS)
        assert line == f"data1[{address}]: group {row} thread {column % 8}"
    assert figure.svg is not None and figure.svg.count("<rect") == ROWS * COLUMNS
    assert "<svg" in figure._repr_html_()


def test_one_thread_per_row_reads_its_whole_row():
    trace = row_sum_trace(KernelOptions())
    lines = thread_map(trace, "data1").text.splitlines()[1:]
    assert all(line.endswith(f"thread {address // COLUMNS}")
               for address, line in enumerate(lines))


def test_unknown_buffer_is_a_clear_error():
    with pytest.raises(ValueError, match="has no buffer 'data7'"):
        thread_map(row_sum_trace(KernelOptions()), "data7")


def test_group_reduction_reads_are_coalesced_and_row_per_thread_is_strided():
    grouped = {(s.kind, s.buffer): s for s in strides(row_sum_trace(KernelOptions(group=8)))}
    assert grouped[("read", "data1")].verdict == "coalesced"
    assert grouped[("read", "data1")].addresses == tuple(range(8))
    serial = {(s.kind, s.buffer): s for s in strides(row_sum_trace(KernelOptions()))}
    assert serial[("read", "data1")].verdict == f"strided ({COLUMNS})"
    assert "coalesced" in access_pattern(row_sum_trace(KernelOptions(group=8))).text


def test_shared_traffic_halves_with_the_tree():
    trace = row_sum_trace(KernelOptions(group=8))
    # phase 0: every thread writes its partial; then 4, 2, 1 threads each read two, write one;
    # the last phase: all 8 threads read the result
    assert phase_traffic(trace) == [(0, 0, 8), (1, 8, 4), (2, 4, 2), (3, 2, 1), (4, 8, 0)]
    assert "phase 1: 8 reads, 4 writes" in shared_traffic(trace).text
    serial = row_sum_trace(KernelOptions(group=8, group_combine="serial"))
    assert phase_traffic(serial) == [(0, 0, 8), (1, 8, 0)]  # thread 0 reads all 8 partials
    assert "no shared memory" in shared_traffic(row_sum_trace(KernelOptions())).text


def test_launch_summary_counts_per_thread():
    text = launch_summary(row_sum_trace(KernelOptions(group=8))).text
    assert "work-groups: 2 x 1 x 1 = 2, threads per group: 8 x 1 x 1 = 8" in text
    assert "shared memory: 32 bytes per group" in text  # 8 float32 partials
    assert f"global loads per thread (max): {COLUMNS // 8}" in text
    assert "global stores per thread (max): 1" in text and "barriers: 5" in text


def test_drawings_from_a_recorded_engine_launch_are_deterministic():
    def draw() -> str:
        with record_threads() as traces:
            Tensor(np.ones((3, 5), np.float32), device="PYTHON").exp().numpy()
        return thread_map(traces[0], "data0", kind="write").svg or ""
    assert draw() == draw()


# ---- warps, colours per group, wrapped rows, the grid of groups (issue 27) ----

def transpose_trace():
    """x.T * 2 on a 64x64 matrix: thread x of a row writes column x and reads x's row of x."""
    x = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    with record_threads() as traces:
        out = (Tensor(x, device="PYTHON").T * 2).contiguous().numpy()
    np.testing.assert_array_equal(out, x.T * 2)
    return traces[0]


def test_a_warp_reading_a_column_touches_a_sector_per_thread():
    found = {s.kind: s for s in strides(transpose_trace())}
    write, read = found["write"], found["read"]
    assert (write.warp_lanes, read.warp_lanes) == (32, 32)
    # 32 consecutive floats are 128 bytes: 4 sectors of 32; 32 floats 64 apart: one each
    assert (write.sectors, write.fewest_sectors) == (4, 4)
    assert (read.sectors, read.fewest_sectors) == (32, 4)
    assert "warp 0: 32 threads, 32 sectors (fewest 4)" in access_pattern(transpose_trace()).text


def test_sectors_count_bytes_not_elements():
    # one thread per row of 40: the two threads read elements 0 and 40
    serial = {s.kind: s for s in strides(row_sum_trace(KernelOptions()))}["read"]
    assert serial.addresses == (0, COLUMNS) and serial.warp_lanes == ROWS
    assert serial.sectors == 2  # bytes 0 and 160: sectors 0 and 5
    half = {s.kind: s for s in strides(row_sum_trace(KernelOptions()), itemsize=2)}["read"]
    assert half.sectors == 2 and half.fewest_sectors == 1  # bytes 0 and 80: sectors 0 and 2
    grouped = {s.kind: s for s in strides(row_sum_trace(KernelOptions(group=8)))}["read"]
    assert (grouped.warp_lanes, grouped.sectors) == (8, 1)  # 8 floats: 32 bytes


def fills(svg: str) -> dict[str, str]:
    """Each element's tooltip -> its square's fill."""
    return dict(re.findall(r'<title>([^<]*)</title><rect [^>]*fill="([^"]+)"', svg))


def test_each_work_group_has_a_colour_of_its_own():
    figure = thread_map(row_sum_trace(KernelOptions(group=8)), "data1", columns=COLUMNS)
    by_element = fills(figure.svg or "")
    assert len(by_element) == ROWS * COLUMNS
    hues: dict[int, set[str]] = {}
    for tip, fill in by_element.items():
        group = int(re.search(r"group (\d+)", tip).group(1))
        hues.setdefault(group, set()).add(fill.split(",")[0])  # "hsl(H"
    assert sorted(hues) == list(range(ROWS)) and all(len(h) == 1 for h in hues.values())
    assert len({hue for h in hues.values() for hue in h}) == ROWS  # distinct per group
    shades = {fill for tip, fill in by_element.items() if tip.startswith("data1[0]:")} | \
        {fill for tip, fill in by_element.items() if tip.startswith("data1[1]:")}
    assert len(shades) == 2  # neighbouring threads of a group: two shades
    single = fills(thread_map(row_sum_trace(KernelOptions()), "data1", columns=COLUMNS).svg or "")
    assert len(set(single.values())) == ROWS  # one group: a colour per thread
    assert len({thread_color(lane) for lane in range(32)}) == 32  # a warp's lanes all differ


def test_long_rows_wrap_with_each_lines_first_address():
    figure = thread_map(row_sum_trace(KernelOptions(group=8)), "data1", columns=COLUMNS,
                        wrap=16)
    svg = figure.svg or ""
    tops = sorted({int(y) for y in re.findall(r'<rect x="\d+" y="(\d+)"', svg)})
    assert len(tops) == ROWS * 3  # 40 elements: lines of 16, 16 and 8
    starts = re.findall(r'text-anchor="end" fill="#555">(\d+)</text>', svg)
    assert starts == ["0", "16", "32", "40", "56", "72"]
    xs = [int(x) for x in re.findall(r'<rect x="(\d+)"', svg)]
    assert max(xs) < 16 * 26 + 44  # no line is longer than 16 squares (after the margin)
    assert "rows of 40 elements drawn in lines of 16" in figure.notes
    unwrapped = thread_map(row_sum_trace(KernelOptions(group=8)), "data1", columns=COLUMNS,
                           wrap=64).svg or ""
    assert len({int(y) for y in re.findall(r'<rect x="\d+" y="(\d+)"', unwrapped)}) == ROWS
    with pytest.raises(ValueError, match="wrap must be at least 1"):
        thread_map(row_sum_trace(KernelOptions()), "data1", wrap=0)


def test_launch_grid_draws_each_group_with_its_warps():
    trace = transpose_trace()  # 16 groups of 64 x 4 = 256 threads: 8 warps each
    figure = launch_grid(trace)
    assert figure.text.splitlines()[0] == \
        "E_64_64: 16 work-groups of 256 threads (64 x 4 x 1), warps of 32"
    shown = figure.text.splitlines()[1:]
    assert len(shown) == 4 and shown[1] == "group 1 (0, 1, 0): threads 0..255, 8 warps"
    assert "the first 4 of 16 work-groups" in figure.notes  # 1,024 squares at most
    svg = figure.svg or ""
    assert svg.count("<title>group 0 (0, 0, 0), thread 40, warp 1</title>") == 1
    assert svg.count('stroke-dasharray="4 2"') == 4 * 8  # a frame per warp (lines of 32)
    small = launch_grid(row_sum_trace(KernelOptions(group=8)))
    assert small.text.splitlines()[1:] == ["group 0 (0, 0, 0): threads 0..7, 1 warp",
                                           "group 1 (1, 0, 0): threads 0..7, 1 warp"]
