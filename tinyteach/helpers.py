"""Small helpers shared by every chapter: counters, caches and math on tuples.

The settings (DEBUG, Context, getenv, ...) live in settings.py, the one list of every setting;
they are imported here too, as tinygrad's programs write `from tinygrad.helpers import DEBUG`.
Settings follow tinygrad: each is read once from the environment (`DEBUG=4 python x.py`) and can
be changed for a block of code with `with Context(DEBUG=4): ...`.

>>> with Context(DEBUG=2):
...     DEBUG.value
2
"""
from __future__ import annotations

import functools
import hashlib
import operator
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Generic, TypeVar

from tinyteach.settings import (  # noqa: F401  (re-exported: tinygrad's programs import them here)
    BEAM,
    DEBUG,
    NOOPT,
    TINYTEACH_CACHE,
    TRAINING,
    Context,
    ContextVar,
    getenv,
)

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)
M = TypeVar("M")


class GlobalCounters:
    """Counts every kernel launched: how many, how many ops and bytes, and the time they took.
    `mem_used` is a gauge, not a count: the bytes of device memory allocated now, on every
    device (device.Allocation adds a buffer's bytes when its memory is allocated and takes them
    off when the last buffer on it is freed), so `reset()` leaves it alone, as tinygrad does."""

    kernel_count: int = 0
    global_ops: int = 0
    global_mem: int = 0
    time_sum_s: float = 0.0
    mem_used: int = 0

    @staticmethod
    def reset() -> None:
        """Zero the counts of launches (not `mem_used`: memory still allocated stays counted)."""
        GlobalCounters.kernel_count, GlobalCounters.global_ops = 0, 0
        GlobalCounters.global_mem, GlobalCounters.time_sum_s = 0, 0.0


class cached_property(Generic[T]):  # noqa: N801 (named as the functools one it replaces)
    """`functools.cached_property` without its lock: Python 3.11 takes a lock at each first
    access (3.12 dropped it), and a node's shape and ancestors are computed once for each of
    the thousands of fresh nodes a kernel's lowering or an eager realize builds. The value is
    stored in the instance's `__dict__` under the same name, which then hides this descriptor:
    later reads are plain attribute reads."""

    def __init__(self, function: Callable[[Any], T]):
        self.function = function
        self.name = function.__name__
        self.__doc__ = function.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: Any, owner: type | None = None) -> T:
        if instance is None:
            return self  # type: ignore[return-value]  # the class attribute: the descriptor
        value = self.function(instance)
        instance.__dict__[self.name] = value
        return value


def prod(values: Iterable[int]) -> int:
    """The product of a sequence of ints (1 for an empty one)."""
    return functools.reduce(operator.mul, values, 1)


def format_bytes(count: int) -> str:
    """A byte count a reader can take in: 48 B, 1.50 KB, 4.19 MB, 1.07 GB (powers of 1000)."""
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if count >= size:
            return f"{count / size:.2f} {unit}"
    return f"{count} B"


def argsort(values: list[Any]) -> list[int]:
    return sorted(range(len(values)), key=values.__getitem__)


# ---- caches: each has a size bound, and clear_caches() empties them all ----

class LRUCache(Generic[K, T]):
    """A memo that holds at most `limit` entries: a new entry past the limit pushes out the one
    used least recently (tinygrad's LRU). Every LRUCache is listed in `LRUCache.every`, by
    name, so `clear_caches()` can empty them all and a test never reaches for a private dict."""

    every: ClassVar[dict[str, LRUCache[Any, Any]]] = {}

    def __init__(self, name: str, limit: int):
        if limit < 1:
            raise ValueError(f"an LRUCache holds at least one entry, not {limit}")
        self.name, self.limit = name, limit
        self.entries: OrderedDict[K, T] = OrderedDict()
        LRUCache.every[name] = self

    def __repr__(self) -> str:
        return f"<LRUCache {self.name}: {len(self)} of {self.limit}>"

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, key: object) -> bool:
        return key in self.entries

    def __iter__(self) -> Iterator[K]:
        return iter(list(self.entries))  # a copy: deleting while iterating is allowed

    def __getitem__(self, key: K) -> T:
        self.entries.move_to_end(key)  # just used: the last to go
        return self.entries[key]

    def get(self, key: K) -> T | None:
        """The entry, or None: one lookup where `key in cache` and `cache[key]` make three
        (a key is hashed at each, and an eager realize's key is a long tuple)."""
        value = self.entries.get(key)
        if value is not None:
            self.entries.move_to_end(key)
        return value

    def __setitem__(self, key: K, value: T) -> None:
        self.entries[key] = value
        self.entries.move_to_end(key)
        while len(self.entries) > self.limit:
            self.entries.popitem(last=False)

    def __delitem__(self, key: K) -> None:
        del self.entries[key]

    def clear(self) -> None:
        self.entries.clear()


# the plain dicts that remember() has filled (modules that do not use an LRUCache yet)
_remembered: dict[int, dict[Any, Any]] = {}


def remember(cache: dict[Any, T] | LRUCache[Any, T], key: Any, compute: Callable[[], T],
             limit: int = 10_000) -> T:
    """`cache[key]`, computed once by `compute()`. A plain dict starts over past `limit` entries
    (it keeps what it holds alive); an LRUCache keeps its own bound."""
    if key not in cache:
        if isinstance(cache, dict):
            _remembered.setdefault(id(cache), cache)
            if len(cache) > limit:
                cache.clear()
        cache[key] = compute()
    return cache[key]


# every other memo, by name: a functools cache (it has cache_clear) or a table of its own
# (a dict, a WeakKeyDictionary: it has clear), each registered where it is defined
MEMOS: dict[str, Any] = {}


def register_memo(name: str, memo: M) -> M:
    """List `memo` under `name` ("module.what"), so clear_caches() empties it, and return it:
    `_TRUNCATED = register_memo("uop.truncated", {})`."""
    if not (hasattr(memo, "cache_clear") or hasattr(memo, "clear")):
        raise TypeError(f"the memo {name} is a {type(memo).__name__}: a memo is a functools "
                        "cache (cache_clear) or a table with clear()")
    if name in MEMOS and MEMOS[name] is not memo:
        raise ValueError(f"two memos are named {name}")
    MEMOS[name] = memo
    return memo


def memo(name: str) -> Callable[[M], M]:
    """register_memo as a decorator, over a functools cache:
    `@memo("view.contiguous_strides")` above `@functools.lru_cache(maxsize=4096)`."""
    def register(function: M) -> M:
        return register_memo(name, function)
    return register


def memo_size(memo: Any) -> int:
    """How many entries a memo (an LRUCache, a functools cache or a table) holds."""
    if hasattr(memo, "cache_info"):
        return int(memo.cache_info().currsize)
    return len(memo)


def cache_sizes() -> dict[str, int]:
    """Every memo in the process by name, with its size: the LRUCaches, the registered memos,
    and the dicts remember() has filled (named by the id of the dict)."""
    sizes = {name: len(cache) for name, cache in LRUCache.every.items()}
    sizes.update({name: memo_size(table) for name, table in MEMOS.items()})
    sizes.update({f"remembered.{key}": len(table) for key, table in _remembered.items()})
    return sizes


def clear_caches() -> None:
    """Forget, in this process, every compiled program, chosen optimization and packing plan
    (every LRUCache, each dict `remember` filled and every registered memo); the caches on disk
    stay. For a test or a notebook that changes what a cache does not key on (a backend's code,
    the vector width); nothing else needs it: the caches are keyed by everything their result
    depends on."""
    for cache in LRUCache.every.values():
        cache.clear()
    for plain in _remembered.values():
        plain.clear()
    for table in MEMOS.values():
        if hasattr(table, "cache_clear"):
            table.cache_clear()
        else:
            table.clear()


def cache_dir(part: str) -> Path:
    """Where a part of tinyteach caches on disk: ~/.cache/tinyteach/<part> (the folder in
    `TINYTEACH_CACHE`, when set), e.g. "cpu" for compiled kernels, "beam" for BEAM's choices."""
    default = Path.home() / ".cache" / "tinyteach"
    return Path(TINYTEACH_CACHE.get(default)) / part


def machine_identity() -> str:
    """The CPU model and features: what a binary built with -march=native, or a timing, is
    only valid for."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    wanted = [line for line in info.splitlines() if line.startswith(("model name", "flags"))]
    return hashlib.sha256("\n".join(sorted(set(wanted))).encode()).hexdigest()[:16]


def programs_of(launches: Iterable[Any], kind: type[T], device: str) -> list[T]:
    """Each launch's program (`launch.runner.program`), checked to be a `kind`: what a device's
    graph executor (TinyJit's replay, chapter 10) may use beyond `program(*buffers)`. A launch
    of another kind is a TypeError that names it, not an AttributeError deep in a replay."""
    programs = []
    for number, launch in enumerate(launches):
        program = getattr(getattr(launch, "runner", None), "program", None)
        if not isinstance(program, kind):
            raise TypeError(f"launch {number} runs {type(program).__name__}, not a "
                            f"{kind.__name__}: the {device} graph replays only those")
        programs.append(program)
    return programs


def dedup(values: Iterable[T]) -> list[T]:
    """Drop repeated items, keeping the first of each, in order."""
    return list(dict.fromkeys(values))


def flatten(nested: Iterable[Iterable[T]]) -> list[T]:
    return [item for inner in nested for item in inner]


# ---- console helpers tinygrad's programs import from tinygrad.helpers ----

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
