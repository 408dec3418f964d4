"""Tensors over several devices (tensor/multi.py): devices with an index, shard, per-shard ops, the
ring all-reduce, gathering, matmul over split weights, and data-parallel training that gives
one device's losses. Every value is checked against numpy (or against the same computation
on one device)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tinyteach import Tensor, nn
from tinyteach.device import Buffer, Device, DeviceUnavailable
from tinyteach.dtype import dtypes
from tinyteach.ir.uop import base_buffer
from tinyteach.nn.state import get_parameters
from tinyteach.settings import Context
from tinyteach.tensor.multi import MultiUOp, OneGraphError, ShardingError, ring_steps

TWO = ("CPU", "CPU:1")
THREE = ("CPU", "CPU:1", "CPU:2")
RNG = np.random.default_rng(26)


def data(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# ---- devices with an index ----

def test_device_names_with_an_index():
    assert Device.canonicalize("cpu:1") == "CPU:1"
    assert Device.canonicalize("CPU:0") == "CPU" and Device.canonicalize("cpu") == "CPU"
    with pytest.raises(ValueError, match="index"):
        Device.canonicalize("CPU:one")
    with pytest.raises(ValueError, match="unknown device"):
        Device.canonicalize("NOPE:1")


def test_a_second_cpu_has_its_own_buffers_and_runs_the_same_kernels():
    first, second = Device["CPU"], Device["CPU:1"]
    assert second.name == "CPU:1" and second.allocator is not first.allocator
    assert second.compiler is first.compiler and second.renderer is first.renderer
    buffer = Buffer("CPU:1", 3, dtypes.float32).copyin(np.array([1, 2, 3], dtype=np.float32))
    assert buffer.device == "CPU:1" and buffer.numpy().tolist() == [1.0, 2.0, 3.0]
    values = data(5)
    t = Tensor(values, device="CPU:1")
    assert t.device == "CPU:1" and (t * 2).device == "CPU:1"
    np.testing.assert_allclose((t * 2).numpy(), values * 2)
    back = (t.to("CPU") + 1).to("cpu:1")
    assert back.device == "CPU:1"
    np.testing.assert_allclose(back.numpy(), values + 1)


@pytest.mark.parametrize("kind", ["NUMPY", "PYTHON"])
def test_other_host_devices_have_an_index_too(kind):
    values = data(4, 2)
    t = Tensor(values, device=f"{kind}:1")
    assert t.device == f"{kind}:1"
    np.testing.assert_allclose((t.to(kind) * 3).sum(0).numpy(), (values * 3).sum(0), rtol=1e-6)
    sharded = Tensor(values).shard((kind, f"{kind}:1"), axis=0)
    np.testing.assert_allclose(sharded.sum(0).numpy(), values.sum(0), rtol=1e-6)


def test_a_second_device_that_does_not_exist_is_refused_clearly():
    # no platform here has ten OpenCL devices (or there is no OpenCL at all): OPENCL:9 says so
    with pytest.raises(DeviceUnavailable, match="OPENCL"):
        Tensor([1.0], device="OPENCL:9").realize()
    assert "OPENCL" in (Device.why_unavailable("OPENCL:9") or "")


# run with two pocl devices: POCL_DEVICES must be set before pocl loads, so in a process of its own
TWO_OPENCL_DEVICES = """
import json
import numpy as np
from tinyteach import Device, Tensor
assert Device["OPENCL:1"].cl_device != Device["OPENCL"].cl_device
a = np.arange(24, dtype=np.float32).reshape(4, 6)
split = Tensor(a).shard(("OPENCL", "OPENCL:1"), axis=0)
w = Tensor(a.T.copy()).shard(("OPENCL", "OPENCL:1"), axis=1)
print(json.dumps({"sum": split.sum(0).tolist(), "matmul": (Tensor(a).shard(
    ("OPENCL", "OPENCL:1")) @ w).tolist(), "moved": (Tensor(a, device="OPENCL:1") + 1).to(
    "OPENCL").tolist()}))
"""


def test_two_opencl_devices_when_the_platform_has_two():
    if Device.why_unavailable("OPENCL") is not None:
        pytest.skip(f"no OpenCL here: {Device.why_unavailable('OPENCL')}")
    env = dict(os.environ, POCL_DEVICES="pthread pthread")
    run = subprocess.run([sys.executable, "-c", TWO_OPENCL_DEVICES], env=env,
                         capture_output=True, text=True, timeout=600)
    if "OPENCL:1 is not available" in run.stderr:  # not pocl: POCL_DEVICES means nothing
        pytest.skip("the OpenCL platform here has one device")
    assert run.returncode == 0, run.stderr[-2000:]
    found = json.loads(run.stdout.splitlines()[-1])
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    np.testing.assert_allclose(found["sum"], a.sum(0))
    np.testing.assert_allclose(found["matmul"], a @ a.T, rtol=1e-5)
    np.testing.assert_allclose(found["moved"], a + 1)


# ---- shard, per-shard ops and gathering ----

def test_shard_splits_into_equal_parts_one_per_device():
    values = data(4, 6)
    t = Tensor(values).shard(TWO, axis=0)
    assert t.device == TWO and t.shape == (4, 6)
    assert isinstance(t.uop, MultiUOp) and t.uop.axis == 0
    assert [s.shape for s in t.uop.shards] == [(2, 6), (2, 6)]
    replicated = Tensor(values).shard(TWO)
    assert replicated.uop.axis is None and replicated.uop.shards[1].shape == (4, 6)
    np.testing.assert_array_equal(t.numpy(), values)
    np.testing.assert_array_equal(replicated.numpy(), values)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_elementwise_ops_run_per_shard(axis):
    a, b = data(4, 6), data(4, 6)
    x, y = Tensor(a).shard(TWO, axis=axis), Tensor(b).shard(TWO, axis=axis)
    result = ((x * y + 1).relu() - x.exp() / 2).maximum(y)
    assert result.device == TWO and result.uop.axis == axis % 2
    expected = np.maximum(np.maximum(a * b + 1, 0) - np.exp(a) / 2, b)
    np.testing.assert_allclose(result.numpy(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal((x < y).numpy(), a < b)
    np.testing.assert_allclose((x < 0).where(x, 2 * y).numpy(), np.where(a < 0, a, 2 * b))


def test_a_replicated_tensor_broadcasts_against_a_split_one():
    a, row, column = data(4, 6), data(6), data(4, 1)
    x = Tensor(a).shard(TWO, axis=0)
    result = x + Tensor(row).shard(TWO) * Tensor(column).shard(TWO)
    assert result.uop.axis == 0
    np.testing.assert_allclose(result.numpy(), a + row * column, rtol=1e-6)


def test_movement_ops_that_keep_the_split_axis():
    a = data(4, 6)
    x = Tensor(a).shard(TWO, axis=0)
    assert x.T.uop.axis == 1
    np.testing.assert_array_equal(x.T.numpy(), a.T)
    np.testing.assert_array_equal(x.reshape(12, 2).numpy(), a.reshape(12, 2))
    np.testing.assert_array_equal(x.reshape(2, 2, 6).numpy(), a.reshape(2, 2, 6))
    np.testing.assert_array_equal(x[:, 1:4].numpy(), a[:, 1:4])
    np.testing.assert_array_equal(x.pad(((0, 0), (1, 2))).numpy(), np.pad(a, ((0, 0), (1, 2))))
    np.testing.assert_array_equal(x.flip(1).numpy(), a[:, ::-1])


@pytest.mark.parametrize("devices", [TWO, THREE], ids=["2 devices", "3 devices"])
def test_a_reduce_over_the_split_axis_is_an_all_reduce(devices):
    a = data(6, 5)
    x = Tensor(a).shard(devices, axis=0)
    total = x.sum(axis=0)
    assert total.device == devices and total.uop.axis is None  # every device holds all of it
    np.testing.assert_allclose(total.numpy(), a.sum(0), rtol=1e-5)
    np.testing.assert_allclose(x.max(axis=0).numpy(), a.max(0))
    np.testing.assert_allclose(x.mean().numpy(), a.mean(), rtol=1e-5)
    np.testing.assert_allclose(x.sum(axis=1).numpy(), a.sum(1), rtol=1e-5)  # not split: per shard
    assert x.sum(axis=1).uop.axis == 0


def test_every_device_holds_the_all_reduced_value():
    a = data(6, 7)
    total = Tensor(a).shard(THREE, axis=0).sum(axis=0).realize()
    for shard, device in zip(total.uop.shards, THREE):
        base = base_buffer(shard)
        assert base is not None and base.arg.device == device
        np.testing.assert_allclose(base.arg.numpy(), a.sum(0), rtol=1e-5)


@pytest.mark.parametrize("parts", [2, 3, 4, 5])
def test_the_ring_brings_every_part_of_every_chunk_to_every_device(parts):
    # what each device's copy of each chunk has summed, followed step by step
    held = [[{device} for _chunk in range(parts)] for device in range(parts)]
    for step in ring_steps(parts):
        arriving = set(held[step.source][step.chunk])
        if step.phase == "reduce-scatter":
            assert not arriving & held[step.dest][step.chunk], "a part would be added twice"
            arriving |= held[step.dest][step.chunk]
        held[step.dest][step.chunk] = arriving
    assert all(chunk == set(range(parts)) for device in held for chunk in device)
    assert len(ring_steps(parts)) == 2 * parts * (parts - 1)


def test_gather_with_to_concatenates_the_shards():
    a = data(4, 6)
    for axis in (0, 1):
        x = Tensor(a).shard(TWO, axis=axis)
        for device in TWO:
            gathered = x.to(device)
            assert gathered.device == device and not isinstance(gathered.uop, MultiUOp)
            np.testing.assert_array_equal(gathered.numpy(), a)


def test_shard_in_place_keeps_the_tensor():
    a = data(4, 2)
    t = Tensor(a)
    assert t.shard_(TWO, axis=0) is t and t.device == TWO
    bases = [base_buffer(s) for s in t.uop.shards]  # each part is a buffer of its own
    assert [b.arg.device for b in bases if b is not None] == list(TWO)
    np.testing.assert_array_equal(t.numpy(), a)


def test_constants_and_new_tensors_on_a_tuple_of_devices():
    t = Tensor.zeros(2, 3, device=TWO)
    assert t.device == TWO and t.uop.axis is None
    np.testing.assert_array_equal((t + 1).numpy(), np.ones((2, 3)))
    made = Tensor([1.0, 2.0], device=TWO)
    np.testing.assert_array_equal((made * 2).numpy(), [2.0, 4.0])


# ---- matmul ----

def test_replicated_times_column_split_gives_a_column_split_result():
    a, w = data(5, 8), data(8, 6)
    result = Tensor(a).shard(TWO) @ Tensor(w).shard(TWO, axis=1)
    assert result.device == TWO and result.uop.axis == 1
    assert [s.shape for s in result.uop.shards] == [(5, 3), (5, 3)]
    np.testing.assert_allclose(result.numpy(), a @ w, rtol=1e-5, atol=1e-5)


def test_batch_split_times_replicated_gives_a_batch_split_result():
    a, w = data(6, 8), data(8, 3)
    result = Tensor(a).shard(TWO, axis=0) @ Tensor(w).shard(TWO)
    assert result.uop.axis == 0
    np.testing.assert_allclose(result.numpy(), a @ w, rtol=1e-5, atol=1e-5)


def test_row_split_times_split_inner_axis_is_an_all_reduce():
    a, w = data(4, 8), data(8, 3)
    result = Tensor(a).shard(TWO, axis=1) @ Tensor(w).shard(TWO, axis=0)
    assert result.uop.axis is None  # the sum over the split inner axis combined the parts
    np.testing.assert_allclose(result.numpy(), a @ w, rtol=1e-5, atol=1e-5)


# ---- autograd and data-parallel training ----

def test_the_gradient_of_a_replicated_parameter_is_the_sum_over_shards():
    a, w = data(6, 4), data(4, 3)
    single = Tensor(w, requires_grad=True)
    (Tensor(a) @ single).relu().sum().backward()
    sharded = Tensor(w).shard_(TWO).requires_grad_()
    x = Tensor(a).shard(TWO, axis=0)
    (x @ sharded).relu().sum().backward()
    assert sharded.grad is not None and sharded.grad.device == TWO
    assert sharded.grad.uop.axis is None
    assert single.grad is not None
    np.testing.assert_allclose(sharded.grad.numpy(), single.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_the_gradient_of_a_split_input_stays_split():
    a = data(4, 3)
    x = Tensor(a).shard(TWO, axis=0).requires_grad_()
    (x * x).sum().backward()
    assert x.grad is not None and x.grad.uop.axis == 0
    np.testing.assert_allclose(x.grad.numpy(), 2 * a, rtol=1e-6)


def _train(devices: tuple[str, ...] | None, steps: int = 4) -> tuple[list[float], list]:
    Tensor.manual_seed(3)
    layers = [nn.Linear(8, 16), nn.Linear(16, 4)]
    params = get_parameters(layers)
    x_data, y_data = np.random.default_rng(1).standard_normal((2, 16, 8)).astype(np.float32)
    x, y = Tensor(x_data), Tensor(y_data[:, :4].copy())
    if devices is not None:
        for p in params:
            p.shard_(devices)  # the parameters: replicated
        x, y = x.shard(devices, axis=0), y.shard(devices, axis=0)  # the batch: split
    optimizer = nn.optim.SGD(params, lr=0.1, momentum=0.9)
    losses = []
    with Tensor.train():
        for _ in range(steps):
            optimizer.zero_grad()
            loss = ((layers[1](layers[0](x).relu()) - y) ** 2).mean()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses, [p.numpy() for p in params]


@pytest.mark.parametrize("devices", [TWO, ("CPU", "CPU:1", "CPU:2", "CPU:3")],
                         ids=["2 devices", "4 devices"])
def test_data_parallel_sgd_gives_the_single_device_losses(devices):
    one_losses, one_params = _train(None)
    many_losses, many_params = _train(devices)
    assert one_losses[-1] < one_losses[0]  # it trains
    np.testing.assert_allclose(many_losses, one_losses, rtol=1e-5, atol=1e-5)
    for single, sharded in zip(one_params, many_params):
        np.testing.assert_allclose(sharded, single, rtol=1e-5, atol=1e-5)


def test_debug_shows_the_ring_and_kernels_on_both_devices(capsys):
    x = Tensor(data(4, 6)).shard(TWO, axis=0)
    with Context(DEBUG=1):
        x.sum(axis=0).to("CPU:1").realize()
    out = capsys.readouterr().out
    assert "all-reduce (ADD, ring)" in out
    assert "reduce-scatter 1: chunk 0 CPU -> CPU:1" in out
    assert "all-gather 1: chunk 0 CPU:1 -> CPU" in out
    launches = [line.split()[1] for line in out.splitlines() if line.startswith("***")]
    assert "CPU" in launches and "CPU:1" in launches
    assert any("copy CPU -> CPU:1" in line for line in out.splitlines())
    assert any("copy CPU:1 -> CPU" in line for line in out.splitlines())


# ---- what is refused ----

def test_an_uneven_split_is_refused():
    with pytest.raises(ValueError, match="split evenly over 2 devices"):
        Tensor(data(5, 2)).shard(TWO, axis=0)


def test_shard_on_an_axis_that_does_not_exist():
    with pytest.raises(IndexError, match="axis 2 is out of range"):
        Tensor(data(4, 2)).shard(TWO, axis=2)


def test_bad_device_lists_are_refused():
    with pytest.raises(ValueError, match="twice"):
        Tensor(data(4)).shard(("CPU", "CPU:0"))
    with pytest.raises(ValueError, match="tuple of devices"):
        Tensor(data(4)).shard("CPU")
    with pytest.raises(ValueError, match="already sharded"):
        Tensor(data(4)).shard(TWO).shard(TWO)


def test_ops_that_would_mix_the_shards_name_the_op_and_the_axis():
    x = Tensor(data(4, 6)).shard(TWO, axis=0)
    with pytest.raises(ShardingError, match=r"pad \(1, 0\).*axis 0"):
        x.pad(((1, 0), (0, 0)))
    with pytest.raises(ShardingError, match=r"shrink.*axis 0"):
        x[1:3]
    with pytest.raises(ShardingError, match=r"flip.*axis 0"):
        x.flip(0)
    with pytest.raises(ShardingError, match=r"reshape to \(6, 4\).*axis 1"):
        Tensor(data(4, 6)).shard(TWO, axis=1).reshape(6, 4)
    with pytest.raises(ShardingError, match="different axes"):
        x + Tensor(data(4, 6)).shard(TWO, axis=1)


def test_a_sharded_tensor_and_a_single_device_one_do_not_mix():
    x = Tensor(data(4)).shard(TWO, axis=0)
    with pytest.raises(RuntimeError, match="different devices"):
        x + Tensor(data(4))
    with pytest.raises(RuntimeError, match="different devices"):
        x + Tensor(data(4)).shard(("CPU", "CPU:2"), axis=0)


def test_a_gradient_of_a_split_tensor_needs_a_reduce_first():
    x = Tensor(data(4)).shard(TWO, axis=0).requires_grad_()
    with pytest.raises(ShardingError, match="reduce it"):
        (x * 2).backward(gradient=Tensor.ones(4).shard(TWO, axis=0))


def test_code_that_reads_one_graph_is_told_the_tensor_is_sharded():
    # TinyJit and viz read a tensor's one UOp graph; a MultiUOp has one per device
    multi = Tensor(data(4)).shard(TWO, axis=0).uop
    with pytest.raises(OneGraphError, match=r"UOp.op of a tensor sharded over \('CPU', 'CPU:1'\)"):
        _ = multi.op
    assert not hasattr(multi, "toposort")  # (an AttributeError as well)


def test_a_tensor_can_be_sharded_over_devices_of_different_kinds():
    a = data(4, 3)
    t = Tensor(a).shard(("CPU", "NUMPY"), axis=0)
    np.testing.assert_allclose(t.sum(0).numpy(), a.sum(0), rtol=1e-5)
    np.testing.assert_allclose((t * t).sum().item(), (a * a).sum(), rtol=1e-5)


def test_creation_on_a_tuple_of_devices_replicates():
    Tensor.manual_seed(5)
    single = Tensor.rand(3, 4).numpy()
    Tensor.manual_seed(5)
    replicated = Tensor.rand(3, 4, device=TWO)
    assert replicated.device == TWO and replicated.uop.axis is None
    for shard, device in zip(replicated.realize().uop.shards, TWO):  # the same draw on each
        base = base_buffer(shard)
        assert base is not None and base.arg.device == device
        np.testing.assert_array_equal(base.arg.numpy().reshape(3, 4), single)
    np.testing.assert_array_equal(Tensor.arange(1, 7, 2, device=TWO).numpy(), [1, 3, 5])
    np.testing.assert_array_equal(Tensor.eye(3, device=TWO).numpy(), np.eye(3))
    assert Tensor.empty(2, device=TWO).device == TWO
    assert sorted(Tensor.randperm(5, device=TWO).tolist()) == [0, 1, 2, 3, 4]


def test_data_parallel_adam_with_layernorm_and_cross_entropy_gives_one_devices_losses():
    features = np.random.default_rng(2).standard_normal((16, 8)).astype(np.float32)
    labels = np.random.default_rng(3).integers(0, 4, 16).astype(np.int32)

    def train(devices: tuple[str, ...] | None) -> list[float]:
        Tensor.manual_seed(1)
        layers = [nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 4)]
        params = get_parameters(layers)
        x, y = Tensor(features), Tensor(labels)
        if devices is not None:
            for p in params:
                p.shard_(devices)
            x, y = x.shard(devices, axis=0), y.shard(devices, axis=0)
        optimizer = nn.optim.Adam(params, lr=0.01)
        losses = []
        with Tensor.train():
            for _ in range(3):
                optimizer.zero_grad()
                out = layers[2](layers[1](layers[0](x)).gelu())
                loss = out.sparse_categorical_crossentropy(y)
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
        return losses

    np.testing.assert_allclose(train(TWO), train(None), rtol=1e-5, atol=1e-5)


def test_host_data_on_a_tuple_of_devices_is_a_buffer_on_each():
    t = Tensor([1.0, 2.0, 3.0], device=TWO)
    bases = [base_buffer(s) for s in t.uop.shards]
    assert [b.arg.device for b in bases if b is not None] == list(TWO)  # realized, as Tensor(data)
    assert bases[0] is not None and bases[1] is not None and bases[0].arg is not bases[1].arg


def test_equal_graphs_of_constants_get_a_buffer_on_each_device():
    # zeros(3).contiguous() is one node on both devices (hash-consed): each must get its own
    t = Tensor.zeros(3, device=TWO).contiguous().realize()
    bases = [base_buffer(s) for s in t.uop.shards]
    assert [b.arg.device for b in bases if b is not None] == list(TWO)


def test_gradients_flow_back_through_shard_and_through_a_gather():
    a = data(4, 3)
    x = Tensor(a).shard(TWO, axis=0)
    w = Tensor(np.ones(3, dtype=np.float32), requires_grad=True)  # on one device, sharded inside
    (w.shard(TWO) * x).sum().backward()
    assert w.grad is not None and w.grad.device == "CPU"
    np.testing.assert_allclose(w.grad.numpy(), a.sum(0), rtol=1e-5)
    p = Tensor(np.ones(3, dtype=np.float32)).shard_(TWO).requires_grad_()
    ((x * p).to("CPU") ** 2).sum().backward()  # the loss on one device, after a gather
    assert p.grad is not None and p.grad.device == TWO
    np.testing.assert_allclose(p.grad.numpy(), (2 * a * a).sum(0), rtol=1e-5)
