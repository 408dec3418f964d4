"""Chapter 11: every nn layer against torch.nn — same weights, same input, values and gradients.

Each test builds a torch layer, copies its parameters into ours, runs both on the same input and
compares the output, then backpropagates sum(output * random cotangent) through both and
compares the gradients of the input and of every parameter. Runs on NUMPY and CPU.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from helpers import ALWAYS, default_device

from tinyteach import Context, Tensor, nn
from tinyteach.nn.state import get_parameters

torch = pytest.importorskip("torch")


@pytest.fixture(params=ALWAYS)
def device(request: pytest.FixtureRequest) -> Iterator[str]:
    """NUMPY and CPU (the layers are compositions of ops that tests of tensor/ run on
    every device); Device.DEFAULT is set too, so the layers' own parameters land there."""
    with default_device(request.param):
        yield request.param


ATOL, RTOL = 1e-4, 1e-4


def copy_parameters(ours: Any, theirs: Any, names: list[str], device: str) -> None:
    """ours.<name> = theirs.<name>, as a trainable tinyteach tensor on `device`."""
    for name in names:
        value = getattr(theirs, name).detach().numpy()
        setattr(ours, name, Tensor(value, device=device, requires_grad=True))


def run_both(ours: Any, theirs: Any, x: np.ndarray, device: str, names: list[str],
             seed: int = 1, grad: bool = True) -> None:
    """Forward both layers on x; compare outputs, then input and parameter gradients."""
    our_x = Tensor(x, device=device, requires_grad=grad or None)
    their_x = torch.tensor(x, requires_grad=grad)
    our_out, their_out = ours(our_x), theirs(their_x)
    np.testing.assert_allclose(our_out.numpy(), their_out.detach().numpy(), atol=ATOL, rtol=RTOL,
                               err_msg="forward")
    if not grad:
        return
    cotangent = np.random.default_rng(seed).uniform(0.5, 1.5, their_out.shape).astype(np.float32)
    (our_out * Tensor(cotangent, device=device)).sum().backward()
    (their_out * torch.tensor(cotangent)).sum().backward()
    assert our_x.grad is not None
    np.testing.assert_allclose(our_x.grad.numpy(), their_x.grad.numpy(), atol=ATOL, rtol=RTOL,
                               err_msg="input gradient")
    for name in names:
        ours_grad = getattr(ours, name).grad
        assert ours_grad is not None, f"{name} got no gradient"
        np.testing.assert_allclose(ours_grad.numpy(), getattr(theirs, name).grad.numpy(),
                                   atol=ATOL, rtol=RTOL, err_msg=f"gradient of {name}")


def random_input(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---- linear, embedding ----

@pytest.mark.parametrize("bias", [True, False])
def test_linear(device: str, bias: bool) -> None:
    theirs = torch.nn.Linear(5, 3, bias=bias)
    ours = nn.Linear(5, 3, bias=bias)
    names = ["weight", "bias"] if bias else ["weight"]
    copy_parameters(ours, theirs, names, device)
    run_both(ours, theirs, random_input(4, 5), device, names)


def test_linear_initialization_shapes_and_bounds() -> None:
    layer = nn.Linear(64, 16)
    assert layer.weight.shape == (16, 64) and layer.bias is not None
    assert layer.bias.shape == (16,)
    weight = layer.weight.numpy()
    bound = 1 / np.sqrt(64)
    assert np.all(np.abs(weight) <= bound) and weight.std() > bound / 3  # uniform(-b, b)
    assert nn.Linear(4, 2, bias=False).bias is None


def test_embedding(device: str) -> None:
    theirs = torch.nn.Embedding(7, 4)
    ours = nn.Embedding(7, 4)
    assert ours.weight.shape == (7, 4)
    copy_parameters(ours, theirs, ["weight"], device)
    idx = np.array([[0, 3, 6], [3, 3, 1]], dtype=np.int32)
    our_out = ours(Tensor(idx, device=device))
    their_out = theirs(torch.tensor(idx, dtype=torch.long))
    np.testing.assert_allclose(our_out.numpy(), their_out.detach().numpy(), atol=ATOL)
    cotangent = random_input(2, 3, 4, seed=2)
    (our_out * Tensor(cotangent, device=device)).sum().backward()
    (their_out * torch.tensor(cotangent)).sum().backward()
    assert ours.weight.grad is not None
    np.testing.assert_allclose(ours.weight.grad.numpy(), theirs.weight.grad.numpy(), atol=ATOL)


# ---- convolutions ----

CONV2D_CASES = [
    dict(kernel_size=3),
    dict(kernel_size=(2, 3), stride=2, padding=1),
    dict(kernel_size=3, padding="same", dilation=2),
    dict(kernel_size=1, groups=2, bias=False),
]


def check_conv_layer(name: str, out_channels: int, options: dict[str, Any],
                     input_shape: tuple[int, ...], device: str) -> None:
    """nn.<name> and torch.nn.<name> with the same options and weights: same parameter
    shapes, outputs and gradients (4 input channels)."""
    theirs = getattr(torch.nn, name)(4, out_channels, **options)
    ours = getattr(nn, name)(4, out_channels, **options)
    assert ours.weight.shape == tuple(theirs.weight.shape)
    names = ["weight", "bias"] if options.get("bias", True) else ["weight"]
    copy_parameters(ours, theirs, names, device)
    run_both(ours, theirs, random_input(*input_shape), device, names)


@pytest.mark.parametrize("options", CONV2D_CASES, ids=str)
def test_conv2d(device: str, options: dict[str, Any]) -> None:
    check_conv_layer("Conv2d", 6, options, (2, 4, 7, 6), device)


@pytest.mark.parametrize("options", [dict(kernel_size=3), dict(kernel_size=2, stride=2,
                                                                padding=1, dilation=2),
                                     dict(kernel_size=4, padding="same", groups=2)], ids=str)
def test_conv1d(device: str, options: dict[str, Any]) -> None:
    check_conv_layer("Conv1d", 2, options, (2, 4, 9), device)


CONV_TRANSPOSE_CASES = [
    dict(kernel_size=3),
    dict(kernel_size=3, stride=2, padding=1, output_padding=1),
    dict(kernel_size=(2, 3), stride=(2, 1), dilation=2, groups=2),
    dict(kernel_size=2, padding=2, bias=False),  # padding > d*(k-1): the input is cropped
]


@pytest.mark.parametrize("options", CONV_TRANSPOSE_CASES, ids=str)
def test_conv_transpose2d(device: str, options: dict[str, Any]) -> None:
    check_conv_layer("ConvTranspose2d", 6, options, (2, 4, 5, 4), device)


@pytest.mark.parametrize("options", [dict(kernel_size=3, stride=2, output_padding=1),
                                     dict(kernel_size=2, stride=3, padding=1, dilation=2,
                                          groups=2, bias=False)], ids=str)
def test_conv_transpose1d(device: str, options: dict[str, Any]) -> None:
    check_conv_layer("ConvTranspose1d", 6, options, (2, 4, 5), device)


def test_conv_transpose_parameters() -> None:
    """Shapes as PyTorch's (weight (in, out/groups, kH, kW)), values within tinygrad's bound
    1/sqrt(in * kH * kW), the same scale nn.Conv2d uses."""
    layer = nn.ConvTranspose2d(4, 6, (3, 2), groups=2)
    theirs = torch.nn.ConvTranspose2d(4, 6, (3, 2), groups=2)
    assert layer.weight.shape == tuple(theirs.weight.shape) == (4, 3, 3, 2)
    assert layer.bias is not None and layer.bias.shape == tuple(theirs.bias.shape) == (6,)
    assert np.all(np.abs(layer.weight.numpy()) <= 1 / np.sqrt(4 * 3 * 2))
    assert nn.ConvTranspose2d(4, 6, 3, bias=False).bias is None
    assert nn.ConvTranspose1d(4, 6, 3).weight.shape == (4, 6, 3)
    with pytest.raises(ValueError, match="groups=4"):
        nn.ConvTranspose2d(4, 6, 3, groups=4)


def test_conv_initialization_bound() -> None:
    layer = nn.Conv2d(3, 8, 5)
    bound = 1 / np.sqrt(3 * 5 * 5)
    assert layer.weight.shape == (8, 3, 5, 5)
    assert np.all(np.abs(layer.weight.numpy()) <= bound)
    with pytest.raises(ValueError, match="same"):
        nn.Conv2d(3, 8, 3, padding="valid")


# ---- normalization ----

def copy_batchnorm(ours: nn.BatchNorm, theirs: Any, device: str) -> None:
    """Random affine parameters (not the 1/0 defaults, so a swapped pair would show)."""
    with torch.no_grad():
        theirs.weight.uniform_(0.5, 1.5)
        theirs.bias.uniform_(-0.5, 0.5)
    copy_parameters(ours, theirs, ["weight", "bias"], device)


@pytest.mark.parametrize("shape", [(6, 3), (4, 3, 5), (2, 3, 4, 5)])
def test_batchnorm_training_and_running_stats(device: str, shape: tuple[int, ...]) -> None:
    torch_class = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d}
    theirs = torch_class[len(shape)](3, momentum=0.2).train()
    ours = nn.BatchNorm(3, momentum=0.2)
    copy_batchnorm(ours, theirs, device)
    with Tensor.train():
        run_both(ours, theirs, random_input(*shape) * 2 + 1, device, ["weight", "bias"])
        run_both(ours, theirs, random_input(*shape, seed=3), device, ["weight", "bias"])
    for name in ["running_mean", "running_var"]:
        np.testing.assert_allclose(getattr(ours, name).numpy(),
                                   getattr(theirs, name).numpy(), atol=1e-5, rtol=1e-5,
                                   err_msg=name)
    assert ours.num_batches_tracked.item() == theirs.num_batches_tracked.item() == 2
    theirs.eval()
    theirs.zero_grad(set_to_none=True)
    for parameter in (ours.weight, ours.bias):
        assert parameter is not None
        parameter.grad = None
    run_both(ours, theirs, random_input(*shape, seed=4), device, ["weight", "bias"])


def test_batchnorm_context_training_flag(device: str) -> None:
    """Context(TRAINING=1) turns on batch statistics just like Tensor.train()."""
    theirs = torch.nn.BatchNorm2d(3).train()
    ours = nn.BatchNorm2d(3)
    copy_batchnorm(ours, theirs, device)
    with Context(TRAINING=1):
        run_both(ours, theirs, random_input(2, 3, 4, 4), device, ["weight", "bias"])
    np.testing.assert_allclose(ours.running_var.numpy(), theirs.running_var.numpy(), atol=1e-5)


@pytest.mark.parametrize("train", [True, False])
def test_batchnorm_without_running_stats_or_affine(device: str, train: bool) -> None:
    theirs = torch.nn.BatchNorm2d(3, affine=False, track_running_stats=False).train(train)
    ours = nn.BatchNorm2d(3, affine=False, track_running_stats=False)
    assert ours.weight is None and not hasattr(ours, "running_mean")
    with Tensor.train(train):
        run_both(ours, theirs, random_input(2, 3, 4, 4), device, [])


def test_batchnorm_statistics_are_as_accurate_as_torch() -> None:
    """BatchNorm's batch mean and variance sum 51,200 values a channel here. Summed in one
    float32 chain they were ~2.5e-5 off (torch: 4e-8), and BatchNorm multiplies that error by
    up to 1/sqrt(eps) on a channel of small variance: in beautiful_mnist's model the first
    layers' gradients were 3% off float64 while torch's were 1e-5. Summed in stages (pixels,
    then batch) the output is within 1e-6 of float64, and so is a gradient through it."""
    rng = np.random.default_rng(0)
    x = np.maximum(rng.standard_normal((128, 4, 20, 20)), 0).astype(np.float32) * 0.005
    g = rng.standard_normal(x.shape).astype(np.float32)
    reference = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    out = torch.nn.functional.batch_norm(reference, None, None, training=True, eps=1e-5)
    (out * torch.tensor(g, dtype=torch.float64)).sum().backward()
    ours = Tensor(x, requires_grad=True)
    with Tensor.train():
        y = nn.BatchNorm(4, affine=False, track_running_stats=False)(ours)
    (y * Tensor(g)).sum().backward()
    expected = out.detach().numpy()
    assert np.abs(y.numpy() - expected).max() / np.abs(expected).max() < 1e-6
    assert ours.grad is not None
    grad = reference.grad.numpy()
    assert np.abs(ours.grad.numpy() - grad).max() / np.abs(grad).max() < 1e-5


def test_batchnorm_state_is_not_trainable() -> None:
    layer = nn.BatchNorm2d(4)
    assert layer.running_mean.requires_grad is False
    optimizer = nn.optim.SGD(get_parameters(layer), lr=0.1)
    assert any(t is layer.running_mean for t in optimizer.buffers)
    assert any(t is layer.weight for t in optimizer.params)


@pytest.mark.parametrize("normalized_shape", [5, (4, 5)])
def test_layernorm(device: str, normalized_shape: Any) -> None:
    theirs = torch.nn.LayerNorm(normalized_shape, eps=1e-4)
    with torch.no_grad():
        theirs.weight.uniform_(0.5, 1.5)
        theirs.bias.uniform_(-0.5, 0.5)
    ours = nn.LayerNorm(normalized_shape, eps=1e-4)
    copy_parameters(ours, theirs, ["weight", "bias"], device)
    run_both(ours, theirs, random_input(3, 4, 5), device, ["weight", "bias"])


def test_layernorm_without_affine(device: str) -> None:
    theirs = torch.nn.LayerNorm(5, elementwise_affine=False)
    ours = nn.LayerNorm(5, elementwise_affine=False)
    run_both(ours, theirs, random_input(3, 5), device, [])


def test_groupnorm(device: str) -> None:
    theirs = torch.nn.GroupNorm(2, 6)
    with torch.no_grad():
        theirs.weight.uniform_(0.5, 1.5)
        theirs.bias.uniform_(-0.5, 0.5)
    ours = nn.GroupNorm(2, 6)
    copy_parameters(ours, theirs, ["weight", "bias"], device)
    run_both(ours, theirs, random_input(2, 6, 3, 4), device, ["weight", "bias"])


def test_instancenorm(device: str) -> None:
    theirs = torch.nn.InstanceNorm2d(3, affine=True)
    with torch.no_grad():
        theirs.weight.uniform_(0.5, 1.5)
        theirs.bias.uniform_(-0.5, 0.5)
    ours = nn.InstanceNorm(3)
    copy_parameters(ours, theirs, ["weight", "bias"], device)
    run_both(ours, theirs, random_input(2, 3, 4, 5), device, ["weight", "bias"])


def test_rmsnorm(device: str) -> None:
    theirs = torch.nn.RMSNorm(6, eps=1e-6)
    with torch.no_grad():
        theirs.weight.uniform_(0.5, 1.5)
    ours = nn.RMSNorm(6)
    copy_parameters(ours, theirs, ["weight"], device)
    run_both(ours, theirs, random_input(3, 2, 6), device, ["weight"])


def test_layernorm2d(device: str) -> None:
    """torch has no LayerNorm2d: it is LayerNorm over the channels, moved last and back."""
    channels = 3
    theirs = torch.nn.LayerNorm(channels)
    with torch.no_grad():
        theirs.weight.uniform_(0.5, 1.5)
        theirs.bias.uniform_(-0.5, 0.5)
    ours = nn.LayerNorm2d(channels)
    copy_parameters(ours, theirs, ["weight", "bias"], device)

    def theirs_2d(x: Any) -> Any:
        return theirs(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
    theirs_2d.weight, theirs_2d.bias = theirs.weight, theirs.bias  # type: ignore[attr-defined]
    run_both(ours, theirs_2d, random_input(2, channels, 4, 5) * 3 + 1, device,
             ["weight", "bias"])


def test_layernorm2d_needs_images() -> None:
    with pytest.raises(ValueError, match="N, C, H, W"):
        nn.LayerNorm2d(3)(Tensor.ones(2, 3))


def copy_lstm_weights(ours: nn.LSTMCell, theirs: Any, device: str) -> None:
    names = ["weight_ih", "weight_hh"] + (["bias_ih", "bias_hh"] if ours.bias_ih is not None
                                          else [])
    copy_parameters(ours, theirs, names, device)


@pytest.mark.parametrize("bias", [True, False])
def test_lstm_cell_over_a_sequence(device: str, bias: bool) -> None:
    """Three steps of torch.nn.LSTMCell and ours from a given state: h, c after each step, then
    the gradients of the inputs, the first state and every weight."""
    batch, inputs, hidden = 2, 3, 4
    theirs = torch.nn.LSTMCell(inputs, hidden, bias=bias)
    ours = nn.LSTMCell(inputs, hidden, bias=bias)
    copy_lstm_weights(ours, theirs, device)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((batch, inputs)).astype(np.float32) for _ in range(3)]
    h0, c0 = (rng.standard_normal((batch, hidden)).astype(np.float32) for _ in range(2))
    our_xs = [Tensor(x, device=device, requires_grad=True) for x in xs]
    their_xs = [torch.tensor(x, requires_grad=True) for x in xs]
    our_hc = (Tensor(h0, device=device, requires_grad=True),
              Tensor(c0, device=device, requires_grad=True))
    their_hc = (torch.tensor(h0, requires_grad=True), torch.tensor(c0, requires_grad=True))
    our_state, their_state = our_hc, their_hc
    for step, (our_x, their_x) in enumerate(zip(our_xs, their_xs)):
        our_state, their_state = ours(our_x, our_state), theirs(their_x, their_state)
        for ours_t, theirs_t, name in zip(our_state, their_state, "hc"):
            np.testing.assert_allclose(ours_t.numpy(), theirs_t.detach().numpy(), atol=ATOL,
                                       rtol=RTOL, err_msg=f"{name} after step {step + 1}")
    (our_state[0].sum() + (our_state[1] * 0.5).sum()).backward()
    (their_state[0].sum() + (their_state[1] * 0.5).sum()).backward()
    pairs = list(zip(our_xs, their_xs)) + list(zip(our_hc, their_hc))
    pairs += [(getattr(ours, n), getattr(theirs, n)) for n in ["weight_ih", "weight_hh"]]
    if bias:
        pairs += [(getattr(ours, n), getattr(theirs, n)) for n in ["bias_ih", "bias_hh"]]
    for k, (our_t, their_t) in enumerate(pairs):
        assert our_t.grad is not None, f"tensor {k} got no gradient"
        np.testing.assert_allclose(our_t.grad.numpy(), their_t.grad.numpy(), atol=ATOL,
                                   rtol=RTOL, err_msg=f"gradient of tensor {k}")


def test_lstm_cell_starts_from_zeros(device: str) -> None:
    theirs = torch.nn.LSTMCell(3, 5)
    ours = nn.LSTMCell(3, 5)
    copy_lstm_weights(ours, theirs, device)
    x = random_input(4, 3)
    h, c = ours(Tensor(x, device=device))
    their_h, their_c = theirs(torch.tensor(x))
    np.testing.assert_allclose(h.numpy(), their_h.detach().numpy(), atol=ATOL, rtol=RTOL)
    np.testing.assert_allclose(c.numpy(), their_c.detach().numpy(), atol=ATOL, rtol=RTOL)


def test_lstm_cell_initialization_and_errors() -> None:
    cell = nn.LSTMCell(3, 16)
    assert cell.weight_ih.shape == (64, 3) and cell.weight_hh.shape == (64, 16)
    for weight in (cell.weight_ih, cell.weight_hh):
        values = weight.numpy()
        assert np.abs(values).max() <= 1 / 4 and values.std() > 0.1  # uniform in ±1/sqrt(16)
    assert cell.bias_ih is not None and not cell.bias_ih.numpy().any()  # tinygrad: zeros
    assert nn.LSTMCell(3, 4, bias=False).bias_hh is None
    with pytest.raises(ValueError, match=r"\(batch, 3\)"):
        cell(Tensor.ones(2, 4))


# ---- the seed example, verbatim but for the import ----

SEED_EXAMPLE = '''
from tinyteach import Tensor, nn
class LinearNet:
  def __init__(self):
    self.l1 = Tensor.kaiming_uniform(784, 128)
    self.l2 = Tensor.kaiming_uniform(128, 10)
  def __call__(self, x:Tensor) -> Tensor:
    return x.flatten(1).dot(self.l1).relu().dot(self.l2)
model = LinearNet()
optim = nn.optim.Adam([model.l1, model.l2], lr=0.001)
x, y = Tensor.rand(4, 1, 28, 28), Tensor([2, 4, 3, 7])  # replace with real MNIST data
with Tensor.train():
  for i in range(10):
    optim.zero_grad()
    loss = model(x).sparse_categorical_crossentropy(y).backward()
    optim.step()
    print(i, loss.item())
'''


def test_seed_example_runs_and_learns(capsys: pytest.CaptureFixture[str]) -> None:
    Tensor.manual_seed(0)
    exec(compile(SEED_EXAMPLE, "seed_example", "exec"), {})
    lines = capsys.readouterr().out.split("\n")
    losses = [float(line.split()[1]) for line in lines if line.strip()]
    assert len(losses) == 10 and all(np.isfinite(losses))
    assert losses[-1] < losses[0] * 0.5, f"the loss did not go down: {losses}"
