"""Distinct tensors keep distinct buffers, random numbers inside TinyJit, multinomial and
newton_schulz, and dataset tensors that no backward piles a .grad onto (issue 13)."""
from __future__ import annotations

import gc

import numpy as np
import pytest

from tinyteach import Tensor, TinyJit, nn
from tinyteach.device import Buffer
from tinyteach.ir.uop import base_buffer
from tinyteach.nn.datasets import digits

torch = pytest.importorskip("torch")


def _buffer(t: Tensor) -> Buffer:
    node = base_buffer(t.uop)
    assert node is not None
    return node.arg


def _live_buffers() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is Buffer)


# ---- distinct tensors, distinct buffers ----

@pytest.mark.parametrize("make", [lambda: Tensor.zeros(4).contiguous(), lambda: Tensor.zeros(4)])
def test_equal_graphs_realized_together_get_two_buffers(make):
    c, d = make(), make()
    Tensor.realize(c, d)
    c.assign(Tensor.ones(4)).realize()
    np.testing.assert_array_equal(d.numpy(), np.zeros(4))
    np.testing.assert_array_equal(c.numpy(), np.ones(4))


def test_x_plus_zero_twice_are_two_tensors():
    x = Tensor([1.0, 2.0, 3.0, 4.0])
    y, z = x + 0, x + 0
    Tensor.realize(y, z)
    y.assign(Tensor.ones(4)).realize()
    np.testing.assert_array_equal(z.numpy(), [1.0, 2.0, 3.0, 4.0])
    np.testing.assert_array_equal(x.numpy(), [1.0, 2.0, 3.0, 4.0])


def test_the_same_tensor_twice_is_one_buffer():
    a = Tensor.zeros(4).contiguous()
    Tensor.realize(a, a)
    b = Tensor.zeros(4).contiguous().realize()
    assert _buffer(a) is not _buffer(b)
    before = _live_buffers()
    c = Tensor.ones(4).contiguous()
    Tensor.realize(c, c)
    after = _live_buffers()
    assert after - before <= 1  # (the constant needs none)


def test_two_layernorms_train_apart_as_in_torch():
    Tensor.manual_seed(0)
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    first, second = nn.LayerNorm(8), nn.LayerNorm(8)
    params = [first.weight, first.bias, second.weight, second.bias]
    Tensor.realize(*params)
    opt = nn.optim.SGD(params, lr=0.1)
    t1, t2 = torch.nn.LayerNorm(8), torch.nn.LayerNorm(8)
    topt = torch.optim.SGD([*t1.parameters(), *t2.parameters()], lr=0.1)
    tx = torch.tensor(x)
    target = torch.arange(8.0)
    for _ in range(3):
        opt.zero_grad()
        with Tensor.train():
            weighted = (first(Tensor(x)) * Tensor(target.numpy())).sum()
            loss = weighted + (second(Tensor(x)) ** 2).mean()
            loss.backward()
            opt.step()
        topt.zero_grad()
        tloss = (t1(tx) * target).sum() + (t2(tx) ** 2).mean()
        tloss.backward()
        topt.step()
    for mine, theirs in zip(params, [*t1.parameters(), *t2.parameters()]):
        np.testing.assert_allclose(mine.numpy(), theirs.detach().numpy(), rtol=1e-4, atol=1e-5)


# ---- random numbers inside TinyJit ----

def test_jitted_rand_draws_new_numbers_in_the_unjitted_sequence():
    @TinyJit
    def jitted() -> Tensor:
        return Tensor.rand(4).realize()

    def plain() -> Tensor:
        return Tensor.rand(4).realize()
    Tensor.manual_seed(7)
    replayed = np.stack([jitted().numpy() for _ in range(5)])
    assert jitted.calls == 5  # (3 of the 5 are replays)
    Tensor.manual_seed(7)
    expected = np.stack([plain().numpy() for _ in range(5)])
    np.testing.assert_array_equal(replayed, expected)
    assert len({tuple(row) for row in replayed}) == 5
    assert ((replayed >= 0) & (replayed < 1)).all()


@pytest.mark.parametrize("other_device_first", [False, True])
def test_manual_seed_restarts_a_captured_jit(other_device_first):
    """With another device drawn from first (the CI of 5d2358f, under xdist), manual_seed gave
    CPU the second key and a replay, which runs no Python, kept it: manual_seed now orders the
    devices as the last seed's draws came."""
    if other_device_first:
        Tensor.rand(3, device="NUMPY").realize()

    @TinyJit
    def jitted() -> Tensor:
        return Tensor.randint(6, high=1000).realize()
    Tensor.manual_seed(1)
    first = [jitted().tolist() for _ in range(4)]
    Tensor.manual_seed(1)
    again = [jitted().tolist() for _ in range(4)]  # all replays now
    assert first == again


def test_draws_of_every_size_advance_the_counter_with_one_kernel():
    """Each draw advances the device's counter at once, by a kernel. Its count is data: with
    the count a constant of the kernel, every layer size of a model was a kernel of its own,
    compiled before the first step (beautiful_mnist's ten layers: 0.45 s of gcc). The numbers
    are tinygrad's either way (test_random.py)."""
    from tinyteach.engine.realize import record_launches
    Tensor.manual_seed(3)
    Tensor.rand(1)  # the device's key and counter exist before the recording
    with record_launches() as launches:
        for size in (3, 50, 700, 9000):
            Tensor.rand(size)
    # per draw: the counter copied for the draw, its advance into a fresh buffer (it reads
    # its own target through views), copied back; two kernels in all
    assert len(launches) == 12
    assert len({launch.item.ast for launch in launches}) == 2
    Tensor.manual_seed(3)
    Tensor.rand(1)
    first = [Tensor.rand(size).numpy() for size in (3, 50)]
    Tensor.manual_seed(3)
    Tensor.rand(1)
    assert all(np.array_equal(a, Tensor.rand(a.size).numpy()) for a in first)


def test_lazy_draws_realized_in_any_order_match_the_drawing_order():
    Tensor.manual_seed(3)
    a, b = Tensor.rand(5).numpy(), Tensor.rand(5).numpy()
    Tensor.manual_seed(3)
    la, lb = Tensor.rand(5), Tensor.rand(5)
    np.testing.assert_array_equal(lb.numpy(), b)
    np.testing.assert_array_equal(la.numpy(), a)


# ---- multinomial and newton_schulz ----

def test_multinomial_with_replacement_follows_the_probabilities():
    Tensor.manual_seed(0)
    p = np.array([0.1, 0.2, 0.3, 0.4], dtype=np.float32)
    draws = Tensor(p * 5).multinomial(8000, replacement=True).numpy()
    assert draws.shape == (8000,) and draws.dtype == np.int32
    np.testing.assert_allclose(np.bincount(draws, minlength=4) / 8000, p, atol=0.02)


def test_multinomial_without_replacement_never_repeats():
    Tensor.manual_seed(0)
    p = np.array([[0.0, 0.2, 0.3, 0.5]] * 3000, dtype=np.float32)
    draws = Tensor(p).multinomial(2).numpy()
    assert draws.shape == (3000, 2)
    assert (draws[:, 0] != draws[:, 1]).all() and (draws != 0).all()
    np.testing.assert_allclose(np.bincount(draws[:, 0], minlength=4) / 3000, p[0], atol=0.03)


@pytest.mark.parametrize("weights, kwargs", [
    ([[[1.0]]], {}), ([1.0, 2.0], {"num_samples": 0}), ([1.0, 2.0], {"num_samples": 3}),
    ([1.0, -2.0], {}), ([0.0, 0.0], {}), ([1.0, float("nan")], {})])
def test_multinomial_bad_input_says_what_torch_says(weights, kwargs):
    with pytest.raises(RuntimeError) as theirs:
        torch.multinomial(torch.tensor(weights), **{"num_samples": 1, **kwargs})
    message = str(theirs.value).split("\n")[0]
    with pytest.raises(RuntimeError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        Tensor(weights).multinomial(**kwargs)


@pytest.mark.parametrize("shape", [(3, 5), (6, 4), (2, 3, 3)])
def test_newton_schulz_as_a_numpy_iteration(shape):
    g = np.random.default_rng(1).standard_normal(shape)
    params = (3.4445, -4.775, 2.0315)
    x = np.swapaxes(g, -1, -2) if shape[-2] > shape[-1] else g
    x = x / (np.sqrt((x ** 2).sum(axis=(-2, -1), keepdims=True)) + 1e-7)
    for _ in range(5):
        gram = x @ np.swapaxes(x, -1, -2)
        x = params[0] * x + params[1] * gram @ x + params[2] * gram @ gram @ x
    expected = np.swapaxes(x, -1, -2) if shape[-2] > shape[-1] else x
    mine = Tensor(g).newton_schulz(5, params).numpy()
    np.testing.assert_allclose(mine, expected, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="matrix"):
        Tensor([1.0, 2.0]).newton_schulz(1, params)


# ---- dataset tensors: no .grad piled onto them ----

def test_datasets_are_requires_grad_false():
    assert all(t.requires_grad is False for t in digits())


def test_fifty_steps_without_jit_do_not_grow_live_buffers():
    X_train, Y_train, _, _ = digits()
    Tensor.manual_seed(0)
    model = [nn.Linear(64, 16), nn.Linear(16, 10)]
    opt = nn.optim.SGD(nn.state.get_parameters(model), lr=0.05)

    def step() -> None:
        idx = Tensor.randint(32, high=X_train.shape[0])
        x = X_train[idx].reshape(32, 64)
        with Tensor.train():
            opt.zero_grad()
            loss = model[1](model[0](x).relu()).sparse_categorical_crossentropy(Y_train[idx])
            loss.backward()
            opt.step()
        loss.item()

    for _ in range(5):
        step()
    start = _live_buffers()
    for _ in range(50):
        step()
    assert _live_buffers() <= start + 4
    assert X_train.grad is None
