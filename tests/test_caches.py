"""The engine's seams: one schedule for realize and viz (packing kernels included), the caches
(bounded, and emptied by one `clear_caches()`), and the cache folder every part shares."""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import tinyteach
from tinyteach import Tensor, clear_caches
from tinyteach.engine.realize import build_schedule, get_runner, record_launches, runner_cache
from tinyteach.helpers import LRUCache, cache_dir
from tinyteach.opt import heuristic, search

PACKAGE = Path(tinyteach.__file__).parent


# ---- LRUCache ----

def test_lru_cache_forgets_the_least_recently_used_entry():
    cache: LRUCache[str, int] = LRUCache("test.lru", limit=2)
    cache["a"], cache["b"] = 1, 2
    assert cache["a"] == 1          # a is now the most recently used
    cache["c"] = 3                  # so b goes
    assert list(cache) == ["a", "c"] and len(cache) == 2
    assert "b" not in cache


def test_lru_cache_needs_room_for_one_entry():
    with pytest.raises(ValueError, match="at least one entry"):
        LRUCache("test.empty", limit=0)


def test_the_runner_cache_is_bounded(monkeypatch):
    """With room for two programs, a third kernel pushes out the least recently used one."""
    monkeypatch.setattr(runner_cache, "limit", 2)
    clear_caches()
    x = Tensor(np.arange(6, dtype=np.float32), device="NUMPY").realize()
    items = [build_schedule([(x * k + 0.5).uop], "NUMPY").items[0] for k in (2.0, 3.0, 4.0)]
    runners = [get_runner(item) for item in items]
    assert len(runner_cache) == 2
    assert (items[0].device, items[0].ast, items[0].name) not in runner_cache
    assert get_runner(items[2]) is runners[2]      # still cached
    assert get_runner(items[0]) is not runners[0]  # compiled again


def test_clear_caches_empties_every_cache_in_the_process():
    x = Tensor(np.ones((4, 4), dtype=np.float32), device="NUMPY").realize()
    (x + 1).realize()
    assert len(runner_cache) > 0
    clear_caches()
    assert len(runner_cache) == 0
    assert all(len(cache) == 0 for cache in LRUCache.every.values())
    assert {"realize.runners", "search.choices", "pack.plans"} <= set(LRUCache.every)
    np.testing.assert_array_equal((x + 2).numpy(), np.full((4, 4), 3.0))  # and still works


def test_clear_caches_is_at_the_top_level():
    assert "clear_caches" in tinyteach.__all__
    assert tinyteach.clear_caches is clear_caches


# ---- the cache folder ----

def test_cache_dir_follows_tinyteach_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TINYTEACH_CACHE", str(tmp_path))
    assert cache_dir("beam") == tmp_path / "beam"
    assert search.beam_cache_dir() == tmp_path / "beam"
    monkeypatch.delenv("TINYTEACH_CACHE")
    assert cache_dir("cpu") == Path.home() / ".cache" / "tinyteach" / "cpu"


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_search_does_not_import_a_runtime():
    """BEAM's cache path and the machine's identity come from helpers.py, not the CPU runtime.
    The one runtime it reads is the emulator's thread record, for PYTHON's cost model."""
    imported = _imported_modules(PACKAGE / "opt/search.py") - {"tinyteach.runtime.python"}
    assert not any(name.startswith("tinyteach.runtime") for name in imported), imported


def test_one_max_upcast_axes():
    assert search.MAX_UPCAST_AXES is heuristic.MAX_UPCAST_AXES
    assert "MAX_UPCAST_AXES =" not in (PACKAGE / "opt/search.py").read_text()


def test_every_chapter_part_has_its_own_label():
    """"Chapter 7 (part 3)" names one module only (opt/search.py and opt/pack.py shared it): the
    core's modules and runtimes, chapters 1 to 10."""
    labels: dict[str, list[str]] = {}
    for path in sorted([*PACKAGE.glob("*.py"), *PACKAGE.glob("runtime/*.py")]):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        first = doc.splitlines()[0] if doc else ""
        if first.startswith("Chapter") and ":" in first:
            labels.setdefault(first.split(":")[0], []).append(path.name)
    shared = {label: names for label, names in labels.items() if len(names) > 1}
    assert shared == {}


# ---- what runs is what viz draws ----

def _big_matmul() -> tuple[Tensor, np.ndarray, np.ndarray]:
    """b has 2**20 elements: big enough for opt/pack.py to copy it into panels first."""
    rng = np.random.default_rng(0)
    an, bn = rng.random((16, 1024), dtype=np.float32), rng.random((1024, 1024), dtype=np.float32)
    a, b = Tensor(an, device="CPU").realize(), Tensor(bn, device="CPU").realize()
    return a @ b, an, bn


def test_viz_draws_the_packing_kernel_that_runs():
    viz = pytest.importorskip("viz")
    from tinyteach.device import Device

    if not getattr(Device["CPU"].renderer, "vector_width", 0):
        pytest.skip("the CPU renderer has no vector width here: nothing is packed")
    out, an, bn = _big_matmul()
    drawn = [line for line in viz.schedule(out).text.splitlines() if line.startswith("kernel ")]
    with record_launches() as launches:
        out.realize()
    ran = [f"kernel {n + 1}: {launch.item.name} on CPU" for n, launch in enumerate(launches)]
    assert drawn == ran
    assert launches[0].item.name.startswith("pack_") and len(launches) == 2
    np.testing.assert_allclose(out.numpy(), an @ bn, rtol=1e-4)


def test_plan_numbers_kernels_in_the_order_they_run():
    """The assign is listed first but runs last: viz's kernel numbers follow the run order
    (they used to follow the graph, so the graph's labels named the wrong kernel)."""
    from viz.plan import make_plan

    w = Tensor(np.arange(16, dtype=np.float32).reshape(4, 4), device="NUMPY").realize()
    total = (w * 2).sum(1)
    w.assign(w + 1)
    plan = make_plan((w, total))
    assert [item.node for item in plan.items] == [total.uop, w.uop]
    assert plan.item_of == {total.uop: 0, w.uop: 1}
    for node, number in plan.item_of.items():  # a stored node is in its own kernel first
        assert plan.kernels_of[node][0] == number
