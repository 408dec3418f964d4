"""opt/search.py: BEAM times candidate optimizations, keeps the fastest correct one and caches it.
No test asserts on wall-clock times: a fake timer decides which candidate "wins" where needed."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tinyteach import Context, Tensor, clear_caches
from tinyteach.codegen.plan import KernelOptions, kernel_value
from tinyteach.device import Device
from tinyteach.dtype import dtypes
from tinyteach.engine.schedule import create_schedule
from tinyteach.ir.uop import UOp
from tinyteach.opt import search
from tinyteach.opt.kernel import actions_of, outer_loop_size, plan_of


@pytest.fixture(autouse=True)
def fresh_caches(tmp_path, monkeypatch):
    """Each test starts with no remembered choice, a private disk cache and no compiled
    runners (a runner compiled earlier would skip the search)."""
    monkeypatch.setattr(search, "beam_cache_dir", lambda: tmp_path / "beam")
    clear_caches()
    yield
    clear_caches()


@pytest.fixture
def searches(monkeypatch) -> list[str]:
    """Names of the kernels searched (beam_search calls), in order."""
    calls: list[str] = []
    original = search.beam_search

    def counting(backend, ast, name, width):
        calls.append(name)
        return original(backend, ast, name, width)

    monkeypatch.setattr(search, "beam_search", counting)
    return calls


def matmul_ast(n: int = 8, k: int = 16, m: int = 8, device: str = "CPU") -> tuple[str, UOp]:
    a = Tensor.ones(n, k, device=device).realize()
    b = Tensor.ones(k, m, device=device).realize()
    item = create_schedule([(a @ b).uop], device)[0][0]
    return item.name, item.ast


def wrong_version(ast: UOp) -> UOp:
    """The same kernel storing value*value instead of value: a deliberately wrong candidate."""
    store = ast.src[0]
    output, value = store.src
    return ast.replace(src=(store.replace(src=(output, value * value)),))


# ---- results ----

WORKLOADS = {
    "matmul": (lambda a, b: a @ b, lambda a, b: a @ b),
    "reduction": (lambda a, b: (a * b).sum(axis=1), lambda a, b: (a * b).sum(axis=1)),
    "elementwise": (lambda a, b: (a * b + 1).relu(), lambda a, b: np.maximum(a * b + 1, 0)),
}


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_beam_results_equal_numpy(workload, searches):
    ours, reference = WORKLOADS[workload]
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((16, 16), np.float32), rng.standard_normal((16, 16), np.float32)
    with Context(BEAM=2):
        result = ours(Tensor(a, device="CPU"), Tensor(b, device="CPU")).numpy()
    np.testing.assert_allclose(result, reference(a, b), rtol=1e-4, atol=1e-4)
    assert searches, "the kernel was compiled without a search"


@pytest.mark.skipif(not Device.is_available("OPENCL"), reason="no OpenCL device here")
def test_beam_on_opencl_equals_numpy(searches):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((8, 16), np.float32), rng.standard_normal((16, 8), np.float32)
    with Context(BEAM=2):
        result = (Tensor(a, device="OPENCL") @ Tensor(b, device="OPENCL")).numpy()
    np.testing.assert_allclose(result, a @ b, rtol=1e-4, atol=1e-4)
    assert searches


def test_beam_off_or_noopt_keeps_the_heuristic(searches):
    backend = Device["CPU"]
    name, ast = matmul_ast()
    heuristic = search.heuristic_options(backend, ast)
    assert search.options_for(backend, name, ast) == heuristic  # BEAM=0 is the default
    with Context(BEAM=2, NOOPT=1):
        assert search.options_for(backend, name, ast) == KernelOptions()
    assert searches == []


def test_debug_2_prints_one_line_per_searched_kernel(capsys):
    name, ast = matmul_ast()
    with Context(BEAM=2, DEBUG=2):
        search.options_for(Device["CPU"], name, ast)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("beam ")]
    assert len(lines) == 1
    assert lines[0].startswith(f"beam {name}: ") and "candidates" in lines[0]
    assert "best '" in lines[0] and "(heuristic " in lines[0]


# ---- the cache ----

def test_a_choice_is_searched_once(searches):
    backend = Device["CPU"]
    name, ast = matmul_ast()
    with Context(BEAM=2):
        first = search.options_for(backend, name, ast)
        assert search.options_for(backend, name, ast) == first  # from memory
        search.clear_memory_cache()  # as in a new process: the disk cache answers
        assert search.options_for(backend, name, ast) == first
    assert searches == [name]


def test_ignore_beam_cache_searches_again(searches):
    """tinygrad's IGNORE_BEAM_CACHE=1: neither the memory nor the disk cache answers; the new
    choice is stored, so without the setting the next call reads it."""
    backend = Device["CPU"]
    name, ast = matmul_ast()
    with Context(BEAM=1):
        search.options_for(backend, name, ast)
        with Context(IGNORE_BEAM_CACHE=1):
            search.options_for(backend, name, ast)   # the memory cache does not answer
            search.clear_memory_cache()
            latest = search.options_for(backend, name, ast)  # nor the disk cache
        assert search.options_for(backend, name, ast) == latest  # the new choice, kept
        search.clear_memory_cache()
        assert search.options_for(backend, name, ast) == latest  # and written to disk
    assert searches == [name, name, name]  # (timings may pick another winner each time)
    with Context(BEAM=1, IGNORE_BEAM_CACHE=1):  # tinygrad's test_beam: a result as without
        np.testing.assert_array_equal((Tensor([1.0, 2, 3]) + Tensor([4.0, 5, 6])).numpy(),
                                      [5.0, 7.0, 9.0])


def test_a_wider_beam_searches_again(searches):
    backend = Device["CPU"]
    name, ast = matmul_ast()
    with Context(BEAM=1):
        search.options_for(backend, name, ast)
    with Context(BEAM=2):
        search.options_for(backend, name, ast)
    assert searches == [name, name]


def test_the_disk_cache_round_trips():
    backend = Device["CPU"]
    _, ast = matmul_ast()
    key = search.cache_key(backend, ast, 2)
    chosen = KernelOptions(upcasts=((0, 2), (1, 4)), parallel=True)
    search.write_cached(key, ast, search.SearchResult(chosen, 1e-3, 2e-3, candidates=5))
    stored = json.loads((search.beam_cache_dir() / f"{key}.json").read_text())["actions"]
    assert stored == [["UPCAST", 0, 2], ["UPCAST", 1, 4], ["THREAD", 0, 0]]  # as actions
    assert search.read_cached(key, ast, backend) == chosen
    assert search.read_cached("no-such-key", ast, backend) is None
    (search.beam_cache_dir() / f"{key}.json").write_text("{not json")
    assert search.read_cached(key, ast, backend) is None  # a damaged entry: search again
    entry = {"actions": [["UPCAST", 0, 7]]}  # an action that no longer fits: search again
    (search.beam_cache_dir() / f"{key}.json").write_text(json.dumps(entry))
    assert search.read_cached(key, ast, backend) is None


def test_the_cache_key_names_the_kernel_and_the_device():
    backend = Device["CPU"]
    _, ast = matmul_ast()
    _, same = matmul_ast()
    _, other = matmul_ast(8, 32, 8)
    assert search.cache_key(backend, ast, 2) == search.cache_key(backend, same, 2)
    assert search.cache_key(backend, ast, 2) != search.cache_key(backend, other, 2)
    assert search.ast_text(ast) != search.ast_text(other)


# ---- correctness is never traded for speed ----

def fake_timer(winner):
    """A timer under which every candidate `winner` accepts takes 0 s, the others 1 s."""
    def timer(backend, candidate, scratch, best_so_far):
        return 0.0 if winner(candidate.options) else 1.0
    return timer


def test_the_fake_timer_decides_the_winner(monkeypatch):
    backend = Device["CPU"]
    name, ast = matmul_ast()
    heuristic = search.heuristic_options(backend, ast)
    monkeypatch.setattr(search, "time_candidate", fake_timer(lambda o: o != heuristic))
    result = search.beam_search(backend, ast, name, width=2)
    assert result.best != heuristic and result.discarded == 0


def test_a_wrong_candidate_is_discarded(monkeypatch):
    backend = Device["CPU"]
    name, ast = matmul_ast()
    heuristic = search.heuristic_options(backend, ast)
    render = search.render_candidate

    def render_wrong(backend, kernel_name, kernel_ast, options):
        wrong = options != heuristic  # every candidate but the heuristic computes value*value
        return render(backend, kernel_name, wrong_version(kernel_ast) if wrong else kernel_ast,
                      options)

    monkeypatch.setattr(search, "render_candidate", render_wrong)
    monkeypatch.setattr(search, "time_candidate", fake_timer(lambda o: o != heuristic))
    result = search.beam_search(backend, ast, name, width=2)
    assert result.best == heuristic
    assert result.candidates > 1 and result.discarded == result.candidates - 1


def test_the_cached_actions_build_the_winner_whichever_wins(monkeypatch):
    """The choice is stored as actions and realize applies them: every candidate the search
    times must be one its actions build. A vector tile on an axis whose loads are not
    consecutive (the matmul's axis 0) lowers to scalars when rendered directly, but
    VECTORIZE rejects it: such a candidate is never timed, so it can never win (CI once saw
    it win, its cache entry fail to load and a second search pick another)."""
    backend = Device["CPU"]
    name, ast = matmul_ast()
    monkeypatch.setattr(search, "time_candidate", fake_timer(lambda o: o.vector_width > 0 and
                                                             o.upcasts[-1][0] == 0))
    result = search.beam_search(backend, ast, name, width=4)
    assert len(result.tried) > 2
    for options in result.tried:
        assert plan_of(ast, actions_of(ast, options), backend.capabilities, "CPU") == options


@pytest.mark.parametrize("device", ["CPU", "PYTHON", "OPENCL", "WEBGPU"])
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_every_timed_candidate_is_what_its_actions_build(device, workload, monkeypatch):
    if not Device.is_available(device):
        pytest.skip(f"no {device} device here")
    backend = Device[device]
    ours, _ = WORKLOADS[workload]
    a = Tensor.ones(16, 16, device=device).realize()
    b = Tensor.ones(16, 16, device=device).realize()
    item = create_schedule([ours(a, b).uop], device)[0][0]
    monkeypatch.setattr(search, "time_candidate", fake_timer(lambda o: False))
    monkeypatch.setattr(search, "emulator_cost_of", lambda candidate, scratch: 1.0)
    result = search.beam_search(backend, item.ast, item.name, width=2)
    assert len(result.tried) > 1
    for options in result.tried:
        built = plan_of(item.ast, actions_of(item.ast, options), backend.capabilities, device)
        assert built == options


# ---- the pieces ----

def test_neighbours_change_one_thing_and_stay_valid():
    shape = (8, 16)
    start = KernelOptions(upcasts=((1, 4),))
    found = search.neighbours(start, shape)
    assert start not in found and len(found) == len(set(found))
    assert KernelOptions(upcasts=((0, 2), (1, 4))) in found       # one more axis
    assert KernelOptions(upcasts=((1, 8),)) in found               # another factor
    assert KernelOptions() in found                                # the upcast removed
    assert KernelOptions(upcasts=((1, 4),), parallel=True) in found
    for options in found:
        for axis, factor in options.upcasts:
            assert shape[axis] % factor == 0 and shape[axis] >= 2 * factor
    assert KernelOptions(upcasts=((1, 16),)) not in found          # no loop left


def test_threads_need_an_outer_loop_to_split():
    assert search.neighbours(KernelOptions(), (1, 1)) == []  # one element: no loop at all
    assert KernelOptions(parallel=True) in search.neighbours(KernelOptions(), (2, 1))
    with_tile = search.neighbours(KernelOptions(upcasts=((1, 2),)), (1, 4))
    assert KernelOptions(upcasts=((1, 2),), parallel=True) in with_tile  # 2 iterations left
    assert outer_loop_size((1, 8, 4), KernelOptions(upcasts=((1, 8),))) == 1


def test_scratch_buffers_match_the_kernel_and_ints_are_zero():
    a = Tensor(np.arange(6, dtype=np.int32), device="CPU").realize()
    b = Tensor.ones(6, device="CPU").realize()
    item = create_schedule([(b + a.cast(dtypes.float32)).uop], "CPU")[0][0]
    scratch = search.scratch_for("CPU", item.ast)
    assert [(x.size, x.dtype) for x in scratch.buffers] == \
        [(x.size, x.dtype) for x in item.buffers]
    for buffer, contents in zip(scratch.buffers, scratch.contents):
        if buffer.dtype == dtypes.int32:
            assert not contents.any()
        else:
            assert np.all(np.abs(contents) <= 1)


def test_a_kernel_with_nothing_to_try_is_not_timed(searches):
    item = create_schedule([Tensor.ones(3, device="CPU").realize().sum().uop], "CPU")[0][0]
    with Context(BEAM=2):
        options = search.options_for(Device["CPU"], item.name, item.ast)
    assert options == search.heuristic_options(Device["CPU"], item.ast)
    assert kernel_value(item.ast).shape == () and searches == []


def test_the_heuristic_reads_the_renderer_and_groups_on_python():
    """search starts from what the device's renderer allows: the PYTHON emulator can share a
    reduction across a work-group, the CPU cannot."""
    x = Tensor(np.ones((4, 512), dtype=np.float32), device="PYTHON").sum(axis=1)
    item = [i for i in create_schedule([x.uop], "PYTHON")[0] if i.kind == "kernel"][-1]
    assert search.heuristic_options(Device["PYTHON"], item.ast).group > 0
    assert search.heuristic_options(Device["CPU"], item.ast).group == 0


def test_a_group_reductions_neighbours_are_other_groups_and_no_group():
    found = search.neighbours(KernelOptions(group=16), (4, 512))
    assert KernelOptions(group=8) in found and KernelOptions(group=32) in found
    assert KernelOptions(group=16, group_combine="serial") in found
    assert KernelOptions() in found and all(o != KernelOptions(group=16) for o in found)
