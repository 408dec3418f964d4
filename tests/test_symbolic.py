"""Symbolic shapes: a size that is a Variable, one compiled kernel for every value, one JIT
capture for every length (issue 13). Numbers are checked against numpy."""
from __future__ import annotations

import numpy as np
import pytest

import tinyteach
import viz
from tinyteach import Context, Tensor, TinyJit, Variable
from tinyteach.codegen.lower import lower
from tinyteach.engine.realize import (
    PLAN_CACHE,
    build_schedule,
    plan_cache,
    record_launches,
)
from tinyteach.ir.uop import Ops, UOp, sym_eval, sym_prod, unbind_graph
from tinyteach.opt.heuristic import heuristic_plan
from tinyteach.render.cuda import CUDARenderer

RNG = np.random.default_rng(0)
A = RNG.standard_normal((10, 4)).astype(np.float32)
W = RNG.standard_normal((10, 6)).astype(np.float32)


def variable() -> UOp:
    return Variable("i", 1, 10)


# ---- the variable ----

def test_variable_is_an_integer_uop_exported_at_the_top_level() -> None:
    v = tinyteach.Variable("i", 1, 64)
    assert v.op is Ops.DEFINE_VAR and v.arg == ("i", 1, 64)
    assert (v.vmin, v.vmax) == (1, 64)
    bound = v.bind(7)
    assert bound.op is Ops.BIND and bound.unbind() == (v, 7)
    assert ((v * 4).vmin, (v * 4).vmax) == (4, 256)
    assert ((v + 1).vmax, (v // 2).vmax) == (65, 32)
    assert sym_eval(bound * 4 + 1) == 29
    assert repr(v * 4) == "(i*4)" and repr(bound) == "i"


def test_bind_outside_the_range_names_the_variable_and_its_range() -> None:
    with pytest.raises(ValueError, match=r"'i' is bound to 65, outside its range \[1, 64\]"):
        Variable("i", 1, 64).bind(65)
    with pytest.raises(ValueError, match="outside its range"):
        Variable("i", 1, 64).bind(0)
    with pytest.raises(TypeError, match="takes an int"):
        Variable("i", 1, 64).bind(2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="identifier"):
        Variable("not a name", 1, 4)
    with pytest.raises(ValueError, match="min <= max"):
        Variable("i", 5, 4)


def test_equal_symbolic_counts_are_the_same_node() -> None:
    v = variable()
    assert sym_prod((v, 4)) is sym_prod((4, v)) is sym_prod((1, v, 2, 2))
    assert sym_prod((2, 3)) == 6


def test_a_symbolic_reshape_must_keep_the_element_count() -> None:
    x = Tensor(A).realize().shrink(((0, variable().bind(3)), None))
    with pytest.raises(ValueError, match="must keep the element count"):
        x.reshape(variable().bind(3), 2)


def test_a_symbolic_shrink_must_fit_for_every_value_of_the_variable() -> None:
    x = Tensor(A[:5]).realize()
    with pytest.raises(ValueError, match="checked over the variables' ranges"):
        x.shrink(((0, variable().bind(3)), None))  # i may be up to 10 > 5 rows


def test_a_bound_symbolic_size_takes_a_slice_that_fits_its_value() -> None:
    """tinygrad's rule: x[:i.bind(2)] has the size i, bound to 2, and [:2] of it fits that
    value (a size is stored for its largest value, 10, so any replay stays in memory); [:3]
    does not fit the bound value, and [:11] not even the largest."""
    i = variable()
    ones = Tensor.ones(10).contiguous()
    for value in (2, 5):
        part = ones[:i.bind(value)] + 1
        assert part.contiguous()[:value].tolist() == [2.0] * value
    with pytest.raises(ValueError, match="out of range"):
        ones[:i.bind(2)][:3]
    with pytest.raises(ValueError, match="out of range"):
        ones[:i.bind(10)][:11]


# ---- results against numpy, on every device ----

CASES = {
    "shrink elementwise": (lambda x, w, b: (x.shrink(((0, b), None)) * 2 + 1).exp(),
                           lambda n: np.exp(A[:n] * 2 + 1)),
    "reshape": (lambda x, w, b: x.shrink(((0, b), None)).reshape(b * 4).reshape(1, b, 2, 2),
                lambda n: A[:n].reshape(1, n, 2, 2)),
    "pad": (lambda x, w, b: x.shrink(((0, b), None)).pad(((1, 2), (0, 1))),
            lambda n: np.pad(A[:n], ((1, 2), (0, 1)))),
    "symbolic pad": (lambda x, w, b: x[:2].pad(((0, b), None)),
                     lambda n: np.pad(A[:2], ((0, n), (0, 0)))),
    "sum over a symbolic axis": (lambda x, w, b: x.shrink(((0, b), None)).sum(0),
                                 lambda n: A[:n].sum(0)),
    "mean over a symbolic axis": (lambda x, w, b: x.shrink(((0, b), None)).mean(0),
                                  lambda n: A[:n].mean(0)),
    "softmax over a symbolic axis": (lambda x, w, b: x.shrink(((0, b), None)).T.softmax(-1),
                                     lambda n: np.exp(A[:n].T) / np.exp(A[:n].T).sum(
                                         -1, keepdims=True)),
    "matmul, symbolic inner size": (
        lambda x, w, b: x.shrink(((0, b), None)).T @ w.shrink(((0, b), None)),
        lambda n: A[:n].T @ W[:n]),
    "matmul, symbolic outer size": (lambda x, w, b: x.shrink(((0, b), None)) @ x[:4].T,
                                    lambda n: A[:n] @ A[:4].T),
    "cat": (lambda x, w, b: x.shrink(((0, b), None)).cat(x[:2]),
            lambda n: np.concatenate([A[:n], A[:2]])),
}


@pytest.mark.parametrize("case", list(CASES))
def test_symbolic_results_match_numpy(device: str, case: str) -> None:
    build, reference = CASES[case]
    x, w = Tensor(A).realize(), Tensor(W).realize()
    for n in (3, 7):
        out = build(x, w, variable().bind(n))
        np.testing.assert_allclose(out.numpy(), reference(n), rtol=1e-5, atol=1e-5)


def test_a_symbolic_result_is_stored_in_a_buffer_for_the_largest_value(device: str) -> None:
    y = (Tensor(A).realize().shrink(((0, variable().bind(3)), None)) + 1).realize()
    assert y.uop.has_symbols and str(y.shape) == "(i, 4)"
    buffer = y._buffer()
    assert buffer.size == 10 * 4  # room for i = 10
    np.testing.assert_allclose(y.numpy(), A[:3] + 1)
    assert y.numpy().shape == (3, 4)


# ---- one compiled program for every value ----

def test_every_value_runs_the_same_compiled_program() -> None:
    x = Tensor(A, device="CPU").realize()
    runners = []
    for n in (3, 5, 8):
        with record_launches() as launches:
            out = (x.shrink(((0, variable().bind(n)), None)) * 3).sum(1).realize()
        np.testing.assert_allclose(out.numpy(), (A[:n] * 3).sum(1), rtol=1e-5)
        (launch,) = launches
        assert launch.var_vals == {"i": n}
        runners.append(launch.runner)
    assert runners[0] is runners[1] is runners[2]
    assert runners[0].variables == ("i",)
    assert "const int i" in runners[0].source and "ridx0 < i" not in runners[0].source
    assert "gidx0 < i" in runners[0].source


def test_one_compile_counts_for_several_values(monkeypatch: pytest.MonkeyPatch) -> None:
    from tinyteach.engine import realize
    compiled = []
    original = realize.compile_kernel

    def counting(backend, name, ast):  # type: ignore[no-untyped-def]
        compiled.append(name)
        return original(backend, name, ast)
    monkeypatch.setattr(realize, "compile_kernel", counting)
    x = Tensor(A, device="CPU").realize()
    for n in (2, 4, 6, 9):  # (the constant 0.3125 makes a kernel no other test compiles)
        out = (x.shrink(((0, variable().bind(n)), None)).exp2() - 0.3125).realize()
        np.testing.assert_allclose(out.numpy(), np.exp2(A[:n]) - 0.3125, rtol=1e-5)
    assert len(compiled) == 1


def test_the_plan_cache_reuses_the_plan_with_the_new_value() -> None:
    assert PLAN_CACHE.value
    x = Tensor(A, device="CPU").realize()
    results = []
    for n in (3, 6, 3, 9):
        before = len(plan_cache)
        out = (x.shrink(((0, variable().bind(n)), None)) - 2).max(1).realize()
        results.append((n, out.numpy(), len(plan_cache) - before))
    for n, values, _ in results:
        np.testing.assert_allclose(values, (A[:n] - 2).max(1))  # never the old value
    assert [grown for *_, grown in results[1:]] == [0, 0, 0]  # one plan for every value


def test_the_schedule_carries_the_values_and_the_ast_only_the_variable() -> None:
    x = Tensor(A, device="CPU").realize()
    roots, var_vals = unbind_graph([x.shrink(((0, variable().bind(4)), None)).sum(0).uop])
    assert var_vals == {"i": 4}
    schedule = build_schedule(roots, "CPU", var_vals)
    (item,) = schedule.items
    assert item.var_vals == {"i": 4} and item.name == "r_4_i"
    assert not any(n.op is Ops.BIND for n in item.ast.toposort)


def test_every_renderer_declares_the_variable_as_a_parameter() -> None:
    from tinyteach.render.c import CRenderer
    from tinyteach.render.opencl import OpenCLRenderer
    from tinyteach.render.wgsl import WGSLRenderer
    x = Tensor(A, device="CPU").realize()
    roots, var_vals = unbind_graph([(x.shrink(((0, variable().bind(4)), None)) + 1).uop])
    (item,) = build_schedule(roots, "CPU", var_vals).items
    program = lower(item.ast, heuristic_plan(item.ast))
    for renderer in (CRenderer(), OpenCLRenderer(), CUDARenderer()):
        source = renderer.render(item.name, program)
        assert "const int i" in source and "< i;" in source
    wgsl = WGSLRenderer().render(item.name, program)
    assert "var<storage, read_write> vars: array<i32>" in wgsl and "< vars[0];" in wgsl


# ---- TinyJit: one capture for every length ----

def test_jit_captures_once_and_replays_every_length(device: str) -> None:
    x = Tensor(A).realize()
    traced = []

    @TinyJit
    def step(t: Tensor, n: UOp) -> Tensor:
        traced.append(n)
        return ((t.shrink(((0, n), None)) * 2).sum(1) + 1).realize()
    for n in (3, 5, 2, 9, 4, 10):
        out = step(x, variable().bind(n))
        assert out.shape[0].expr == "i"
        np.testing.assert_allclose(out.numpy(), (A[:n] * 2).sum(1) + 1, rtol=1e-5)
    assert len(traced) == 2  # the first call ran, the second captured, the rest replayed
    assert step.calls == 6


def test_jit_with_an_input_of_symbolic_shape() -> None:
    x = Tensor(A, device="CPU").realize()

    @TinyJit
    def squares(t: Tensor) -> Tensor:
        return (t * t).sum(0).realize()
    for n in (3, 5, 2, 9):
        rows = x.shrink(((0, variable().bind(n)), None)).contiguous().realize()
        np.testing.assert_allclose(squares(rows).numpy(), (A[:n] ** 2).sum(0), rtol=1e-5)
    assert squares.captured is not None and squares.captured.symbolic


def test_jit_value_out_of_range_is_a_clear_error() -> None:
    x = Tensor(A, device="CPU").realize()

    @TinyJit
    def step(t: Tensor, n: UOp) -> Tensor:
        return (t.shrink(((0, n), None)) + 1).realize()
    for n in (2, 3, 4):
        step(x, variable().bind(n))
    with pytest.raises(ValueError, match=r"Variable 'i' is bound to 11, outside its range"):
        step(x, variable().bind(11))


# ---- visible: DEBUG and viz print the size by name ----

def test_debug_prints_the_symbolic_size_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    x = Tensor(A, device="CPU").realize()
    with Context(DEBUG=4):
        (x.shrink(((0, variable().bind(3)), None)) * 5).sum(0).realize()
    printed = capsys.readouterr().out
    assert "r_4_i" in printed and " i=3" in printed          # DEBUG=1/2: the launch
    assert "arg=((0, i), (0, 4))" in printed                 # DEBUG=3: the AST
    assert "symbolic sizes: i=3" in printed
    assert "const int i" in printed and "ridx0 < i" in printed  # DEBUG=4: the source


def test_viz_shows_the_symbolic_size_by_name() -> None:
    x = Tensor(A, device="CPU").realize()
    y = (x.shrink(((0, variable().bind(3)), None)) * 2).sum(0)
    assert "of shape (i, 4)" in viz.schedule(y).text
    kernel = viz.kernel(y, languages=["C"]).text
    assert "const int i" in kernel and "('r', 0, i)" in kernel
    assert "(i, 4)" in viz.graph(y).text


def test_the_cuda_source_with_a_variable_compiles_where_nvrtc_is() -> None:
    try:
        from tinyteach.runtime.cuda import CUDACompiler, compile_for_cuda
        compiler = CUDACompiler()
    except Exception as error:  # noqa: BLE001 - no CUDA compiler on this machine
        pytest.skip(f"no CUDA compiler: {error}")
    x = Tensor(A, device="CPU").realize()
    roots, var_vals = unbind_graph([(x.shrink(((0, variable().bind(4)), None)) * 2).sum(0).uop])
    (item,) = build_schedule(roots, "CPU", var_vals).items
    kernel = compile_for_cuda(item.name, item.ast, compiler)
    assert f".entry {item.name}(" in kernel.ptx
    assert f".param .u32 {item.name}_param_2" in kernel.ptx  # after the two buffers: int i


# ---- function: tinygrad's graph-capture decorator ----

def test_function_runs_its_python_once_per_signature_and_stays_lazy() -> None:
    traced = []

    @tinyteach.function
    def f(a: Tensor, b: Tensor) -> Tensor:
        traced.append(a.shape)
        return (a + b) * 2
    x, y = RNG.standard_normal(3).astype(np.float32), RNG.standard_normal(3).astype(np.float32)
    out = f(Tensor(x), Tensor(y))
    assert out.uop.op is not Ops.BUFFER  # lazy: nothing computed yet
    np.testing.assert_allclose(out.numpy(), (x + y) * 2, rtol=1e-6)
    np.testing.assert_allclose(f(Tensor(y), Tensor(x)).numpy(), (x + y) * 2, rtol=1e-6)
    np.testing.assert_allclose(f(Tensor(A), Tensor(A)).numpy(), A * 4, rtol=1e-6)
    assert traced == [(3,), (10, 4)]  # one trace per shape


def test_function_backward_goes_through_it() -> None:
    @tinyteach.function
    def f(a: Tensor, b: Tensor) -> Tensor:
        return (a * b).sum()
    a, b = Tensor(A[0], requires_grad=True), Tensor(A[1])
    f(a, b).backward()
    np.testing.assert_allclose(a.grad.numpy(), A[1], rtol=1e-6)


def test_function_with_a_bound_variable_reuses_one_trace() -> None:
    @tinyteach.function
    def first_rows_sum(x: Tensor, n: UOp) -> Tensor:
        return x.shrink(((0, n), None)).sum(0)
    x = Tensor(A).realize()
    for n in (2, 5, 9):
        np.testing.assert_allclose(first_rows_sum(x, variable().bind(n)).numpy(),
                                   A[:n].sum(0), rtol=1e-5)
    assert len(first_rows_sum.traces) == 1


def test_function_refuses_implicit_inputs_and_computing_while_traced() -> None:
    w = Tensor(A[0]).realize()

    @tinyteach.function
    def reads_w(x: Tensor) -> Tensor:
        return x + w
    with pytest.raises(ValueError, match="not its arguments"):
        reads_w(Tensor(A[1]))
    allowed = tinyteach.function(allow_implicit=True)(lambda x: x + w)
    np.testing.assert_allclose(allowed(Tensor(A[1])).numpy(), A[0] + A[1], rtol=1e-6)

    @tinyteach.function
    def computes(x: Tensor) -> float:
        return x.sum().item()
    with pytest.raises(RuntimeError, match="computed a value while it was traced"):
        computes(Tensor(A[1]))


def test_a_method_reads_its_models_weights_as_inputs_and_trains() -> None:
    """tinygrad's rule (issue 26, beautiful_mnist's `@function` on a method): the tensors
    reachable from the arguments, `self`'s layers here, are the function's inputs. Each call
    reads their contents of that moment, so Adam's steps are seen, and what the body assigns
    (BatchNorm's running statistics) each call assigns again: the losses and the statistics
    are the undecorated model's, step for step."""
    from tinyteach import nn

    class Model:
        def __init__(self) -> None:
            self.layers = [nn.Linear(4, 8), nn.BatchNorm(8), Tensor.relu, nn.Linear(8, 3)]

        def forward(self, x: Tensor) -> Tensor:
            return x.sequential(self.layers)

        @tinyteach.function
        def __call__(self, x: Tensor) -> Tensor:
            return self.forward(x)

    x, y = Tensor(A[:, :4].copy()), Tensor(np.arange(10) % 3)

    def train(call: str) -> tuple[list[float], np.ndarray]:
        Tensor.manual_seed(3)
        model = Model()
        opt = nn.optim.Adam(nn.state.get_parameters(model), lr=0.05)
        losses = []
        for _ in range(4):
            with Tensor.train():
                opt.zero_grad()
                out = model(x) if call == "function" else model.forward(x)
                loss = out.sparse_categorical_crossentropy(y).backward()
                opt.step()
            losses.append(loss.item())
        return losses, model.layers[1].running_mean.numpy()
    (traced, traced_mean), (plain, plain_mean) = train("function"), train("plain")
    assert len(Model.__dict__["__call__"].traces) == 1  # traced once, for four steps
    np.testing.assert_allclose(traced, plain, rtol=1e-6)
    np.testing.assert_allclose(traced_mean, plain_mean, rtol=1e-6)
    assert traced[-1] < traced[0] and np.abs(traced_mean).sum() > 0

    class Counter:
        def __init__(self) -> None:
            self.count = Tensor([0.0]).realize()

        @tinyteach.function
        def bump(self, x: Tensor) -> Tensor:
            self.count.assign(self.count + 1)
            return x + 1
    counter = Counter()
    for _ in range(3):
        counter.bump(Tensor(A[0])).realize()
        counter.count.realize()
    assert counter.count.item() == 3.0


def test_cuda_driver_params_carry_the_variables_after_the_buffers() -> None:
    import ctypes

    from tinyteach.runtime.cuda import pack_params
    params = pack_params([0x1000, 0x2000], (7, 42))
    pointers = [params.pointers[k] for k in range(4)]
    assert [ctypes.c_void_p.from_address(p).value for p in pointers[:2]] == [0x1000, 0x2000]
    assert [ctypes.c_int32.from_address(p).value for p in pointers[2:]] == [7, 42]


def test_schedule_with_vars_gives_the_items_and_the_values() -> None:
    from tinyteach.engine.realize import run_schedule
    x = Tensor(A, device="CPU").realize()
    y = (x.shrink(((0, variable().bind(6)), None)) * 4).sum(1)
    items, var_vals = y.schedule_with_vars()
    assert var_vals == {"i": 6}
    assert [item.var_vals for item in items if item.kind == "kernel"] == [{"i": 6}]
    assert not any(n.op is Ops.BIND for item in items for n in item.ast.toposort)
    run_schedule(items)
    np.testing.assert_allclose(y.numpy(), (A[:6] * 4).sum(1), rtol=1e-5)


# ---- bad input: a value outside its range never reaches a kernel (chapter 4b) ----

def test_a_launch_outside_the_variables_range_is_refused() -> None:
    from tinyteach.engine.realize import launch_kernel
    x = Tensor(A, device="CPU").realize()
    with record_launches() as launches:
        (x.shrink(((0, variable().bind(3)), None)) + 7).realize()
    (launch,) = launches
    assert launch.runner is not None and launch.runner.variable_ranges == ((1, 10),)
    launch_kernel(launch.runner, launch.buffers, {"i": 10})  # the largest value fits its buffers
    out = np.frombuffer(launch.buffers[0].numpy().tobytes(), np.float32).reshape(10, 4)
    np.testing.assert_allclose(out, A + 7)
    for value in (11, 0, 1000):
        with pytest.raises(ValueError, match=rf"'i' is {value}, outside its range \[1, 10\]"):
            launch_kernel(launch.runner, launch.buffers, {"i": value})


def test_jit_refuses_a_variable_of_the_same_name_and_another_range() -> None:
    from tinyteach.engine.jit import JitError
    x = Tensor(np.zeros((40, 4), np.float32), device="CPU").realize()

    @TinyJit
    def step(t: Tensor, n: UOp) -> Tensor:
        return (t.shrink(((0, n), None)) * 3).realize()
    for n in (2, 3, 4):
        step(x, variable().bind(n))
    wider = Variable("i", 1, 40)  # its 30 would write past buffers sized for i <= 10
    with pytest.raises(JitError, match=r"i in \[1, 10\] -> i in \[1, 40\]"):
        step(x, wider.bind(30))


def test_broadcasting_two_variables_of_one_name_names_their_ranges() -> None:
    x = Tensor(A, device="CPU").realize()
    a = x.shrink(((0, variable().bind(3)), None))
    b = x.shrink(((0, Variable("i", 1, 5).bind(3)), None))
    with pytest.raises(Exception, match=r"sizes \[i in \[1, 10\], i in \[1, 5\]\] differ"):
        a + b
    with pytest.raises(Exception, match=r"sizes \[3, 4\] differ"):
        Tensor(A[:3]) + Tensor(A[:4])


def test_slicing_with_a_variable_is_a_shrink() -> None:
    x = Tensor(A, device="CPU").realize()
    for n in (3, 7):
        first = x[:variable().bind(n)]
        assert str(first.shape) == "(i, 4)"
        np.testing.assert_allclose(first.numpy(), A[:n])
        np.testing.assert_allclose(first[1:, 2].numpy(), A[1:n, 2])
        np.testing.assert_allclose(x[2:Variable("j", 2, 10).bind(n)].numpy(), A[2:n])
    with pytest.raises(IndexError, match="bounds >= 0 and step 1"):
        x[:variable().bind(3)][-1:]
    with pytest.raises(IndexError, match="bounds >= 0 and step 1"):
        x[:variable().bind(3):2]
    # tinygrad's rule: [:2] fits the value i is bound to (3); i is stored for its largest
    # value, so a replay with i = 1 still reads inside the memory
    np.testing.assert_allclose(x[:variable().bind(3)][:2].numpy(), A[:2])
    with pytest.raises(ValueError, match=r"size in \[1, 10\]"):
        x[:variable().bind(3)][:4]  # more than the bound value


def test_ones_zeros_and_full_take_a_variable_and_empty_refuses_one() -> None:
    for n in (2, 5):
        size = variable().bind(n)
        np.testing.assert_array_equal(Tensor.ones(size, 3).numpy(), np.ones((n, 3)))
        np.testing.assert_array_equal(Tensor.zeros(size).numpy(), np.zeros(n))
        np.testing.assert_array_equal(Tensor.full((size,), 2.5).numpy(), np.full(n, 2.5))
        assert Tensor.ones(size).sum().item() == n
    with pytest.raises(TypeError, match="only full, zeros and ones take a Variable"):
        Tensor.empty(variable().bind(3))
    with pytest.raises(TypeError, match="only full, zeros and ones take a Variable"):
        Tensor.rand(variable().bind(3))
