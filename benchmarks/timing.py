"""Clocks for honest measurements: every timed region ends with a synchronize, inputs are
prepared outside it, and warm-up runs are returned separately from the measured ones."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Timings:
    """Seconds per run: the warm-up runs (compile, first allocations) and the measured ones."""

    warmup: list[float] = field(default_factory=list)
    runs: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.runs)


def time_runs(prepare: Callable[[], Any], run: Callable[[Any], Any], sync: Callable[[Any], None],
              warmup: int, repeats: int) -> Timings:
    """Call `run(prepare())` warmup+repeats times; time only `run` plus `sync` of its result.

    `prepare` makes fresh inputs (outside the clock) so no framework can reuse a previous
    result; `sync` waits until the result is really computed."""
    timings = Timings()
    for index in range(warmup + repeats):
        inputs = prepare()
        sync(inputs)
        start = time.perf_counter()
        sync(run(inputs))
        elapsed = time.perf_counter() - start
        (timings.warmup if index < warmup else timings.runs).append(elapsed)
    return timings


def time_batches(prepare: Callable[[], list[Any]], run: Callable[[Any], Any],
                 sync: Callable[[Any], None], repeats: int) -> list[float]:
    """Seconds per call, once per repeat: call `run` on each of a fresh batch of inputs and
    synchronize once at the end (for launch costs, where one sync per call would dominate)."""
    per_call = []
    for _ in range(repeats):
        inputs = prepare()
        sync(inputs[-1])
        start = time.perf_counter()
        outputs = [run(x) for x in inputs]
        sync(outputs[-1])
        per_call.append((time.perf_counter() - start) / len(inputs))
    return per_call
