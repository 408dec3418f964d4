"""Convolutions on the CPU (issue 16): channel tiles (opt/pack.py), output blocks (opt/) and the
short-loop rule for vector lanes (codegen/lower.py) change how a convolution runs, never what it
computes. Forward and both gradients are checked against PyTorch, with the optimizations on,
off (NOOPT=1) and without channel tiles (CHANNEL_TILES=0), for odd sizes, strides, padding,
dilation and groups."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from tinyteach import Context, Tensor
from tinyteach.codegen.lower import lower
from tinyteach.device import Device
from tinyteach.engine.realize import build_schedule
from tinyteach.ir.uop import Ops
from tinyteach.opt.heuristic import choose_options, heuristic_plan
from tinyteach.opt.pack import pack_operands, plan_channel_tile

torch = pytest.importorskip("torch")

# (batch, in channels, out channels, height, width, kernel, stride, padding, dilation, groups)
CASES = [
    (4, 8, 16, 11, 11, 3, 1, 0, 1, 1),   # the benchmark CNN's second conv, smaller batch
    (3, 3, 8, 13, 9, 3, 2, 1, 1, 1),     # odd sizes, stride 2, padding 1
    (2, 4, 16, 12, 10, (3, 2), 1, (2, 1), 2, 1),  # rectangular kernel, dilation 2
    (2, 8, 16, 9, 9, 3, 1, 1, 1, 2),     # two groups
    (5, 1, 8, 14, 14, 5, 1, 0, 1, 1),    # one input channel (as a first layer)
    (2, 6, 9, 7, 8, 3, 1, 1, 1, 3),      # channels that no vector width divides
]


def _arrays(case: tuple, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    batch, cin, cout, height, width, kernel, _, _, _, groups = case
    kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch, cin, height, width)).astype(np.float32)
    w = rng.normal(size=(cout, cin // groups, kh, kw)).astype(np.float32) / 3
    b = rng.normal(size=(cout,)).astype(np.float32)
    return x, w, b


def _torch_conv(case: tuple, x: np.ndarray, w: np.ndarray, b: np.ndarray,
                upstream: np.ndarray) -> list[np.ndarray]:
    *_, stride, padding, dilation, groups = case
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    out = torch.nn.functional.conv2d(tx, tw, tb, stride, padding, dilation, groups)
    (out * torch.tensor(upstream)).sum().backward()
    return [out.detach().numpy(), tx.grad.numpy(), tw.grad.numpy(), tb.grad.numpy()]


def _tiny_conv(case: tuple, x: np.ndarray, w: np.ndarray, b: np.ndarray,
               upstream: np.ndarray) -> list[np.ndarray]:
    *_, stride, padding, dilation, groups = case
    tx, tw, tb = (Tensor(a, requires_grad=True) for a in (x, w, b))
    out = tx.conv2d(tw, tb, groups=groups, stride=stride, dilation=dilation, padding=padding)
    (out * Tensor(upstream)).sum().backward()
    return [out.numpy(), tx.grad.numpy(), tw.grad.numpy(), tb.grad.numpy()]


SETTINGS = {"optimized": {}, "noopt": {"NOOPT": 1}, "no_channel_tiles": {"CHANNEL_TILES": 0}}


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("case", CASES, ids=[f"case{k}" for k in range(len(CASES))])
def test_conv_forward_and_gradients_match_torch(case, setting):
    x, w, b = _arrays(case)
    expected = _torch_conv(case, x, w, b, np.ones(1, np.float32))
    upstream = np.random.default_rng(1).normal(size=expected[0].shape).astype(np.float32)
    expected = _torch_conv(case, x, w, b, upstream)
    with Context(**SETTINGS[setting]):
        got = _tiny_conv(case, x, w, b, upstream)
    for name, mine, theirs in zip(["output", "grad x", "grad w", "grad b"], got, expected):
        assert mine.shape == theirs.shape, name
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-4, err_msg=name)


def _kernels(tensors: list[Tensor]) -> list:
    schedule = build_schedule([t.uop for t in tensors], "CPU")
    return [item for item in schedule.items if item.kind == "kernel"]


def test_conv_forward_gets_a_channel_tile():
    """The benchmark's second conv: the weights are packed channels last, the kernel reads 16
    output channels as vectors into a channels-last buffer, a copy puts it back in order."""
    x, w, _ = _arrays(CASES[0])
    out = Tensor(x).conv2d(Tensor(w))
    names = [item.name for item in _kernels([out])]
    assert names[0].startswith("pack_c16_") and names[-1].startswith("unpack_"), names
    kernel = _kernels([out])[1]
    options = choose_options(kernel.ast, Device["CPU"].renderer.vector_width)
    assert options.vector_width > 0
    source = Device["CPU"].renderer.render(kernel.name, lower(kernel.ast, options))
    assert "_vec" in source  # vector loads and accumulators
    np.testing.assert_allclose(out.numpy(), _torch_conv(CASES[0], x, w, np.zeros(16, np.float32),
                                                        np.ones((4, 16, 9, 9), np.float32))[0],
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("setting", [{"NOOPT": 1}, {"CHANNEL_TILES": 0}])
def test_switched_off_packs_nothing(setting):
    x, w, _ = _arrays(CASES[0])
    out = Tensor(x).conv2d(Tensor(w))
    with Context(**setting):
        items = build_schedule([out.uop], "CPU").items
        assert [item.name for item in items] == ["r_4_16_9_9_8_3_3"]
        assert pack_operands(items) == items


def test_no_channel_tile_without_a_channel_axis_of_whole_vectors():
    """Nine output channels fill no vector: no packing (the kernel stays as it was)."""
    x, w, _ = _arrays(CASES[5])
    (item,) = _kernels([Tensor(x).conv2d(Tensor(w), groups=3, padding=1)])
    assert not item.name.startswith(("pack", "unpack"))


def test_short_sums_get_no_channel_tile():
    """A sum of 9 per output (one input channel, 3x3): the copies would cost more than the
    vectors save, so the kernel keeps its scalar tile."""
    x = Tensor(np.ones((8, 1, 20, 20), np.float32))
    w = Tensor(np.ones((8, 1, 3, 3), np.float32))
    schedule = build_schedule([x.conv2d(w).uop], "CPU")
    raw = [item for item in schedule.items if not item.name.startswith(("pack", "unpack"))]
    assert len(raw) == len(schedule.items)
    assert all(plan_channel_tile(item.ast, 8) is None for item in raw)


def _stored_elements(kernel) -> int:
    """The elements a kernel writes: its output buffer's size (DEFINE_GLOBAL 0)."""
    return next(n.arg[1] for n in kernel.ast.toposort
                if n.op is Ops.DEFINE_GLOBAL and n.arg[0] == 0)


@pytest.mark.parametrize("case", CASES)
def test_the_input_gradient_is_a_transposed_convolution(case):
    """conv2d states its gradient as a whole (gradient.register_gradient): the input's is
    conv_transpose2d of the output's gradient, a gather. The primitive rules stored every
    window's gradient (batch x channels x output pixels x taps floats) and summed it into the
    pixels: now one kernel sums (besides the copy of the padded gradient), and the gradient
    still equals PyTorch's."""
    x, w, _ = _arrays(case)
    _, cin, cout, _, _, kernel, stride, padding, dilation, groups = case
    tx = Tensor(x, requires_grad=True)
    out = tx.conv2d(Tensor(w), stride=stride, padding=padding, dilation=dilation, groups=groups)
    out.sum().backward()
    taps = int(np.prod(w.shape[2:]))
    window_elements = int(np.prod(out.shape)) // cout * cin * taps
    assert tx.grad is not None
    kernels = [k for k in _kernels([tx.grad]) if not k.name.startswith(("pack", "unpack"))]
    sums = [k for k in kernels if any(n.op is Ops.REDUCE_AXIS for n in k.ast.toposort)]
    assert len(sums) == 1, [k.name for k in kernels]  # one convolution, no window buffer
    assert window_elements not in [_stored_elements(k) for k in kernels]
    gx = torch.tensor(x, requires_grad=True)
    torch.nn.functional.conv2d(gx, torch.tensor(w), stride=stride, padding=padding,
                               dilation=dilation, groups=groups).sum().backward()
    np.testing.assert_allclose(tx.grad.numpy(), gx.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_x_times_w_transposed_gets_a_channel_tile():
    """x @ w.T (an MLP layer: both operands walk memory along the sum) reads w's rows as
    vectors once w is packed with its output axis last."""
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(64, 200)).astype(np.float32), \
        rng.normal(size=(48, 200)).astype(np.float32)
    out = Tensor(a) @ Tensor(b).T
    names = [item.name for item in _kernels([out])]
    assert names[0].startswith("pack_c"), names
    assert not any(name.startswith("unpack") for name in names)  # the columns are last already
    np.testing.assert_allclose(out.numpy(), a @ b.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("activation", ["gelu", "relu", "tanh"])
def test_a_linear_layer_with_its_activation_gets_a_channel_tile(activation):
    """x.linear(w.T, b).gelu(): nn.Linear's weight layout, with the bias and the activation
    fused after the sum (an epilogue). The channel tile packs w and keeps the epilogue in the
    kernel (the GPT's MLP layer: 13.7 ms -> 3.8 ms per call on 2 cores, under load)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 32, 128)).astype(np.float32)
    w = (rng.normal(size=(64, 128)) * 0.1).astype(np.float32)
    b = rng.normal(size=64).astype(np.float32)
    out = getattr(Tensor(x).linear(Tensor(w).T, Tensor(b)), activation)()
    names = [item.name for item in _kernels([out])]
    assert names[0].startswith("pack_c") and len(names) == 2, names
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    torch_activation = {"gelu": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
                        "relu": torch.relu, "tanh": torch.tanh}[activation]
    expected = torch_activation(tx @ tw.T + tb)
    np.testing.assert_allclose(out.numpy(), expected.detach().numpy(), rtol=1e-5, atol=1e-5)
    ours = [Tensor(a, requires_grad=True) for a in (x, w, b)]
    result = getattr(ours[0].linear(ours[1].T, ours[2]), activation)()
    (result * result).sum().backward()
    (expected * expected).sum().backward()
    for name, mine, theirs in zip("xwb", ours, (tx, tw, tb)):
        assert mine.grad is not None and theirs.grad is not None
        np.testing.assert_allclose(mine.grad.numpy(), theirs.grad.numpy(), rtol=1e-4,
                                   atol=1e-4, err_msg=name)


def test_a_convolution_with_bias_and_relu_keeps_its_epilogue_in_the_channel_tile():
    """conv2d(x, w, b).relu(): the bias and the relu run in the channels-last kernel, before
    the copy back into (n, c, y, x)."""
    x, w, b = _arrays(CASES[0])
    out = Tensor(x).conv2d(Tensor(w), Tensor(b)).relu()
    names = [item.name for item in _kernels([out])]
    assert names[0].startswith("pack_c16_") and names[-1].startswith("unpack_"), names
    expected = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), torch.tensor(b))
    np.testing.assert_allclose(out.numpy(), expected.relu().numpy(), rtol=1e-4, atol=1e-4)


def test_attention_products_over_short_heads_get_a_channel_tile():
    """q @ k.T and weights @ v over heads of 32: sums of 32 and 64, short for a convolution's
    channel tile (whose output is copied back), but here the channel axis is the output's last
    already: two kernels, no copy back, and torch's attention."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(2, 4, 64, 32)).astype(np.float32) for _ in range(3))
    scores = Tensor(q) @ Tensor(k).transpose(-1, -2)
    names = [item.name for item in _kernels([scores])]
    assert names[0].startswith("pack_c") and len(names) == 2, names
    out = Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v), is_causal=True)
    expected = torch.nn.functional.scaled_dot_product_attention(
        torch.tensor(q), torch.tensor(k), torch.tensor(v), is_causal=True)
    np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)


def test_a_short_sum_whose_output_is_copied_back_gets_no_channel_tile():
    """beautiful_mnist's first convolution: one input channel, 5x5 (a sum of 25). A channel
    tile would copy its 32-channel output back into (n, c, y, x): not for a sum this short."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 1, 28, 28)).astype(np.float32)
    w = rng.normal(size=(32, 1, 5, 5)).astype(np.float32)
    schedule = build_schedule([Tensor(x).conv2d(Tensor(w)).uop], "CPU")
    assert not any(item.name.startswith(("pack", "unpack")) for item in schedule.items)
    assert all(plan_channel_tile(item.ast, 8) is None for item in schedule.items
               if item.kind == "kernel")


def test_one_row_times_w_transposed_is_not_packed():
    """Generating one token: (1, 128) @ w.T with w (512, 128). A packed copy of w would be read
    once, by the one row: copying it cost 134 us a call where the product takes 30."""
    rng = np.random.default_rng(0)
    x, w = rng.normal(size=(1, 1, 128)).astype(np.float32), \
        rng.normal(size=(512, 128)).astype(np.float32)
    out = Tensor(x).linear(Tensor(w).T, Tensor(np.zeros(512, np.float32))).gelu()
    names = [item.name for item in _kernels([out])]
    assert not any(name.startswith("pack") for name in names), names
    expected = torch.nn.functional.gelu(torch.tensor(x) @ torch.tensor(w).T, approximate="tanh")
    np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)


def _split_into_lanes(source: str) -> bool:
    """A sum split across SIMD lanes: explicit lane arrays (FIXED_LANES) or `omp simd`."""
    return "_lanes[" in source or "omp simd" in source


def test_short_loops_are_not_split_into_vector_lanes():
    """A 3-tap loop over kernel columns: no lanes (they would be summed after every 3 steps);
    a 64-long contiguous sum keeps them."""
    renderer = Device["CPU"].renderer
    x = Tensor(np.ones((4, 8, 11, 11), np.float32))
    w = Tensor(np.ones((16, 8, 3, 3), np.float32))
    with Context(CHANNEL_TILES=0):
        (item,) = _kernels([x.conv2d(w)])
    program = lower(item.ast, heuristic_plan(item.ast, renderer.vector_width))
    source = renderer.render(item.name, program)
    assert not _split_into_lanes(source)
    long_sum = _kernels([Tensor(np.ones((8, 64), np.float32)).sum(1)])[0]
    source = renderer.render(long_sum.name, lower(long_sum.ast, heuristic_plan(long_sum.ast, 8)))
    assert _split_into_lanes(source)


def test_beam_search_keeps_channel_tiled_convolutions_correct(tmp_path, monkeypatch):
    """BEAM times other options for the channel-tiled kernel (its candidates are checked against
    the heuristic's output); the convolution still matches PyTorch."""
    from tinyteach import clear_caches
    from tinyteach.opt import search
    monkeypatch.setattr(search, "beam_cache_dir", lambda: tmp_path / "beam")
    clear_caches()
    case = (2, 8, 16, 10, 10, 3, 1, 0, 1, 1)
    x, w, b = _arrays(case)
    upstream = np.ones((2, 16, 8, 8), np.float32)
    expected = _torch_conv(case, x, w, b, upstream)
    with Context(BEAM=1, CPU_TIERED=0):
        tx, tw = Tensor(x), Tensor(w)
        got = tx.conv2d(tw, Tensor(b)).numpy()
    clear_caches()
    np.testing.assert_allclose(got, expected[0], rtol=1e-4, atol=1e-4)


def _weight_gradient(batch: int, channels: int, size: int) -> tuple[np.ndarray, np.ndarray,
                                                                    np.ndarray, Tensor]:
    """x, w, the upstream gradient and the weight whose gradient `(conv2d(x, w) * upstream)
    .sum().backward()` computed (`channels` -> 32 channels, 5x5, `size`-pixel images)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, channels, size, size)).astype(np.float32)
    w = rng.normal(size=(32, channels, 5, 5)).astype(np.float32)
    upstream = rng.normal(size=(batch, 32, size - 4, size - 4)).astype(np.float32)
    weight = Tensor(w, requires_grad=True)
    (Tensor(x).conv2d(weight) * Tensor(upstream)).sum().backward()
    assert weight.grad is not None
    return x, w, upstream, weight


def test_a_weight_gradient_takes_its_five_taps_as_rows(monkeypatch):
    """beautiful_mnist's first convolution (1 -> 32 channels, 5x5): its weight gradient is a
    tile of (ky, kx, 32 channels) summed over batch x 24 x 24 pixels. The 32 channels are two
    vectors; kx (5: divides by neither 8 nor 4) is taken whole as the tile's rows, so the sum
    has 10 accumulators, not 2 (fails before: no row upcast)."""
    monkeypatch.setattr(Device["CPU"].renderer, "vector_width", 16)
    x, w, upstream, weight = _weight_gradient(8, 1, 28)
    kernels = [k for k in _kernels([weight.grad]) if not k.name.startswith(("pack", "unpack"))]
    tiles = [choose_options(k.ast, 16) for k in kernels]
    assert any(options.vector_width and (2, 5) in options.upcasts for options in tiles), tiles
    tw = torch.tensor(w, requires_grad=True)
    (torch.nn.functional.conv2d(torch.tensor(x), tw) * torch.tensor(upstream)).sum().backward()
    np.testing.assert_allclose(weight.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-3)


def _relu_conv_input_gradient(batch: int, size: int) -> tuple[list, Callable[[], None]]:
    """The kernels of the input gradient of `conv2d(x.relu(), w)` (32 -> 32 channels, 5x5,
    `size`-pixel images), and a check of that gradient against PyTorch's."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, 32, size, size)).astype(np.float32)
    w = rng.normal(size=(32, 32, 5, 5)).astype(np.float32) * 0.1
    upstream = rng.normal(size=(batch, 32, size - 4, size - 4)).astype(np.float32)
    image = Tensor(x, requires_grad=True)
    (image.relu().conv2d(Tensor(w)) * Tensor(upstream)).sum().backward()
    assert image.grad is not None
    gradient = image.grad

    def check() -> None:
        tx = torch.tensor(x, requires_grad=True)
        (torch.nn.functional.conv2d(tx.relu(), torch.tensor(w)) * torch.tensor(upstream)) \
            .sum().backward()
        np.testing.assert_allclose(gradient.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    return _kernels([gradient]), check


def test_an_epilogue_that_reads_across_channels_moves_to_the_copy_back(monkeypatch):
    """The input gradient of a convolution behind a ReLU, with 28-pixel rows (no vector tile
    along them): a channel tile computes it channels last, where the ReLU's mask would be read
    32 channels apart, a gather that kept the whole kernel scalar (493 ms at batch 128). The
    sum alone is computed channels last, in vectors; the copy back applies the mask in the
    output's order (fails before: the kernel read the mask and stayed scalar)."""
    monkeypatch.setattr(Device["CPU"].renderer, "vector_width", 16)
    kernels, check = _relu_conv_input_gradient(4, 28)
    (unpack,) = [k for k in kernels if k.name.startswith("unpack_")]
    assert len(unpack.buffers) == 3  # the output, the ReLU's input, the sum channels last
    (tile,) = [k for k in kernels if k.name.startswith("r_") and k.output is unpack.buffers[2]]
    options = choose_options(tile.ast, 16)
    assert options.vector_width and "_vec" in Device["CPU"].renderer.render(
        tile.name, lower(tile.ast, options))
    check()


@pytest.mark.parametrize("lanes", [16, 8])
def test_rows_of_half_vectors_give_way_to_a_channel_tile(monkeypatch, lanes):
    """beautiful_mnist's second convolution's input gradient (32 -> 32 channels, 5x5, behind a
    ReLU): its 24-pixel rows make 3 vectors of 8 lanes. On a CPU of 16 lanes that is half of
    each instruction; its 32 channels are two whole vectors, so it gets a channel tile (25 ms
    -> 16 ms at batch 128 on an AVX-512 Xeon). With 8 lanes the rows fill the vectors and it
    keeps them (fails before with 16: a vector tile of any width kept the kernel as it was)."""
    monkeypatch.setattr(Device["CPU"].renderer, "vector_width", lanes)
    kernels, check = _relu_conv_input_gradient(2, 24)
    sums = [k for k in kernels if k.name.startswith("r_")]
    assert len(sums) == 1, [k.name for k in kernels]
    options = choose_options(sums[0].ast, lanes)
    assert options.vector_width == lanes, options.describe()
    assert any(k.name.startswith("pack_c") for k in kernels) == (lanes == 16)
    check()


@pytest.mark.parametrize("lanes", [16, 8])
def test_a_long_weight_gradient_sums_in_blocks_of_images(monkeypatch, lanes):
    """beautiful_mnist's second weight gradient sums over batch x 20 x 20 pixels: every tile of
    8 x 32 outputs streamed all of the packed upstream gradient (6.5 MB at batch 128), 100
    times, from far caches. It now sums blocks of images apart (at batch 32: 4 blocks of
    410 KB, each staying in cache across the tiles) and the copy back adds the blocks up
    (fails before: the channels-last result was the size of the gradient)."""
    monkeypatch.setattr(Device["CPU"].renderer, "vector_width", lanes)
    x, w, upstream, weight = _weight_gradient(32, 32, 24)
    kernels = _kernels([weight.grad])
    (unpack,) = [k for k in kernels if k.name.startswith("unpack_")]
    assert unpack.buffers[1].size == 4 * w.size  # the partial sums of 4 blocks of 8 images
    assert any(n.op is Ops.REDUCE_AXIS for n in unpack.ast.toposort)
    tw = torch.tensor(w, requires_grad=True)
    (torch.nn.functional.conv2d(torch.tensor(x), tw) * torch.tensor(upstream)).sum().backward()
    np.testing.assert_allclose(weight.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=2e-3)


def test_a_weight_gradient_of_few_tiles_sums_in_one_piece(monkeypatch):
    """The first convolution's weight gradient (1 -> 32 channels, 5x5) is 5 tiles of 5 x 32:
    the upstream gradient is streamed 5 times only, and blocks made it slower (1.2 -> 3.3 ms
    at batch 128), so it keeps one sum."""
    monkeypatch.setattr(Device["CPU"].renderer, "vector_width", 16)
    rng = np.random.default_rng(0)
    weight = Tensor(rng.normal(size=(32, 1, 5, 5)).astype(np.float32), requires_grad=True)
    (Tensor(rng.normal(size=(64, 1, 28, 28)).astype(np.float32)).conv2d(weight) *
     Tensor(rng.normal(size=(64, 32, 24, 24)).astype(np.float32))).sum().backward()
    assert weight.grad is not None
    unpacks = [k for k in _kernels([weight.grad]) if k.name.startswith("unpack_")]
    assert all(k.buffers[1].size == weight.grad.numel() for k in unpacks)


def test_a_weight_gradient_in_blocks_keeps_nan_and_infinities(monkeypatch):
    """The blocks' partial sums are added up apart: a NaN in one image and an infinity in
    another still reach the same entries of the gradient as in PyTorch's one sum."""
    monkeypatch.setattr(Device["CPU"].renderer, "vector_width", 16)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(32, 32, 24, 24)).astype(np.float32)
    x[3, 5, 10, 10] = np.nan
    x[20, 7, 0, 0] = np.inf
    x[27, 7, 23, 23] = -np.inf
    w = rng.normal(size=(32, 32, 5, 5)).astype(np.float32)
    upstream = rng.normal(size=(32, 32, 20, 20)).astype(np.float32)
    weight = Tensor(w, requires_grad=True)
    (Tensor(x).conv2d(weight) * Tensor(upstream)).sum().backward()
    assert weight.grad is not None
    (unpack,) = [k for k in _kernels([weight.grad]) if k.name.startswith("unpack_")]
    assert unpack.buffers[1].size == 4 * w.size  # summed in blocks
    tw = torch.tensor(w, requires_grad=True)
    (torch.nn.functional.conv2d(torch.tensor(x), tw) * torch.tensor(upstream)).sum().backward()
    got, want = weight.grad.numpy(), tw.grad.numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    assert np.isnan(want).any() and np.isinf(want).any()
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-4, atol=2e-3)
