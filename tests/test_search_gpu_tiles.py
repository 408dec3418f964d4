"""BEAM (opt/search.py) with the GPU options the heuristic starts from: a local tile's neighbours
are other tile sizes and no tile, tensor cores' neighbour is the kernel without them (each a valid
KernelOptions: a search on OPENCL from a local tile used to fail building an upcast of a tile)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

from test_backends import gpu_device  # noqa: E402

from tinyteach import Context, Tensor, clear_caches  # noqa: E402
from tinyteach.codegen.plan import KernelOptions  # noqa: E402
from tinyteach.opt import search  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_caches(tmp_path, monkeypatch):
    monkeypatch.setattr(search, "beam_cache_dir", lambda: tmp_path / "beam")
    clear_caches()
    yield
    clear_caches()


def test_neighbours_of_a_local_tile_and_of_tensor_cores():
    assert search.neighbours(KernelOptions(local_tile=16), (32, 32)) == \
        [KernelOptions(local_tile=8), KernelOptions()]
    assert search.neighbours(KernelOptions(local_tile=4), (32, 32)) == \
        [KernelOptions(local_tile=8), KernelOptions()]
    assert search.neighbours(KernelOptions(tensor_core=True), (32, 32)) == [KernelOptions()]


@pytest.mark.parametrize("device", [gpu_device("OPENCL")])
def test_beam_on_a_matmul_that_starts_from_a_local_tile(device, monkeypatch):
    visited: list[KernelOptions] = []
    original = search.neighbours

    def recording(options, *args, **kwargs):
        visited.append(options)
        return original(options, *args, **kwargs)
    monkeypatch.setattr(search, "neighbours", recording)
    a = np.random.default_rng(0).normal(size=(32, 32)).astype(np.float32)
    with Context(BEAM=1):
        got = (Tensor(a, device=device) @ Tensor(a, device=device)).numpy()
    np.testing.assert_allclose(got, a @ a, rtol=1e-4, atol=1e-4)
    assert visited[0] == KernelOptions(local_tile=16, tile_upcast=2)  # the heuristic's start
