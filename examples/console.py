"""Three small console helpers that tinygrad's programs import from `tinygrad.helpers` and
tinyteach.helpers does not have yet: `colored` (ANSI colours), `trange` (a progress bar with
a description, tqdm's interface) and `Timing` (a context manager that prints how long its
block took). tinygrad's examples copied into this folder import them from here."""
from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from types import TracebackType

COLORS = ["black", "red", "green", "yellow", "blue", "magenta", "cyan", "white"]


def colored(text: str, color: str | None = None, background: bool = False) -> str:
    """`text` in an ANSI colour (tinygrad.helpers.colored); no colour when color is None."""
    if color is None:
        return text
    code = 10 * background + 60 * color.upper().startswith("BRIGHT") + 30
    return f"\u001b[{code + COLORS.index(color.lower().removeprefix('bright_'))}m{text}\u001b[0m"


class trange:  # noqa: N801  (tinygrad's and tqdm's name)
    """`for i in (t := trange(n)): ... t.set_description(text)`: one status line, rewritten
    in place with the step count and the last description."""

    def __init__(self, count: int, desc: str = ""):
        self.count, self.description, self.start = count, desc, time.perf_counter()

    def __iter__(self) -> Iterator[int]:
        for index in range(self.count):
            yield index
            self._show(index + 1)
        sys.stderr.write("\n")

    def set_description(self, description: str) -> None:
        self.description = description

    def _show(self, done: int) -> None:
        elapsed = time.perf_counter() - self.start
        sys.stderr.write(f"\r{self.description} {done}/{self.count} [{elapsed:.1f}s]")
        sys.stderr.flush()


class Timing:
    """`with Timing("Time: "):` prints "Time: 12.34 ms" when the block ends."""

    def __init__(self, prefix: str = "", on_exit: Callable[[int], str] | None = None,
                 enabled: bool = True):
        self.prefix, self.on_exit, self.enabled = prefix, on_exit, enabled

    def __enter__(self) -> Timing:
        self.start = time.perf_counter_ns()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        elapsed = time.perf_counter_ns() - self.start
        if self.enabled:
            extra = self.on_exit(elapsed) if self.on_exit else ""
            print(f"{self.prefix}{elapsed * 1e-6:6.2f} ms{extra}")
