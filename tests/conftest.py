"""Shared pytest fixtures: `device` runs a test once on every available device."""
from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # so test files can `from helpers import ...`

from helpers import test_devices  # noqa: E402

from tinyteach.device import Device  # noqa: E402


@pytest.fixture(params=test_devices())
def device(request: pytest.FixtureRequest) -> Iterator[str]:
    """The device name; Device.DEFAULT is set to it for the test, so tensors created without
    `device=` (and constants inside ops) land there too."""
    previous = Device.DEFAULT
    Device.DEFAULT = request.param
    yield request.param
    Device.DEFAULT = previous
