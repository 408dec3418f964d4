"""Chapter 7: the kernel optimizer — upcasts, vectors, threads and packing change how a kernel
runs, never what it computes. Each optimization is checked against numpy, on and off."""
from __future__ import annotations

import numpy as np
import pytest

from tinyteach import Context, Tensor
from tinyteach.codegen.lower import lower
from tinyteach.codegen.plan import KernelOptions
from tinyteach.device import Device
from tinyteach.engine.schedule import create_schedule
from tinyteach.opt.heuristic import choose_options, heuristic_plan
from tinyteach.opt.pack import plan_packing
from tinyteach.render.c import CRenderer


def data(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def kernel_asts(tensor: Tensor) -> list:
    items, _ = create_schedule([tensor.uop], "CPU")
    return [item.ast for item in items if item.kind == "kernel"]


@pytest.fixture(params=[16, 8, 4])
def vector_width(request, monkeypatch):
    """Run the CPU device as if its vector registers held 16, 8 or 4 floats."""
    monkeypatch.setattr(Device["CPU"].renderer, "vector_width", request.param)
    return request.param


# ---- the heuristic's choices ----

def test_matmul_gets_a_vector_tile():
    a, b = Tensor(data(64, 64)), Tensor(data(64, 64, seed=1))
    (ast,) = kernel_asts(a @ b)
    options = choose_options(ast, 16)
    assert options.upcasts == ((0, 8), (1, 32)) and options.vector_width == 16
    assert options.loop_order == (1, 0)  # a panel of columns outside, every row inside
    assert "vectors: axis 1's 32 values as 2 vector(s) of 16 lanes" in options.describe()


def test_convolution_rows_of_24_and_8_take_half_width_vectors():
    """A 16-lane target (AVX-512) with 24 or 8 outputs per row: 8-lane halves, three per row
    where 32 registers hold 8 x 3 accumulators. (beautiful_mnist's second convolution's input
    gradient took 347 ms as scalar 4 x 8 tiles and takes 28 ms so.) An 8-lane target (AVX2,
    16 registers) keeps one vector of 8 per row; both give numpy's numbers."""
    x, w = Tensor(data(2, 4, 12, 24)), Tensor(data(3, 4, 5, 5, seed=1))
    upstream = Tensor(data(2, 3, 8, 20, seed=2))
    x.requires_grad = True
    (x.conv2d(w) * upstream).sum().backward()
    ast = kernel_asts(x.grad)[-1]  # (the first pads the upstream gradient)
    wide = choose_options(ast, 16)
    assert wide.vector_width == 8 and dict(wide.upcasts)[3] == 24 and dict(wide.upcasts)[2] == 4
    narrow = choose_options(ast, 8)
    assert narrow.vector_width == 8 and dict(narrow.upcasts)[3] == 8
    torch = pytest.importorskip("torch")
    tx = torch.tensor(x.numpy(), requires_grad=True)
    (torch.nn.functional.conv2d(tx, torch.tensor(w.numpy())) *
     torch.tensor(upstream.numpy())).sum().backward()
    for width in (16, 8):
        program = lower(ast, choose_options(ast, width))
        source = CRenderer(width).render("k", program)
        assert "float_vec8" in source
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    rows_of_8 = Tensor(data(2, 4, 8, 8))
    rows_of_8.requires_grad = True
    (rows_of_8.conv2d(Tensor(data(4, 4, 3, 3, seed=3))) * Tensor(data(2, 4, 6, 6, seed=4))
     ).sum().backward()
    ast = kernel_asts(rows_of_8.grad)[-1]
    assert choose_options(ast, 16).vector_width == 8


def test_a_sum_too_short_for_lanes_leaves_the_vectors_to_the_outputs():
    """A one-channel 5x5 convolution reads its input contiguously along the 5 kernel columns,
    too few to split into lanes (SIMD_MIN_LOOP): the outputs' rows take the vectors instead,
    at 16 lanes (AVX-512: 8 rows x 3 halves for 24 pixels) and at 8 (beautiful_mnist's conv1
    forward: 8.6 ms in scalar 4x4 tiles, 1.6 ms so). Same numbers as numpy."""
    x, w = data(2, 1, 12, 28), data(4, 1, 5, 5, seed=1)
    (ast,) = kernel_asts(Tensor(x).conv2d(Tensor(w)))
    for width in (16, 8):
        options = choose_options(ast, width)
        assert options.vector_width == 8 and max(dict(options.upcasts).values()) in (8, 24)
    windows = np.lib.stride_tricks.sliding_window_view(x, (5, 5), axis=(2, 3))
    expected = np.einsum("bchwij,ocij->bohw", windows, w)
    np.testing.assert_allclose(Tensor(x).conv2d(Tensor(w)).numpy(), expected, rtol=1e-4,
                               atol=1e-4)


def test_vectorize_takes_the_full_width_or_its_half():
    from tinyteach.opt import Kernel, KernelOptError, Opt, OptOps
    a, b = Tensor(data(64, 64)), Tensor(data(64, 64, seed=1))
    (ast,) = kernel_asts(a @ b)
    width = Device["CPU"].renderer.vector_width
    if width < 8:
        pytest.skip(f"the CPU renders {width} lanes: no half of at least 4")
    half = Kernel(ast, "CPU").apply_opts([Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.VECTORIZE, 1,
                                                                          width // 2)])
    assert half.plan.vector_width == width // 2
    with pytest.raises(KernelOptError, match=f"vectors have {width} lanes .or {width // 2} in "
                                             f"their halves., not 2"):
        Kernel(ast, "CPU").apply_opts([Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.VECTORIZE, 1, 2)])


def test_a_long_epilogue_keeps_eight_rows():
    """gelu after the sum (23 ops per output) keeps the 8-row vector tile: on an idle AVX2
    machine 8 rows were faster for gelu (2.20 against 2.43 ms) and for gelu's gradient (1.77
    against 2.06)."""
    a, b = Tensor(data(64, 64)), Tensor(data(64, 64, seed=1))
    (ast,) = kernel_asts((a @ b).gelu())
    options = choose_options(ast, 8)
    assert options.upcasts == ((0, 8), (1, 16)) and options.vector_width == 8


def test_a_sum_of_expensive_terms_is_threaded_by_its_work():
    """Threads pay by work: outputs x terms x ops per term. A sum of 64 terms per output over
    4,096 outputs is 262,144 terms: one multiply each stays on one core, a masked exponential
    each (softmax's gradient recomputes one per term) is split across cores."""
    scores, grads = Tensor(data(16, 4, 64, 64)), Tensor(data(16, 4, 64, 64, seed=1))
    (cheap,) = kernel_asts((scores * grads).sum(-1))
    assert not choose_options(cheap, 8).parallel
    mask = Tensor.ones(64, 64, dtype="bool").tril()
    costly = ((scores / 8).masked_fill(mask.logical_not(), float("-inf")).exp() * grads).sum(-1)
    asts = kernel_asts(costly)
    assert any(choose_options(ast, 8).parallel for ast in asts)


def test_without_vector_types_the_tile_is_scalar():
    a, b = Tensor(data(64, 64)), Tensor(data(64, 64, seed=1))
    (ast,) = kernel_asts(a @ b)
    options = choose_options(ast, 0)
    assert options.vector_width == 0 and options.upcasts == ((0, 4), (1, 8))


def test_noopt_turns_everything_off():
    a, b = Tensor(data(64, 64)), Tensor(data(64, 64, seed=1))
    (ast,) = kernel_asts(a @ b)
    with Context(NOOPT=1):
        assert choose_options(ast, 16) == KernelOptions()
        assert "float_vec" not in CRenderer(16).render("k", lower(ast, heuristic_plan(ast, 16)))


def test_vector_source_uses_vector_loads_and_accumulators():
    a, b = Tensor(data(32, 64)), Tensor(data(64, 48, seed=1))
    (ast,) = kernel_asts(a @ b)
    program = lower(ast, heuristic_plan(ast, 16))
    source = CRenderer(16, fused_multiply_add=True).render("mm", program)
    assert "typedef float float_vec16 __attribute__((vector_size(64), aligned(4)));" in source
    assert "*(const float_vec16*)(data2+" in source      # one load for 16 columns of b
    assert "float_vec16 acc0" in source and "*(float_vec16*)(data0+" in source
    assert "fma_float_vec16(splat_float_vec16(" in source and "fp-contract" not in source
    assert "__builtin_ia32_vfmaddps512_mask(" in source and "__builtin_fmaf(" in source  # both
    assert program.options.vector_width == 16


def test_a_lane_dependent_guard_falls_back_to_scalars():
    # padding along the vector axis: each lane has its own guard, so the tile stays scalar
    x = Tensor(data(8, 30)).pad(((0, 0), (1, 1)))
    (ast,) = kernel_asts(x.expand(4, 8, 32).sum(axis=1))
    program = lower(ast, choose_options(ast, 16))
    assert program.options.vector_width == 0
    assert "float_vec" not in CRenderer(16).render("k", program)


# ---- results: vectors on, off, and at every width ----

CASES = {
    "matmul": (lambda a, b: a @ b, lambda a, b: a @ b),
    "matmul + bias, relu": (lambda a, b: (a @ b + 1).relu(), lambda a, b: np.maximum(a @ b + 1, 0)),
    "matmul, exp": (lambda a, b: (a @ b * 0.1).exp(), lambda a, b: np.exp(a @ b * 0.1)),
    "max over rows": (lambda a, b: (a @ b).max(axis=0), lambda a, b: (a @ b).max(axis=0)),
    "column sums": (lambda a, b: (a.T * 2).sum(axis=0), lambda a, b: (a.T * 2).sum(axis=0)),
    "column max": (lambda a, b: a.max(axis=0), lambda a, b: a.max(axis=0)),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("shape", [(32, 48, 64), (16, 16, 16), (24, 40, 96), (8, 33, 32)])
def test_vectorized_kernels_match_numpy(case, shape, vector_width):
    m, k, n = shape
    ours, theirs = CASES[case]
    a, b = data(m, k), data(k, n, seed=1)
    if case in ("column sums", "column max"):
        a = data(k, n)
    result = ours(Tensor(a), Tensor(b)).numpy()
    np.testing.assert_allclose(result, theirs(a, b), rtol=1e-4, atol=1e-4)


def test_batched_matmul_with_vectors(vector_width):
    a, b = data(3, 16, 24), data(3, 24, 32, seed=1)
    np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-4, atol=1e-4)


def test_vector_results_equal_noopt_results():
    a, b = data(48, 64), data(64, 64, seed=1)
    fast = (Tensor(a) @ Tensor(b)).relu().numpy()
    with Context(NOOPT=1):
        plain = (Tensor(a) @ Tensor(b)).relu().numpy()
    np.testing.assert_allclose(fast, plain, rtol=1e-5, atol=1e-5)


def test_nan_survives_a_vector_max():
    x = data(16, 32)
    x[3, 5] = np.nan
    result = Tensor(x).max(axis=0).numpy()
    assert np.isnan(result[5]) and not np.isnan(np.delete(result, 5)).any()


# ---- packing ----

def test_big_matmul_operand_is_packed():
    a, b = Tensor(data(1024, 1024)), Tensor(data(1024, 1024, seed=1))
    (ast,) = kernel_asts(a @ b)
    plan = plan_packing(ast, 16)
    assert plan is not None and plan.input_index == 2 and plan.panel == 32
    assert plan.packed_size == 1024 * 1024


def test_small_operands_are_not_packed():
    a, b = Tensor(data(128, 784)), Tensor(data(784, 128, seed=1))  # an MLP layer
    (ast,) = kernel_asts(a @ b)
    assert plan_packing(ast, 16) is None
    assert plan_packing(ast, 0) is None


@pytest.fixture
def pack_512(monkeypatch):
    """Pack from 512 x 512 operands on (the default starts at 1024 x 1024), with 16 lanes."""
    import tinyteach.opt.pack
    monkeypatch.setattr(tinyteach.opt.pack, "PACK_MIN_ELEMENTS", 512 * 512)
    monkeypatch.setattr(tinyteach.opt.pack, "_plans", {})
    monkeypatch.setattr(Device["CPU"].renderer, "vector_width", 16)


def test_packed_matmul_matches_numpy(pack_512):
    a, b = data(64, 512), data(512, 512, seed=1)
    from tinyteach.engine.realize import record_launches
    with record_launches() as launches:
        result = (Tensor(a) @ Tensor(b)).relu().numpy()
    names = [launch.item.name for launch in launches]
    assert any(name.startswith("pack_") for name in names)
    np.testing.assert_allclose(result, np.maximum(a @ b, 0), rtol=1e-4, atol=1e-3)


def test_packed_batched_matmul_matches_numpy(pack_512):
    a, b = data(2, 32, 512), data(2, 512, 512, seed=1)
    np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-4, atol=1e-3)


def test_packed_broadcast_operand_matches_numpy(pack_512):
    a, b = data(2, 32, 512), data(512, 512, seed=1)  # one b for both batches
    np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-4, atol=1e-3)


def weight_gradient(batch: int, length: int, k: int, n: int) -> tuple[Tensor, np.ndarray]:
    """X.T @ dY summed over a batch of sequences (a Linear layer's weight gradient), and
    numpy's value of it."""
    x, dy = data(batch, length, k), data(batch, length, n, seed=1)
    out = (Tensor(x).reshape(batch, length, k, 1) * Tensor(dy).reshape(batch, length, 1, n))
    return out.sum((0, 1)), np.einsum("btk,btn->kn", x, dy)


def test_a_weight_gradients_scalar_operand_is_packed_in_panels_of_its_rows():
    """X.T @ dY over 16 x 64 rows: the tile reads 8 floats of each 2 KB row of X (its `a`),
    rows that fall into two cache sets. X is packed in panels of 8 columns, the two axes of
    the sum one after the other (fails before: only `b` was packed, and only over one axis)."""
    grad, _ = weight_gradient(16, 64, 512, 128)
    (ast,) = kernel_asts(grad)
    plan = plan_packing(ast, 16)
    assert plan is not None and plan.input_index == 1 and plan.panel == 8
    assert plan.packed_size == 16 * 64 * 512


@pytest.mark.parametrize("k, n", [(512, 128), (128, 512)])
def test_packed_weight_gradients_match_numpy(monkeypatch, k, n):
    from tinyteach.engine.realize import record_launches
    monkeypatch.setattr(Device["CPU"].renderer, "vector_width", 16)
    grad, expected = weight_gradient(16, 64, k, n)
    with record_launches() as launches:
        result = grad.numpy()
    assert any(launch.item.name.startswith("pack_") for launch in launches)
    np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-3)


def test_noopt_does_not_pack(pack_512):
    from tinyteach.engine.realize import record_launches
    a, b = Tensor(data(64, 512)).realize(), Tensor(data(512, 512, seed=1)).realize()
    with Context(NOOPT=1), record_launches() as launches:
        (a @ b).realize()
    assert [launch.item.name for launch in launches] == ["r_64_512_512"]


def test_gradients_through_a_packed_matmul(pack_512):
    a, b = data(32, 512), data(512, 512, seed=1)
    ta, tb = Tensor(a, requires_grad=True), Tensor(b, requires_grad=True)
    (ta @ tb).sum().backward()
    np.testing.assert_allclose(ta.grad.numpy(), np.ones((32, 512)) @ b.T, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(tb.grad.numpy(), a.T @ np.ones((32, 512)), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("width", [4, 16])
def test_opencl_vector_kernels_match_numpy(case, width, monkeypatch):
    if not Device.is_available("OPENCL"):
        pytest.skip("no OpenCL device here")
    monkeypatch.setattr(Device["OPENCL"].renderer, "vector_width", width)
    ours, theirs = CASES[case]
    a, b = data(32, 64), data(64, 96, seed=1)
    if case in ("column sums", "column max"):
        a = data(64, 96)
    result = ours(Tensor(a, device="OPENCL"), Tensor(b, device="OPENCL")).numpy()
    np.testing.assert_allclose(result, theirs(a, b), rtol=1e-4, atol=1e-4)


def test_opencl_source_uses_its_own_vector_types():
    from tinyteach.render.opencl import OpenCLRenderer
    a, b = Tensor(data(32, 64)), Tensor(data(64, 48, seed=1))
    (ast,) = kernel_asts(a @ b)
    renderer = OpenCLRenderer()
    renderer.vector_width = 16
    source = renderer.render("mm", lower(ast, heuristic_plan(ast, 16)))
    assert "float16 val1 = vload16(0, data2+" in source and "vstore16(acc0, 0, data0+" in source
    assert "float16 acc0 = (float16)(0.0f);" in source


# ---- the differential fuzzer (tests/fuzz_graphs.py), with optimizations off and with small
# vectors: its shapes (1 to 6 per axis) only meet vector tiles when a vector has 2 or 4 lanes

def _fuzz(graphs: int, seed: int):
    import os
    import sys
    sys.path.insert(0, os.path.dirname(__file__))
    from fuzz_graphs import fuzz
    from helpers import fuzz_budget
    graphs = fuzz_budget(graphs)
    report = fuzz(graphs, ["CPU"], seed=seed)
    assert report.graphs == graphs
    assert report.ok(), "\n\n".join(report.failures[:5])


def test_fuzz_slice_without_optimizations():
    with Context(NOOPT=1):
        _fuzz(30, seed=2027)


@pytest.mark.parametrize("lanes", [2, 4])
def test_fuzz_slice_with_small_vectors(lanes, monkeypatch):
    monkeypatch.setattr(Device["CPU"].renderer, "vector_width", lanes)
    _fuzz(20, seed=2028 + lanes)


# ---- the group reduction (a GPU option: only where the renderer supports it) ----

def test_group_reduction_is_never_chosen_for_the_cpu():
    from tinyteach.opt.heuristic import options_for_renderer
    (ast,) = kernel_asts(Tensor(data(8, 512)).sum(axis=1))
    assert options_for_renderer(ast, Device["CPU"].renderer).group == 0
    assert choose_options(ast, 16).group == 0
    assert choose_options(ast, 0, group_reduce=True).group > 0


def test_group_reduction_is_listed_like_the_cpu_options():
    (ast,) = kernel_asts(Tensor(data(8, 512)).max(axis=1))
    program = lower(ast, KernelOptions(group=32, group_combine="serial"))
    assert program.applied_opts == ["group reduce: 32 threads of a work-group share each "
                                    "reduction, partials in shared memory, combined by "
                                    "thread 0 (serial)"]
    assert lower(ast, KernelOptions(group=32)).applied_opts[0].endswith("by a tree (halving)")


def test_an_elementwise_kernel_is_threaded_by_its_work_not_its_size():
    """Outputs times ops per output decide (opt._elementwise_with_threads): a 16x64x512
    gelu (0.5 M outputs, dozens of ops each) splits across cores, the same size of `x + 1`
    (one op each) and a small gelu do not."""

    def plan_of_kernel(t: Tensor) -> KernelOptions:
        items, _ = create_schedule([t.uop], "CPU")
        (item,) = [i for i in items if i.ast is not None]
        return heuristic_plan(item.ast, 8)
    big = Tensor(np.zeros((16, 64, 512), np.float32), device="CPU").realize()
    small = Tensor(np.zeros((4, 64), np.float32), device="CPU").realize()
    assert plan_of_kernel(big.gelu()).parallel
    assert not plan_of_kernel(big + 1).parallel
    assert not plan_of_kernel(small.gelu()).parallel


def test_a_concatenation_reads_each_input_as_the_first_one_is_read():
    """cat is a sum of padded inputs, and each input is read only inside its own third: there
    its index is as simple as the first third's (one / and one % for the head split of
    (b, head, t, d) -> (b, t, head*d)), where before the shifted counter, negative outside
    its third, kept (x/32)%3 and a % of the whole buffer (simplify_given_valid). The result
    equals numpy's."""
    parts = [data(4, 3, 8, 32, seed=s) for s in range(3)]
    out = Tensor.cat(*[Tensor(p).permute(0, 2, 1, 3).reshape(4, 8, 96) for p in parts], dim=-1)
    (ast,) = kernel_asts(out)
    source = CRenderer(0).render("cat", lower(ast, KernelOptions()))
    reads = [line.split("?", 1)[1] for line in source.splitlines() if "?data" in line]
    assert len(reads) == 3 and all(r.count("%") == 1 and r.count("/") == 1 for r in reads)
    expected = np.concatenate([p.transpose(0, 2, 1, 3).reshape(4, 8, 96) for p in parts], -1)
    np.testing.assert_array_equal(out.numpy(), expected)


def test_an_elementwise_kernel_counts_its_padded_reads_as_work():
    """A concatenation of three 16x64x128 tensors is two adds per output, 0.8 M ops by ALU ops
    alone, under PARALLEL_MIN_WORK; its three padded reads (each a guard per output) make it
    2 M, and it gets threads (0.41 ms on one core in the GPT's backward). A small one stays on
    one core, and so does `x + 1` of the same size (test above)."""
    def threads(n: int) -> bool:
        parts = [Tensor(data(16, 64, n, seed=s)) for s in range(3)]
        (ast,) = kernel_asts(Tensor.cat(*parts, dim=-1))
        return choose_options(ast, 16).parallel
    assert threads(128) and not threads(8)


def test_packed_weight_gradient_carries_nan_and_inf(monkeypatch):
    """A NaN or an infinity in X reaches exactly the gradient entries numpy's have, through the
    packed panels of X (the row of X.T it sits in)."""
    monkeypatch.setattr(Device["CPU"].renderer, "vector_width", 16)
    x, dy = data(16, 64, 512), data(16, 64, 128, seed=1)
    x[3, 7, 5], x[9, 1, 300], x[0, 0, 511] = np.nan, np.inf, -np.inf
    grad = (Tensor(x).reshape(16, 64, 512, 1) * Tensor(dy).reshape(16, 64, 1, 128)).sum((0, 1))
    (ast,) = kernel_asts(grad)
    assert plan_packing(ast, 16) is not None
    expected = np.einsum("btk,btn->kn", x, dy)
    np.testing.assert_allclose(grad.numpy(), expected, rtol=1e-4, atol=1e-3)
    assert np.isnan(expected[5]).all() and np.isinf(expected[300]).all()
