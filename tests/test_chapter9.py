"""Facts chapter 9 states about devices and runtimes, checked against the library: the host pool
saves page faults, and on OPENCL copies are schedule items, memory is never shared with the host,
a launch returns before the kernel ends, reading a buffer waits, and events time the device."""
from __future__ import annotations

import gc
import re
import resource

import numpy as np
import pytest

from tinyteach import Tensor
from tinyteach.device import Backend, Buffer, Device, HostMemory
from tinyteach.dtype import dtypes
from tinyteach.engine.realize import get_runner
from tinyteach.engine.schedule import create_schedule
from tinyteach.runtime import opencl

cl = opencl.cl
needs_opencl = pytest.mark.skipif(not Device.is_available("OPENCL"),
                                  reason=f"OPENCL: {Device.why_unavailable('OPENCL')}")


def page_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def faults_of_first_copy(size: int, data: np.ndarray) -> tuple[int, int]:
    """(page faults of the copy into a new buffer, its memory's address)."""
    buffer = Buffer("CPU", size, dtypes.float32)
    before = page_faults()
    buffer.copyin(data)
    return page_faults() - before, buffer.storage.address


def test_reused_host_memory_takes_fewer_page_faults_than_fresh_memory(monkeypatch):
    size = (16 << 20) + 17  # 64 MB, of a size no other test uses: memory fresh from the system
    data = np.ones(size, dtype=np.float32)
    # an empty pool: buffers other tests of this worker left there could fill its limit, and
    # then the freed 64 MB would go back to the system (both copies faulted alike in CI)
    monkeypatch.setattr(HostMemory, "pool", {})
    monkeypatch.setattr(HostMemory, "pooled_bytes", 0)
    fresh_faults, fresh_address = faults_of_first_copy(size, data)
    gc.collect()
    reused_faults, reused_address = faults_of_first_copy(size, data)
    gc.collect()
    assert reused_address == fresh_address
    assert reused_faults < fresh_faults


def buffer_of(tensor: Tensor) -> Buffer:
    node = tensor.uop
    while node.op.name == "RESHAPE":
        node = node.src[0]
    return node.arg


@needs_opencl
def test_to_opencl_and_back_are_copy_items_around_the_kernel():
    host = Tensor(np.arange(6, dtype=np.float32))
    round_trip = (host.to("OPENCL") * 2).to("CPU")
    items, _ = create_schedule([round_trip.uop], "CPU")
    assert [(item.kind, item.device) for item in items] == \
        [("copy", "OPENCL"), ("kernel", "OPENCL"), ("copy", "CPU")]
    np.testing.assert_equal(round_trip.numpy(), np.arange(6) * 2)


@needs_opencl
def test_a_cpu_tensor_and_its_opencl_copy_never_share_memory():
    on_host = Tensor(np.arange(4, dtype=np.float32)).realize()
    on_device = on_host.to("OPENCL").realize()
    assert isinstance(buffer_of(on_device).storage, cl.Buffer)
    buffer_of(on_host).copyin(np.full(4, -1, dtype=np.float32))
    np.testing.assert_equal(on_device.numpy(), np.arange(4, dtype=np.float32))
    np.testing.assert_equal(on_host.numpy(), np.full(4, -1, dtype=np.float32))


def opencl_matmul(size: int) -> tuple:
    """A built matmul kernel on OPENCL, its schedule item and the numpy inputs."""
    rng = np.random.default_rng(1)
    left_data = rng.standard_normal((size, size)).astype(np.float32)
    right_data = rng.standard_normal((size, size)).astype(np.float32)
    left, right = Tensor(left_data, device="OPENCL"), Tensor(right_data, device="OPENCL")
    (item,), _ = create_schedule([(left @ right).uop], "OPENCL")
    return get_runner(item), item, left_data @ right_data


@needs_opencl
def test_a_launch_returns_an_event_that_synchronize_completes_and_a_read_waits_for_it():
    runner, item, expected = opencl_matmul(256)
    event = runner.program(*item.buffers)
    assert isinstance(event, cl.Event)
    product = item.output.numpy()  # no synchronize: the read waits (in-order queue)
    np.testing.assert_allclose(product.reshape(expected.shape), expected, rtol=1e-4, atol=1e-3)
    second = runner.program(*item.buffers)
    Device["OPENCL"].synchronize()
    assert second.command_execution_status == cl.command_execution_status.COMPLETE


@needs_opencl
def test_a_profiling_queue_on_the_backends_context_times_the_same_kernel():
    runner, item, expected = opencl_matmul(128)
    backend = Device["OPENCL"]
    queue = cl.CommandQueue(backend.context, backend.cl_device,
                            properties=cl.command_queue_properties.PROFILING_ENABLE)
    runner.program.kernel.set_args(*(buffer.storage for buffer in item.buffers))
    event = cl.enqueue_nd_range_kernel(queue, runner.program.kernel, runner.program.global_size,
                                       runner.program.local_size)
    event.wait()
    stamps = event.profile
    assert stamps.queued <= stamps.submit <= stamps.start < stamps.end
    product = np.empty(expected.size, dtype=np.float32)
    cl.enqueue_copy(queue, product, item.output.storage, is_blocking=True)
    np.testing.assert_allclose(product.reshape(expected.shape), expected, rtol=1e-4, atol=1e-3)


@needs_opencl
def test_an_opencl_program_launches_with_the_sizes_its_spec_records():
    rng = np.random.default_rng(2)
    x_data = rng.standard_normal((16, 64)).astype(np.float32)
    w_data = rng.standard_normal(64).astype(np.float32)
    result = ((Tensor(x_data, device="OPENCL") * Tensor(w_data, device="OPENCL")).sum(1) + 1).relu()
    (item,), _ = create_schedule([result.uop], "OPENCL")
    spec = get_runner(item).spec
    assert spec is not None
    source = spec.source
    built = Device["OPENCL"].compiler.compile(source)
    assert isinstance(built.program, cl.Program) and built.program.kernel_names == item.name
    program = Device["OPENCL"].load_program(spec, built)
    launch = re.match(r"// launch: global (\(.*?\)) local (\(.*?\))", source)
    assert launch is not None
    assert (str(program.global_size), str(program.local_size)) == launch.groups()
    program(*item.buffers)
    np.testing.assert_allclose(item.output.numpy(), np.maximum((x_data * w_data).sum(1) + 1, 0),
                               rtol=1e-5, atol=1e-5)


def test_host_devices_have_nothing_to_synchronize():
    """Their work is done when a call returns: synchronize is the Backend's no-op."""
    for name in ("NUMPY", "CPU"):
        assert type(Device[name]).synchronize is Backend.synchronize
