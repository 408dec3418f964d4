"""Chapter 10: TinyJit — capture and replay must give exactly what running eagerly gives."""
import numpy as np
import pytest

from tinyteach import Context, GlobalCounters, Tensor, TinyJit
from tinyteach.engine.jit import JitError

DEVICES = ["NUMPY", "CPU"]


def make_weights(device: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((12, 8)).astype(np.float32) * 0.3,
            rng.standard_normal((8, 3)).astype(np.float32) * 0.3)


def train_losses(device: str, steps: int, jit: bool) -> tuple[list[float], np.ndarray]:
    """An MLP trained with SGD written with assign; returns losses and final weights."""
    a, b = make_weights(device)
    w1 = Tensor(a, device=device, requires_grad=True)
    w2 = Tensor(b, device=device, requires_grad=True)

    def step(x: Tensor, y: Tensor) -> Tensor:
        loss = x.dot(w1).relu().dot(w2).sparse_categorical_crossentropy(y)
        loss.backward()
        for weight in (w1, w2):
            assert weight.grad is not None
            weight.assign(weight - 0.1 * weight.grad)
            weight.grad = None
        return loss.realize(w1, w2)

    run = TinyJit(step) if jit else step
    rng = np.random.default_rng(1)
    batches = [(rng.standard_normal((16, 12)).astype(np.float32),
                rng.integers(0, 3, 16).astype(np.int32)) for _ in range(2)]
    losses = []
    for k in range(steps):  # two batches in turn: new input buffers on every call
        x, y = batches[k % 2]
        losses.append(run(Tensor(x, device=device), Tensor(y, device=device)).item())
    return losses, w1.numpy()


@pytest.mark.parametrize("device", DEVICES)
def test_replay_matches_eager_step_by_step(device: str) -> None:
    eager_losses, eager_w1 = train_losses(device, 6, jit=False)
    jit_losses, jit_w1 = train_losses(device, 6, jit=True)
    np.testing.assert_allclose(jit_losses, eager_losses, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jit_w1, eager_w1, rtol=1e-5, atol=1e-6)
    assert eager_losses[-2] < eager_losses[0]  # it does train (same batch, later step)


@pytest.mark.parametrize("device", DEVICES)
def test_several_inputs_and_outputs(device: str) -> None:
    @TinyJit
    def both(a: Tensor, b: Tensor, scale: float = 2.0) -> tuple[Tensor, Tensor]:
        return (a + b).realize(), ((a * b).sum() * scale).realize()

    rng = np.random.default_rng(0)
    for _ in range(4):
        x, y = rng.standard_normal((2, 5)).astype(np.float32), rng.standard_normal(
            (2, 5)).astype(np.float32)
        added, total = both(Tensor(x, device=device), Tensor(y, device=device), scale=2.0)
        np.testing.assert_allclose(added.numpy(), x + y, rtol=1e-6)
        np.testing.assert_allclose(total.item(), (x * y).sum() * 2.0, rtol=1e-5)


def test_changed_shape_dtype_device_are_errors() -> None:
    @TinyJit
    def double(x: Tensor) -> Tensor:
        return (x * 2).realize()

    for _ in range(3):
        double(Tensor([1.0, 2.0, 3.0]))
    with pytest.raises(JitError, match=r"argument 0 changed.*shape \(3,\) -> \(4,\)"):
        double(Tensor([1.0, 2.0, 3.0, 4.0]))
    with pytest.raises(JitError, match=r"dtype dtypes.float -> dtypes.int\b"):
        double(Tensor([1, 2, 3]))
    other = "NUMPY" if Tensor([1.0]).device != "NUMPY" else "CPU"
    with pytest.raises(JitError, match=r"device"):
        double(Tensor([1.0, 2.0, 3.0], device=other))


def test_changed_non_tensor_argument_is_an_error() -> None:
    @TinyJit
    def scaled(x: Tensor, factor: float) -> Tensor:
        return (x * factor).realize()

    for _ in range(3):
        scaled(Tensor([1.0]), 3.0)
    with pytest.raises(JitError, match=r"factor|argument 1"):
        scaled(Tensor([1.0]), 4.0)


def test_random_numbers_inside_are_drawn_anew_on_each_replay() -> None:
    """Capture records the draws' kernels on the RNG state buffer, so replays draw new
    numbers, each in [1, 2) as rand() + 1 must be."""
    @TinyJit
    def noisy(x: Tensor) -> Tensor:
        return (x + Tensor.rand(*x.shape)).realize()

    draws = [noisy(Tensor([1.0, 1.0])).numpy() for _ in range(5)]
    assert len({tuple(d) for d in draws}) == 5
    assert all(((d >= 1.0) & (d < 2.0)).all() for d in draws)


def test_debug_says_what_was_captured_and_replayed(capsys: pytest.CaptureFixture[str]) -> None:
    @TinyJit
    def f(x: Tensor) -> Tensor:
        return ((x + 1) * 2).sum().realize()

    with Context(DEBUG=1):
        for _ in range(3):
            f(Tensor([1.0, 2.0]))
    out = capsys.readouterr().out
    assert "TinyJit: captured 1 kernels of f" in out
    assert "TinyJit: replayed 1 kernels" in out


def test_cpu_replay_is_one_graph_call_and_counts_kernels() -> None:
    @TinyJit
    def two_kernels(x: Tensor) -> Tensor:
        return (x - x.max()).exp().realize()

    for _ in range(2):
        two_kernels(Tensor([1.0, 2.0, 3.0], device="CPU"))
    assert two_kernels.captured is not None and two_kernels.captured.graph is not None
    GlobalCounters.reset()
    out = two_kernels(Tensor([3.0, 2.0, 1.0], device="CPU"))
    assert GlobalCounters.kernel_count == 2
    np.testing.assert_allclose(out.numpy(), np.exp(np.array([3.0, 2, 1]) - 3), rtol=1e-6)


def test_jitted_method() -> None:
    class Model:
        def __init__(self) -> None:
            self.w = Tensor([[1.0, 2.0], [3.0, 4.0]])

        @TinyJit
        def __call__(self, x: Tensor) -> Tensor:
            return (x @ self.w).realize()

    model = Model()
    for k in range(4):
        x = np.array([[k, 1.0]], dtype=np.float32)
        np.testing.assert_allclose(model(Tensor(x)).numpy(), x @ np.array([[1, 2], [3, 4.0]]))


GRAPH_DEVICES = ["OPENCL", "WEBGPU"]


@pytest.mark.parametrize("device", GRAPH_DEVICES)
def test_device_graph_replays_with_new_inputs(device: str) -> None:
    """OPENCL and WEBGPU replay through their graph executor (one wait / one submit), which
    takes each launch's program as its own kind (helpers.programs_of)."""
    from tinyteach.device import Device

    if not Device.is_available(device):
        pytest.skip(f"{device}: {Device.why_unavailable(device)}")

    @TinyJit
    def two_kernels(x: Tensor) -> Tensor:
        return (x - x.max()).exp().realize()

    for values in ([1.0, 2.0, 3.0], [0.5, 0.0, -1.0]):
        two_kernels(Tensor(values, device=device))
    assert two_kernels.captured is not None and two_kernels.captured.graph is not None
    for values in ([3.0, 2.0, 1.0], [-2.0, 4.0, 0.25]):
        out = two_kernels(Tensor(values, device=device))
        expected = np.exp(np.array(values) - max(values))
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5)


def test_a_graph_names_a_program_it_cannot_replay() -> None:
    """A launch whose program is not the device's own kind is a clear TypeError."""
    from types import SimpleNamespace

    from tinyteach.helpers import programs_of

    launches = [SimpleNamespace(runner=SimpleNamespace(program=print), buffers=[])]
    with pytest.raises(TypeError, match="launch 0 runs builtin_function_or_method, not a int: "
                                        "the TEST graph replays only those"):
        programs_of(launches, int, "TEST")
    assert programs_of([SimpleNamespace(runner=SimpleNamespace(program=3))], int, "TEST") == [3]


def test_a_replay_counts_what_the_eager_run_counts():
    """GlobalCounters counts a TinyJit replay's kernels, operations and bytes as the eager
    run of the same function counts them (issue 24: 3,072 ops eager, 0 replayed before)."""
    def step(x: Tensor) -> Tensor:
        return (x * 2 + 1).sum()

    inputs = [Tensor(np.full(1024, float(k), np.float32)).realize() for k in range(4)]
    GlobalCounters.reset()
    step(inputs[0]).realize()
    eager = (GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem)
    jitted = TinyJit(step)
    for x in inputs[:3]:  # two captures, then replays
        jitted(x).realize()
    GlobalCounters.reset()
    assert jitted(inputs[3]).item() == 1024 * 7
    assert (GlobalCounters.kernel_count, GlobalCounters.global_ops,
            GlobalCounters.global_mem) == eager
    assert eager[1] > 0


def test_the_capture_runs_the_first_calls_cached_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """The second call records the launches: its graph has the first call's structure, so it
    runs that call's plan (a training step's schedule is not made twice). The replays agree
    with eager, step by step (test_replay_matches_eager_step_by_step), and so do these."""
    import tinyteach.engine.realize as realize

    scheduled: list[int] = []
    build = realize.build_schedule
    monkeypatch.setattr(realize, "build_schedule",
                        lambda *args, **kwargs: scheduled.append(1) or build(*args, **kwargs))
    w = Tensor(np.arange(12, dtype=np.float32).reshape(4, 3), device="CPU").realize()
    step = TinyJit(lambda x: (x @ w).relu().sum(1).realize())
    inputs = [np.random.default_rng(k).standard_normal((2, 4)).astype(np.float32)
              for k in range(4)]
    outputs = []
    for k, x in enumerate(inputs):
        outputs.append(step(Tensor(x, device="CPU")).numpy())
        if k == 0:
            first = len(scheduled)
    assert first >= 1 and len(scheduled) == first, "the capture and the replays schedule nothing"
    for x, out in zip(inputs, outputs):
        np.testing.assert_allclose(out, np.maximum(x @ w.numpy(), 0).sum(1), rtol=1e-5)
