"""bfloat16 (issue 13): 16-bit words on the host (numpy has none), every op computed in float32
and rounded back to nearest-even, as PyTorch does: checked bit for bit against torch.bfloat16
on NUMPY and CPU, forward and backward, with NaN, infinities, -0.0 and ties."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tinyteach import Device, Tensor, dtypes
from tinyteach.dtype import from_bfloat16_bits, least_upper_dtype, to_bfloat16_bits

# the devices that compute bfloat16 (OPENCL where it is installed); WEBGPU refuses it
DEVICES = ["NUMPY", "CPU", "PYTHON"] + [name for name in ["OPENCL"] if Device.is_available(name)]
# ties (1 + 2^-8 rounds down to even, 1 + 3 * 2^-8 up), -0.0, inf, NaN, overflow to inf,
# a subnormal, and ordinary values
SPECIAL = np.array([1.0, 1.00390625, 1.01171875, -0.0, np.inf, -np.inf, np.nan, 3.4e38, 1e-40,
                    65504.0, 1 / 3, -2.5], dtype=np.float32)
Y = np.linspace(-3, 3, len(SPECIAL)).astype(np.float32)


def torch_values(t: torch.Tensor) -> np.ndarray:
    return (t.float() if t.dtype == torch.bfloat16 else t).detach().numpy()


def same(ours: Tensor, theirs: torch.Tensor) -> None:
    np.testing.assert_array_equal(ours.numpy(), torch_values(theirs))


def test_words_round_to_nearest_even_as_torch() -> None:
    words = to_bfloat16_bits(SPECIAL)
    expected = torch.tensor(SPECIAL).bfloat16().view(torch.int16).numpy().view(np.uint16)
    finite = ~np.isnan(SPECIAL)
    np.testing.assert_array_equal(words.view(np.uint16)[finite], expected[finite])
    assert np.isnan(from_bfloat16_bits(words)[~finite]).all()
    np.testing.assert_array_equal(from_bfloat16_bits(words)[finite],
                                  torch.tensor(SPECIAL).bfloat16().float().numpy()[finite])


def test_the_dtype() -> None:
    assert dtypes.bfloat16.itemsize == 2 and dtypes.is_float(dtypes.bfloat16)
    assert least_upper_dtype(dtypes.float16, dtypes.bfloat16) == dtypes.float32
    assert least_upper_dtype(dtypes.int32, dtypes.bfloat16) == dtypes.bfloat16
    assert Tensor([1.5]).bfloat16().dtype == dtypes.bfloat16
    assert Tensor([1.5], dtype="bfloat16").numpy().dtype == np.float32  # values, as tinygrad


@pytest.mark.parametrize("device", DEVICES)
def test_elementwise_ops_bit_for_bit(device: str) -> None:
    a = Tensor(SPECIAL, device=device).bfloat16()
    b = Tensor(Y, device=device, dtype=dtypes.bfloat16)
    ta, tb = torch.tensor(SPECIAL).bfloat16(), torch.tensor(Y).bfloat16()
    same(a, ta)
    same(a + b, ta + tb)
    same(a * b, ta * tb)
    same(a - b, ta - tb)
    same(a.sqrt(), ta.sqrt())
    same(b.relu(), tb.relu())
    same(a.maximum(b), ta.maximum(tb))
    same(a < b, ta < tb)
    same(b.where(a, b) if False else (a < b).where(a, b), torch.where(ta < tb, ta, tb))
    same(b.int(), tb.int())
    if device != "OPENCL":  # (this OpenCL device has no half floats)
        same(b.half(), tb.half())
    same(a.float(), ta.float())
    same(b + 1, tb + 1)
    same(b * 0.1, tb * 0.1)


@pytest.mark.parametrize("device", DEVICES)
def test_reductions_and_matmul_in_float32(device: str) -> None:
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((16, 32)).astype(np.float32), rng.standard_normal((32, 8))
    a, ta = Tensor(x, device=device).bfloat16(), torch.tensor(x).bfloat16()
    same(a.sum(1), ta.sum(1))
    same(a.max(0), ta.max(0).values)
    ours = (a @ Tensor(w.astype(np.float32), device=device).bfloat16()).numpy()
    theirs = torch_values(ta @ torch.tensor(w, dtype=torch.float32).bfloat16())
    # each product is rounded to bfloat16 before the float32 sum (tinygrad's), torch rounds
    # only the sum: within two bfloat16 steps of the result
    np.testing.assert_allclose(ours, theirs, rtol=2 ** -7, atol=2 ** -6 * np.abs(theirs).max())


@pytest.mark.parametrize("device", DEVICES)
def test_composed_functions_round_once_as_torch(device: str) -> None:
    """exp, sigmoid, division, softmax, ...: computed in float32 and rounded once (PyTorch's),
    so nearly every result is PyTorch's bit for bit and none is more than one bfloat16 step
    away (float32's exp and PyTorch's may differ in their last bit)."""
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(400) * 3).astype(np.float32)
    y = (rng.standard_normal(400) + 0.1).astype(np.float32)
    a, b = Tensor(x, device=device).bfloat16(), Tensor(y, device=device).bfloat16()
    ta, tb = torch.tensor(x).bfloat16(), torch.tensor(y).bfloat16()
    F = torch.nn.functional
    cases = [("exp", a.exp(), ta.exp()), ("log", b.abs().log(), tb.abs().log()),
             ("sigmoid", a.sigmoid(), ta.sigmoid()), ("tanh", a.tanh(), ta.tanh()),
             ("silu", a.silu(), F.silu(ta)), ("div", a / b, ta / tb), ("rdiv", 2 / b, 2 / tb),
             ("pow", b.abs() ** 1.5, tb.abs() ** 1.5),
             ("softmax", a.reshape(4, 100).softmax(-1), ta.reshape(4, 100).softmax(-1)),
             ("log_softmax", a.reshape(4, 100).log_softmax(-1),
              ta.reshape(4, 100).log_softmax(-1))]
    for name, ours, theirs in cases:
        assert ours.dtype == dtypes.bfloat16, name
        got, want = ours.numpy(), torch_values(theirs)
        assert (got == want).mean() > 0.9, name
        np.testing.assert_allclose(got, want, rtol=2 ** -7, atol=1e-30, err_msg=name)


@pytest.mark.parametrize("device", DEVICES)
def test_backward_as_torch(device: str) -> None:
    rng = np.random.default_rng(1)
    w, bias = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal(4)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    W = Tensor(w, device=device, dtype=dtypes.bfloat16, requires_grad=True)
    B = Tensor(bias.astype(np.float32), device=device, dtype=dtypes.bfloat16, requires_grad=True)
    ((Tensor(x, device=device).bfloat16() @ W + B).relu() * W.sum()).sum().backward()
    tW = torch.tensor(w).bfloat16().requires_grad_()
    tB = torch.tensor(bias, dtype=torch.float32).bfloat16().requires_grad_()
    ((torch.tensor(x).bfloat16() @ tW + tB).relu() * tW.sum()).sum().backward()
    assert W.grad is not None and B.grad is not None and W.grad.dtype == dtypes.bfloat16
    assert tW.grad is not None and tB.grad is not None
    np.testing.assert_allclose(W.grad.numpy(), torch_values(tW.grad), rtol=2 ** -6, atol=0.05)
    np.testing.assert_allclose(B.grad.numpy(), torch_values(tB.grad), rtol=2 ** -6, atol=0.05)


def test_the_generated_c_holds_words_and_converts() -> None:
    from tinyteach.engine.realize import get_runner
    out = Tensor(Y, device="CPU").bfloat16() * 2
    (item,) = out.schedule()
    source = get_runner(item).source or ""
    assert "uint16_t* restrict data0" in source
    assert "tt_f32_to_bf16" in source and "static inline" in source


def test_copies_between_devices_keep_the_words() -> None:
    a = Tensor(SPECIAL, device="NUMPY").bfloat16()
    on_cpu = a.to("CPU")
    assert on_cpu.dtype == dtypes.bfloat16
    same(on_cpu * 2, torch.tensor(SPECIAL).bfloat16() * 2)
    np.testing.assert_array_equal(on_cpu.to("NUMPY").numpy(), a.numpy())


def test_a_bfloat16_buffer_from_words() -> None:
    words = to_bfloat16_bits(Y)
    np.testing.assert_array_equal(Tensor(words).numpy(), torch.tensor(Y).bfloat16().float())
    np.testing.assert_array_equal(Tensor(words).dtype, dtypes.bfloat16)


def test_the_generated_opencl_holds_words_and_converts() -> None:
    from tinyteach.codegen.lower import lower
    from tinyteach.opt.heuristic import heuristic_plan
    from tinyteach.render.opencl import OpenCLRenderer
    (item,) = (Tensor(Y, device="CPU").bfloat16() * 2).schedule()
    source = OpenCLRenderer().render(item.name, lower(item.ast, heuristic_plan(item.ast)))
    assert "__global ushort* restrict data0" in source
    assert "as_float((uint)h << 16)" in source and "tt_f32_to_bf16(" in source


def test_webgpu_refuses_bfloat16_naming_the_device_and_dtype() -> None:
    if not Device.is_available("WEBGPU"):
        pytest.skip("WEBGPU is not installed")
    from tinyteach.render.wgsl import UnsupportedDType
    with pytest.raises(UnsupportedDType, match="WEBGPU cannot .* bfloat16"):
        (Tensor(Y, device="WEBGPU").bfloat16() * 3).numpy()




def test_safetensors_and_torch_checkpoints_keep_bfloat16(tmp_path: Path) -> None:
    from tinyteach.nn.state import safe_load, safe_save, torch_load
    values = torch.tensor(SPECIAL).bfloat16()
    safe_save({"w": Tensor(SPECIAL).bfloat16()}, tmp_path / "w.safetensors")
    loaded = safe_load(tmp_path / "w.safetensors")["w"]
    assert loaded.dtype == dtypes.bfloat16
    same(loaded, values)
    safetensors_torch = pytest.importorskip("safetensors.torch")
    theirs = safetensors_torch.load_file(str(tmp_path / "w.safetensors"))["w"]
    assert theirs.dtype == torch.bfloat16
    np.testing.assert_array_equal(theirs.float().numpy(), loaded.numpy())
    torch.save({"w": values}, tmp_path / "w.pt")
    from_torch = torch_load(tmp_path / "w.pt")["w"]
    assert from_torch.dtype == dtypes.bfloat16
    same(from_torch, values)
