"""Chapter 1 (part 4): making tensors — constants, ranges and random numbers, on the device.

What this teaches:
- `full`, `zeros` and `ones` are one scalar constant, reshaped and expanded: no memory is filled
  until a kernel reads it; `empty` is a buffer that nothing has written;
- `arange` needs no host data: a running sum of ones gives 0, 1, 2, ...; `linspace` and `eye`
  follow from it;
- random numbers are a hash of (counter, seed): integer xor, multiply and shift, computed by the
  kernels themselves, so a seed gives the same numbers on every device. Uniform floats keep the
  top 24 bits of the hash; normal ones come from two uniforms (Box-Muller); a random
  permutation is the rank of each of n random keys (randperm);
- the seed and the counter live in a small buffer on each device, as in tinygrad, and every
  draw is two kernels: copy the state into a buffer of the draw's own, then add the draw's size
  to the counter in place (an assign). A TinyJit replay runs those kernels again, so each
  replay draws new numbers.

Each part of chapter 1 is a mixin that stands on the ones below it: this one uses only the
core (tensor/core.py), and tensor/__init__.py assembles the parts into Tensor, so `Tensor.zeros(2,
3)` finds the methods here. The methods that make a tensor from nothing are classmethods: `cls` is
the class they are called on (always the assembled Tensor), and they return `Self`.

Builds on: tensor/core.py (part 1). Used by: tensor/movement.py and everything that makes a
tensor.

>>> from tinyteach import Tensor
>>> Tensor.arange(5).tolist()
[0, 1, 2, 3, 4]
>>> Tensor.eye(2).tolist()
[[1.0, 0.0], [0.0, 1.0]]
"""
from __future__ import annotations

import ctypes
import gzip
import math
import urllib.request
from typing import Any, ClassVar, Self, TypeVar, cast

import numpy as np

from tinyteach.device import Buffer, Device
from tinyteach.dtype import DType, dtypes
from tinyteach.helpers import prod
from tinyteach.ir.uop import Ops, UOp, as_sint, shape_str
from tinyteach.tensor.core import ArgumentError, CoreTensor, Scalar, ShapeArg, pool

C = TypeVar("C", bound="TensorCreation")  # the helper functions return what they were given


def _shape_from(args: tuple[Any, ...], symbolic: bool = False) -> tuple[int, ...]:
    """Accept both `f(2, 3)` and `f((2, 3))`. With `symbolic`, a size may be a bound Variable
    (chapter 4b): `Tensor.ones(n)` is a constant expanded to n, which needs no buffer."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    if any(isinstance(s, (tuple, list)) for s in args):
        raise ValueError(f"a shape is ints or one tuple of ints, not {args}")
    if not symbolic and any(isinstance(s, UOp) for s in args):
        raise TypeError(f"sizes here must be ints, not {shape_str(args)}: of the creation "
                        "functions only full, zeros and ones take a Variable")
    shape = tuple(as_sint(s) for s in args)
    if any(isinstance(s, int) and s < 0 for s in shape):
        raise ValueError(f"negative size in shape {shape}")
    return cast(tuple[int, ...], shape)  # (sizes typed int, as UOp.shape's: see there)


class TensorCreation(CoreTensor):
    """full, zeros, ones, empty, arange, linspace, eye and random numbers (part 4)."""

    # the random number generator's state: the seed, and on each device a uint32 buffer
    # [hash of the seed, counter] (the counter wraps after 2^32 numbers)
    _seed: ClassVar[int] = 0
    _rng_states: ClassVar[dict[str, CoreTensor]] = {}

    # ---- constants and ranges ----

    @classmethod
    def full(cls, shape: ShapeArg, fill_value: Scalar, **kwargs: Any) -> Self:
        dims = _shape_from((shape,), symbolic=True)
        dtype = dtypes.as_dtype(kwargs.pop("dtype")) if kwargs.get("dtype") else None
        requires_grad = kwargs.pop("requires_grad", None)
        scalar = cls(fill_value, dtype=dtype, **kwargs)
        result = scalar.reshape((1,) * len(dims)).expand(dims)
        result.requires_grad = requires_grad
        return result

    @classmethod
    def zeros(cls, *shape: Any, **kwargs: Any) -> Self:
        return cls.full(_shape_from(shape, symbolic=True), 0.0, **_float_default(kwargs))

    @classmethod
    def ones(cls, *shape: Any, **kwargs: Any) -> Self:
        return cls.full(_shape_from(shape, symbolic=True), 1.0, **_float_default(kwargs))

    @classmethod
    def empty(cls, *shape: Any, device: str | None = None, dtype: DType | str | None = None,
              **kwargs: Any) -> Self:
        """Memory that is allocated but not set: its contents are undefined (fresh memory is
        zero, reused memory keeps what its last owner wrote; see device.HostMemory)."""
        if isinstance(device, (tuple, list)):  # made on the first device, replicated
            return cls.empty(*shape, device=device[0], dtype=dtype, **kwargs).shard(device)
        dims = _shape_from(shape)
        wanted = dtypes.default_float if dtype is None else dtypes.as_dtype(dtype)
        name = Device.canonicalize(device)
        buffer = UOp(Ops.BUFFER, wanted, (), Buffer(name, prod(dims), wanted))
        return (cls(buffer.reshape(dims), name, **kwargs))

    def full_like(self, fill_value: Scalar, **kwargs: Any) -> Self:
        kwargs.setdefault("dtype", self.dtype)
        kwargs.setdefault("device", self.device)
        return type(self).full(self.shape, fill_value, **kwargs)

    def zeros_like(self, **kwargs: Any) -> Self:
        return self.full_like(0, **kwargs)

    def ones_like(self, **kwargs: Any) -> Self:
        return self.full_like(1, **kwargs)

    def rand_like(self, **kwargs: Any) -> Self:
        kwargs.setdefault("dtype", self.dtype)
        kwargs.setdefault("device", self.device)
        return type(self).rand(*self.shape, **kwargs)

    def randn_like(self, **kwargs: Any) -> Self:
        kwargs.setdefault("dtype", self.dtype)
        kwargs.setdefault("device", self.device)
        return type(self).randn(*self.shape, **kwargs)

    @classmethod
    def arange(cls, start: int | float, stop: int | float | None = None, step: int | float = 1,
               **kwargs: Any) -> Self:
        """start, start+step, ... < stop — built from ones and a running sum, not numpy."""
        if stop is None:
            start, stop = 0, start
        if step == 0:
            raise ValueError("arange step must not be zero")
        count = max(0, math.ceil((stop - start) / step))
        is_int = all(isinstance(v, int) for v in (start, stop, step))
        dtype = kwargs.pop("dtype", None) or (dtypes.default_int if is_int else
                                              dtypes.default_float)
        index = cls._arange_int(count, _first_device(kwargs.get("device")))  # (_with moves it)
        result = (index * step + start) if (step, start) != (1, 0) else index
        return result.cast(dtypes.as_dtype(dtype))._with(**kwargs)

    @classmethod
    def linspace(cls, start: float, stop: float, steps: int, **kwargs: Any) -> Self:
        if steps < 0:
            raise ValueError(f"linspace needs steps >= 0, got {steps}")
        dtype = dtypes.as_dtype(kwargs.pop("dtype", dtypes.default_float))
        if dtype == dtypes.bool:
            raise ArgumentError("linspace has no bool version (PyTorch refuses it too)")
        requires_grad = kwargs.pop("requires_grad", None)  # set on the result, not the arange
        if steps == 1:
            return cls.full((1,), start, dtype=dtype, requires_grad=requires_grad, **kwargs)
        index = cls.arange(steps, **kwargs).cast(dtypes.float64 if dtype == dtypes.float64
                                                    else dtypes.default_float)
        result = (index * ((stop - start) / (steps - 1)) + start).cast(dtype)
        return result._with(requires_grad=requires_grad)

    @classmethod
    def eye(cls, n: int, m: int | None = None, **kwargs: Any) -> Self:
        if n < 0 or (m is not None and m < 0):
            raise ValueError(f"eye needs sizes >= 0, got n={n}, m={m}")
        dtype = dtypes.as_dtype(kwargs.pop("dtype", dtypes.default_float))
        requires_grad = kwargs.pop("requires_grad", None)  # set on the result, not the aranges
        rows = cls.arange(n, **kwargs).reshape(n, 1)
        cols = cls.arange(n if m is None else m, **kwargs).reshape(1, -1)
        return (rows == cols).cast(dtype)._with(requires_grad=requires_grad)

    def _with(self, device: str | None = None, requires_grad: bool | None = None) -> Self:
        result = self if device is None else self.to(device)
        if requires_grad is not None:
            result = type(result)(result.uop, result.device, requires_grad=requires_grad)
        return result

    # ---- from outside: raw memory and URLs (copied into a buffer, as host data always is) ----

    @classmethod
    def from_blob(cls, ptr: int, shape: ShapeArg, **kwargs: Any) -> Self:
        """A tensor holding a copy of prod(shape) elements of `dtype` (default float32) read
        from host memory at address `ptr`. (tinygrad's shares the memory with no copy; here
        the values are copied once, so later writes to the memory are not seen.)"""
        dims = _shape_from((shape,))
        dtype = dtypes.as_dtype(kwargs.pop("dtype", dtypes.default_float))
        if not isinstance(ptr, int) or ptr <= 0:
            raise ValueError(f"from_blob needs a non-null integer address, got {ptr!r}")
        raw = ctypes.string_at(ptr, prod(dims) * dtype.itemsize)   # a copy of the bytes
        values = np.frombuffer(raw, dtype=dtype.np).reshape(dims)
        return (cls(values, dtype=dtype, **kwargs))

    @classmethod
    def from_url(cls, url: str, gunzip: bool = False, **kwargs: Any) -> Self:
        """The bytes at `url` (http(s):// or file://) as a uint8 tensor, gunzipped if asked."""
        with urllib.request.urlopen(url, timeout=60) as response:
            data = response.read()
        return (cls(gzip.decompress(data) if gunzip else data, **kwargs))

    # ---- random numbers: a counter-based hash, computed on the device itself ----

    @classmethod
    def manual_seed(cls, seed: int = 0) -> None:
        """Make random numbers reproducible: the same seed gives the same numbers on every
        device, because they come from integer arithmetic that every device does exactly.
        The state buffers are rewritten in place, so a TinyJit captured before starts over
        too."""
        TensorCreation._seed = int(seed)
        for device, state in TensorCreation._rng_states.items():
            state.assign(cls._first_state(device)).realize()

    @classmethod
    def _first_state(cls, device: str) -> Self:
        # 0x6A09E667 (from sqrt(2)) moves seed 0 off the hash's fixed point hash(0) == 0
        seed_key = _hash32_int(TensorCreation._seed ^ 0x6A09E667)
        return cls([seed_key, 0], device, dtype=dtypes.uint32, requires_grad=False)

    @classmethod
    def _draw_state(cls, count: int, device: str) -> Self:
        """[seed key, first counter] for a draw of `count` numbers, in a buffer of its own, and
        the device's counter advanced by `count`: both computed now, by kernels (so a TinyJit
        records and replays them), and never overwritten later, however lazily the random
        numbers themselves are computed."""
        state = TensorCreation._rng_states.get(device)
        if state is None:
            state = TensorCreation._rng_states[device] = cls._first_state(device)
        mine = state.contiguous().realize()
        step = cls([0, count & 0xFFFFFFFF], device, dtype=dtypes.uint32, requires_grad=False)
        state.assign(state + step).realize()
        return mine  # type: ignore[return-value]

    @classmethod
    def _random_bits(cls, count: int, device: str | None) -> Self:
        """`count` pseudo-random uint32s: hash(counter, seed), lowbias32 by Chris Wellons. On
        a tuple of devices: drawn on the first, and replicated (every device the same bits)."""
        if isinstance(device, (tuple, list)):
            return cls._random_bits(count, device[0]).shard(device)
        name = Device.canonicalize(device)
        state = cls._draw_state(count, name)
        counter = cls._arange_int(count, name).cast(dtypes.uint32)
        seed_key, start = state._row(0), state._row(1)
        key = _hash32(seed_key ^ start)
        return _hash32((counter ^ key) * 0x9E3779B9)

    @classmethod
    def rand(cls, *shape: Any, device: str | None = None, dtype: DType | str | None = None,
             requires_grad: bool | None = None) -> Self:
        """Uniform in [0, 1)."""
        dims = _shape_from(shape)
        wanted = dtypes.default_float if dtype is None else dtypes.as_dtype(dtype)
        bits = cls._random_bits(prod(dims), device)
        # the top 24 bits, scaled to [0, 1): exactly representable in float32
        uniform = bits._binary(Ops.IDIV, 256).cast(dtypes.float32) * (1.0 / (1 << 24))
        result = uniform.cast(wanted).reshape(dims)
        result.requires_grad = requires_grad
        return result

    @classmethod
    def randn(cls, *shape: Any, dtype: DType | str | None = None, requires_grad: bool | None = None,
              **kwargs: Any) -> Self:
        """Standard normal, by the Box-Muller transform of two uniforms."""
        dims = _shape_from(shape)
        wanted = dtypes.default_float if dtype is None else dtypes.as_dtype(dtype)
        u = cls.rand(2, *dims, **kwargs)
        radius = ((1 - u._row(0)).log2() * math.log(2) * -2).sqrt()  # sqrt(-2 ln u0)
        angle = (math.pi / 2) - u._row(1) * (2 * math.pi)  # cos(2 pi u1) = sin(pi/2 - 2 pi u1)
        result = (radius * angle.sin()).cast(wanted)
        result.requires_grad = requires_grad
        return result

    @classmethod
    def uniform(cls, *shape: Any, low: float = 0.0, high: float = 1.0, **kwargs: Any) -> Self:
        requires_grad = kwargs.pop("requires_grad", None)
        result = cls.rand(*shape, **kwargs) * (high - low) + low
        result.requires_grad = requires_grad
        return result

    @classmethod
    def normal(cls, *shape: Any, mean: float = 0.0, std: float = 1.0, **kwargs: Any) -> Self:
        requires_grad = kwargs.pop("requires_grad", None)
        result = cls.randn(*shape, **kwargs) * std + mean
        result.requires_grad = requires_grad
        return result

    @classmethod
    def kaiming_uniform(cls, *shape: Any, a: float = 0.01, **kwargs: Any) -> Self:
        dims = _shape_from(shape)
        bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(prod(dims[1:]))
        return cls.uniform(*dims, low=-bound, high=bound, **kwargs)

    @classmethod
    def glorot_uniform(cls, *shape: Any, **kwargs: Any) -> Self:
        dims = _shape_from(shape)
        bound = math.sqrt(6 / (dims[0] + prod(dims[1:])))
        return cls.uniform(*dims, low=-bound, high=bound, **kwargs)

    @classmethod
    def scaled_uniform(cls, *shape: Any, **kwargs: Any) -> Self:
        """Uniform in [-1, 1), scaled by 1 / sqrt(number of elements) (tinygrad's)."""
        dims = _shape_from(shape)
        scale = prod(dims) ** -0.5 if prod(dims) else 1.0
        return cls.uniform(*dims, low=-scale, high=scale, **kwargs)

    @classmethod
    def kaiming_normal(cls, *shape: Any, a: float = 0.01, **kwargs: Any) -> Self:
        """Normal with std = sqrt(2 / (1 + a^2)) / sqrt(fan_in), fan_in = prod(shape[1:]):
        PyTorch's kaiming_normal_ for a leaky_relu of slope a (tinygrad's default a)."""
        dims = _shape_from(shape)
        std = math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(max(prod(dims[1:]), 1))
        return cls.normal(*dims, mean=0.0, std=std, **kwargs)

    @classmethod
    def xavier_uniform(cls, *shape: Any, gain: float = 1.0, **kwargs: Any) -> Self:
        """PyTorch's xavier_uniform_: bound gain * sqrt(6 / (fan_in + fan_out)), with
        fan_in = shape[1] * r and fan_out = shape[0] * r, r = prod(shape[2:]) (the receptive
        field). (tinygrad's glorot_uniform counts prod(shape[1:]) as fan_in instead.)"""
        dims = _shape_from(shape)
        if len(dims) < 2:
            raise ValueError(f"xavier_uniform needs at least 2 dimensions, got shape {dims}")
        receptive = prod(dims[2:])
        bound = gain * math.sqrt(6 / ((dims[0] + dims[1]) * receptive))
        return cls.uniform(*dims, low=-bound, high=bound, **kwargs)

    @classmethod
    def randperm(cls, n: int, device: str | None = None, dtype: DType | str = dtypes.int32,
                 requires_grad: bool | None = None) -> Self:
        """A random permutation of 0..n-1: give each position a random 32-bit key; a key's rank
        (how many keys are smaller, ties broken by position) is the permutation, and every
        permutation is equally likely. n^2 comparisons, all in one reduction kernel."""
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"randperm needs a non-negative int n, got {n!r}")
        if requires_grad:
            raise TypeError("randperm gives integers, which cannot require gradients")
        if isinstance(device, (tuple, list)):  # drawn on the first device, replicated
            return cls.randperm(n, device=device[0], dtype=dtype).shard(device)
        name = Device.canonicalize(device)
        keys = cls._random_bits(n, name)
        position = cls._arange_int(n, name)
        mine, theirs = keys.reshape(n, 1), keys.reshape(1, n)
        before = (theirs < mine) | ((theirs == mine) & (position.reshape(1, n) <
                                                        position.reshape(n, 1)))
        return before.cast(dtypes.int32).sum(1).cast(dtypes.as_dtype(dtype))

    @classmethod
    def _arange_int(cls, count: int, device: str) -> Self:
        """0, 1, ..., count-1 as int32, from primitive ops only.
        Small: a running sum of ones (cumsum). Large: i*b + j from two smaller aranges."""
        if count <= 32:
            ones = cls.ones(count, dtype=dtypes.int32, device=device)
            if not count:
                return ones
            windows = pool(ones.pad([(count - 1, 0)]), (count,))  # window i: i+1 ones
            return windows.sum(-1, dtype=dtypes.int32) - 1
        columns = math.isqrt(count - 1) + 1
        rows = -(-count // columns)
        grid = (cls._arange_int(rows, device) * columns).reshape(rows, 1) + \
            cls._arange_int(columns, device).reshape(1, columns)
        return grid.reshape(-1).shrink([(0, count)])

    # ---- properties and in-place changes (tinygrad's names; tensor/__init__.py has the rest) ----

    def element_size(self) -> int:
        """Bytes per element."""
        return self.dtype.itemsize

    def nbytes(self) -> int:
        """Bytes the tensor's values take: numel * element_size."""
        return prod(self.shape) * self.dtype.itemsize

    def is_floating_point(self) -> bool:
        return dtypes.is_float(self.dtype)

    def short(self) -> Self:
        return self.cast(dtypes.int16)

    def data(self) -> memoryview:
        """The values, computed, as a memoryview with the tensor's shape and format (as
        tinygrad's; `.numpy()` gives an array)."""
        return self.numpy().data

    def replace(self, x: Self) -> Self:
        """Make this tensor be `x` (same shape and dtype): its graph, its value. In place."""
        tensor = self
        if x.shape != tensor.shape or x.dtype != tensor.dtype:
            raise ValueError(f"replace: {x.shape} {x.dtype} does not match {tensor.shape} "
                             f"{tensor.dtype}")
        if x.device != tensor.device:
            raise ValueError(f"replace: x is on {x.device}, this tensor on {tensor.device}; "
                             f"move it with .to() first")
        tensor.uop, tensor._lazy = x.uop, x._lazy
        return tensor

    def to_(self, device: str) -> Self:
        """Move this tensor to `device`, in place (`to` returns a new tensor)."""
        tensor = self
        moved = tensor.to(device)
        tensor.uop, tensor.device, tensor._lazy = moved.uop, moved.device, None
        return tensor

def _first_device(device: Any) -> str:
    """The device to make a tensor on: `device`, or the first of a tuple of devices (the
    caller then replicates it with `.to(devices)`)."""
    return Device.canonicalize(device[0] if isinstance(device, (tuple, list)) else device)


def _float_default(kwargs: dict[str, Any]) -> dict[str, Any]:
    kwargs.setdefault("dtype", dtypes.default_float)
    return kwargs


def _hash32_int(x: int) -> int:
    """lowbias32 on a Python int (for the key, computed once on the host)."""
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def _hash32(x: C) -> C:
    """lowbias32 on a uint32 tensor: xor, multiply and shift (a shift is a division by 2^k)."""
    x = x ^ x._binary(Ops.IDIV, 1 << 16)
    x = x * 0x7FEB352D
    x = x ^ x._binary(Ops.IDIV, 1 << 15)
    x = x * 0x846CA68B
    return x ^ x._binary(Ops.IDIV, 1 << 16)
