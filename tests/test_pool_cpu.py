"""Pooling on the CPU (issue 16): windows that do not overlap (kernel <= stride, no dilation)
are a reshape of the input (tensor_core._tiled_windows), so their gradient is a reshape back
and not a sum over the copies of the overlapping view. max_pool2d and avg_pool2d, forward and
backward, are checked against PyTorch with the optimizations on, off (NOOPT=1) and under BEAM,
for both kinds of windows, padding, ceil_mode, stride != kernel, dilation, ties, NaN and -inf.

Ties: tinyteach's max gives the gradient to every element equal to the max, split evenly (as
tinygrad, and as PyTorch's amax); PyTorch's max_pool2d gives it all to the first one. Ties are
therefore checked against amax over PyTorch's unfolded windows."""
from __future__ import annotations

import numpy as np
import pytest

from tinyteach import Context, Tensor
from tinyteach.engine.realize import build_schedule

torch = pytest.importorskip("torch")
F = torch.nn.functional

# (shape, kernel, stride, padding, dilation, ceil_mode)
CASES = [
    ((4, 8, 26, 26), 2, None, 0, 1, False),      # the benchmark CNN's first pool
    ((4, 16, 11, 11), 2, None, 0, 1, False),     # its second: an odd size drops a row
    ((2, 3, 13, 9), 3, 2, 1, 1, False),          # overlapping windows, padding
    ((2, 3, 13, 9), 3, 2, 1, 1, True),           # ... with ceil_mode
    ((2, 2, 11, 10), 2, 3, 1, 1, False),         # stride > kernel: gaps between windows
    ((2, 2, 11, 10), (2, 3), (3, 3), 0, 1, True),  # rectangular, gaps, ceil_mode
    ((2, 3, 12, 12), 3, 1, 1, 2, False),         # dilation 2
    ((3, 2, 7, 7), 2, 2, 1, 1, True),            # padding and ceil_mode, no overlap
]
SETTINGS = {"optimized": {}, "noopt": {"NOOPT": 1}}


def _data(shape: tuple, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def _torch_pool(kind: str, x: np.ndarray, case: tuple,
                upstream: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    _, kernel, stride, padding, dilation, ceil_mode = case
    tx = torch.tensor(x, requires_grad=True)
    if kind == "max":
        out = F.max_pool2d(tx, kernel, stride, padding, dilation, ceil_mode)
    else:
        assert dilation == 1  # PyTorch's avg_pool2d has none
        out = F.avg_pool2d(tx, kernel, stride, padding, ceil_mode)
    up = torch.ones_like(out) if upstream is None else torch.tensor(upstream)
    (out * up).sum().backward()
    return out.detach().numpy(), tx.grad.numpy()


def _tiny_pool(kind: str, x: np.ndarray, case: tuple,
               upstream: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    _, kernel, stride, padding, dilation, ceil_mode = case
    tx = Tensor(x, requires_grad=True)
    if kind == "max":
        out = tx.max_pool2d(kernel, stride, padding, dilation, ceil_mode)
    else:
        out = tx.avg_pool2d(kernel, stride, padding, ceil_mode)
    (out * Tensor(upstream)).sum().backward()
    return out.numpy(), tx.grad.numpy()


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("case", CASES, ids=[f"case{k}" for k in range(len(CASES))])
def test_pool_forward_and_gradient_match_torch(case, kind, setting):
    if kind == "avg" and case[4] != 1:
        pytest.skip("PyTorch's avg_pool2d has no dilation")
    x = _data(case[0])
    shape = _torch_pool(kind, x, case, None)[0].shape
    upstream = _data(shape, seed=1)
    expected = _torch_pool(kind, x, case, upstream)
    with Context(**SETTINGS[setting]):
        got = _tiny_pool(kind, x, case, upstream)
    for name, mine, theirs in zip(["output", "grad x"], got, expected):
        assert mine.shape == theirs.shape, name
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-5, err_msg=name)


def _torch_window_amax(x: np.ndarray, kernel: int, stride: int, padding: int,
                       upstream: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """max_pool2d as amax over unfolded windows (padding with -inf): amax splits the gradient
    evenly between ties, as tinyteach does."""
    tx = torch.tensor(x, requires_grad=True)
    batch, channels, height, width = x.shape
    padded = F.pad(tx, [padding] * 4, value=-float("inf"))
    windows = F.unfold(padded.reshape(batch * channels, 1, *padded.shape[2:]), kernel,
                       stride=stride)
    out = windows.amax(1).reshape(upstream.shape)
    (out * torch.tensor(upstream)).sum().backward()
    return out.detach().numpy(), tx.grad.numpy()


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("kernel,stride,padding", [(2, 2, 0), (3, 3, 1), (3, 2, 1)])
def test_max_pool_ties_and_infinities(kernel, stride, padding, setting):
    """Small integers make many ties; -inf and +inf are ordinary values (a window of only
    -inf has max -inf, its gradient shared by all)."""
    rng = np.random.default_rng(3)
    x = rng.integers(0, 3, size=(2, 3, 9, 8)).astype(np.float32)
    x[0, 1, 4, 2] = np.inf
    x[1, 2, 2:5, 2:5] = -np.inf  # whole windows of -inf in every layout above
    x[1, 0, 6, 6] = -np.inf
    out_shape = F.max_pool2d(torch.tensor(x), kernel, stride, padding).shape
    upstream = rng.normal(size=tuple(out_shape)).astype(np.float32)
    expected = _torch_window_amax(x, kernel, stride, padding, upstream)
    with Context(**SETTINGS[setting]):
        tx = Tensor(x, requires_grad=True)
        out = tx.max_pool2d(kernel, stride, padding)
        (out * Tensor(upstream)).sum().backward()
        got = out.numpy(), tx.grad.numpy()
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[0], F.max_pool2d(torch.tensor(x), kernel, stride,
                                                       padding).numpy())


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("kernel,stride,padding", [(2, 2, 0), (3, 3, 1), (3, 2, 1)])
def test_max_pool_nan_is_the_max_and_takes_the_gradient(kernel, stride, padding, setting):
    """A NaN in a window is its max (PyTorch's max_pool2d) and the whole gradient goes to it
    (amax would give NaN to the window: a single NaN per window makes the two rules agree
    with max_pool2d's)."""
    x = _data((2, 3, 9, 8), seed=4)
    x[0, 0, 1, 1] = np.nan
    x[1, 2, 5, 4] = np.nan
    case = (x.shape, kernel, stride, padding, 1, False)
    shape = _torch_pool("max", x, case, None)[0].shape
    upstream = _data(shape, seed=5)
    expected = _torch_pool("max", x, case, upstream)
    with Context(**SETTINGS[setting]):
        got = _tiny_pool("max", x, case, upstream)
    for mine, theirs in zip(got, expected):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-5)


def _kernel_names(tensors: list[Tensor]) -> list[str]:
    schedule = build_schedule([t.uop for t in tensors], "CPU")
    return [item.name for item in schedule.items if item.kind == "kernel"]


def test_tiled_windows_gradient_is_no_sum_over_copies():
    """The benchmark's pool: the backward is the tie count (a sum over each 2x2 window) and one
    elementwise kernel over the input, not the overlapping view's sums over its copies (a
    kernel per pooled axis, each reading the whole input)."""
    x = Tensor(_data((4, 8, 26, 26)), requires_grad=True)
    out = x.relu().max_pool2d(2)
    out.sum().backward()
    names = _kernel_names([out, x.grad])
    reductions = [name for name in names if name.startswith("r_")]
    assert len(reductions) == 2, names  # the max and the count of its ties
    assert all(name.endswith("_2_2") for name in reductions), names
    assert [name for name in names if name.endswith("_26_26")] == ["E_4_8_26_26"], names


def test_window_larger_than_input_raises():
    with pytest.raises(ValueError, match="does not fit"):
        Tensor(_data((1, 1, 3, 3))).max_pool2d(4)
    with pytest.raises(ValueError, match="does not fit"):
        Tensor(_data((1, 1, 3, 3))).avg_pool2d(4, stride=5)


def test_beam_search_keeps_pooling_correct(tmp_path, monkeypatch):
    """BEAM times other options for the pool kernels; the values still match PyTorch."""
    from tinyteach import clear_caches
    from tinyteach.opt import search
    monkeypatch.setattr(search, "beam_cache_dir", lambda: tmp_path / "beam")
    clear_caches()
    case = ((2, 4, 10, 10), 2, None, 0, 1, False)
    x = _data(case[0])
    upstream = _data((2, 4, 5, 5), seed=1)
    expected = _torch_pool("max", x, case, upstream)
    with Context(BEAM=1, CPU_TIERED=0):
        got = _tiny_pool("max", x, case, upstream)
    clear_caches()
    for mine, theirs in zip(got, expected):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-5)
