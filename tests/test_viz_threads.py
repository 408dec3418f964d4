"""viz/threads.py: drawings of the PYTHON emulator's record, checked against the addresses
each thread must touch (worked out here from the kernel's index math, not from our output)."""
from __future__ import annotations

import numpy as np
import pytest

from tinyteach import Tensor
from tinyteach.lower import lower
from tinyteach.opt import KernelOptions
from tinyteach.runtime.python import emulate, record_threads
from tinyteach.schedule import create_schedule
from viz.threads import (
    access_pattern,
    launch_summary,
    phase_traffic,
    shared_traffic,
    strides,
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
