"""Chapter 1 (part 4): making tensors — constants, ranges and random numbers, on the device.

What this teaches:
- `full`, `zeros` and `ones` are one scalar constant, reshaped and expanded: no memory is filled
  until a kernel reads it; `empty` is a buffer that nothing has written;
- `arange` needs no host data: a running sum of ones gives 0, 1, 2, ...; `linspace` and `eye`
  follow from it;
- random numbers are tinygrad's, bit for bit: a counter-based generator. Threefry-2x32 is a
  small block cipher (32-bit additions, xors and rotations): scrambling the numbers 0, 1, 2, ...
  under a key gives bits that look random. The n-th number depends only on (key, n), not on
  the numbers before it, so every element is computed on its own, in parallel, by the
  kernels themselves, and a seed reproduces them on every device. Each device holds its key
  [hash of its place, seed] and a 64-bit counter in small buffers; a draw of n numbers takes
  the counter's value c and advances it by n: its own key is threefry(c), and its numbers are
  threefry(0 .. n-1) under that key. A TinyJit replay runs the counter's kernels again, so
  each replay draws new numbers;
- bits become floats without arithmetic: 23 random bits under the exponent of 1.0 are a float
  in [1, 2), minus 1 in [0, 1). uniform scales and shifts them (rounded once, as tinygrad's
  fused multiply-add), normal ones come from two uniforms (Box-Muller; its cos and log are
  each device's own, so randn agrees with tinygrad to about 1e-6, not bit for bit).

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
import hashlib
import math
import time
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

    # the random number generator's state, tinygrad's: the seed (the clock's, until
    # manual_seed), and on each device a key, uint32 [key0, key1], and a 64-bit counter,
    # uint32 [low, high]; plus the devices drawn from since the seed, in order (a device's
    # key depends on its place), and the place each device's key was written for
    _seed: ClassVar[int] = int(time.time())
    _device_seeds: ClassVar[dict[str, TensorCreation]] = {}
    _device_rng_counters: ClassVar[dict[str, TensorCreation]] = {}
    _devices_since_seed: ClassVar[list[str]] = []
    _key_positions: ClassVar[dict[str, int]] = {}

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

    # ---- random numbers: tinygrad's generator, threefry2x32 of counters ----

    @classmethod
    def manual_seed(cls, seed: int = 0) -> None:
        """Make random numbers reproducible: after `manual_seed(n)` the same calls give the
        same numbers, tinygrad's own, on every device. As in tinygrad, every device starts
        over: the first device drawn from gets key [hash of 0, n], the second [hash of 1, n],
        and each counter restarts at 0. The state buffers are rewritten in place, so a TinyJit
        captured before starts over too."""
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"manual_seed takes an int, not {type(seed).__name__} {seed!r}")
        TensorCreation._seed = seed
        # a guess at the order the devices will be drawn from (see _next_counter): the order of
        # the last seed's draws, which a TinyJit replay repeats without running the Python
        previous = TensorCreation._devices_since_seed
        TensorCreation._devices_since_seed = []
        order = list(dict.fromkeys([*previous, *TensorCreation._device_seeds]))
        for position, device in enumerate(order):
            cls._write_rng_state(device, position)

    @classmethod
    def _write_rng_state(cls, device: str, position: int) -> None:
        """Device `device`'s key is [low 32 bits of sha256(position), seed] (tinygrad's), its
        counter [0, 0]; existing buffers are overwritten in place."""
        digest = hashlib.sha256(position.to_bytes(4, "big")).digest()
        key = [int.from_bytes(digest, "big") & 0xFFFFFFFF, TensorCreation._seed & 0xFFFFFFFF]
        seeds = cls(key, device, dtype=dtypes.uint32, requires_grad=False)
        counter = cls([0, 0], device, dtype=dtypes.uint32, requires_grad=False)
        if device in TensorCreation._device_seeds:
            TensorCreation._device_seeds[device].assign(seeds).realize()
            TensorCreation._device_rng_counters[device].assign(counter).realize()
        else:
            TensorCreation._device_seeds[device] = seeds.realize()
            TensorCreation._device_rng_counters[device] = counter.realize()
        TensorCreation._key_positions[device] = position

    @classmethod
    def _next_counter(cls, device: str, count: int) -> tuple[Self, Self]:
        """(key, counter) for a draw of `count` 32-bit numbers on `device`, and the device's
        counter advanced by `count`. The counter is copied into a buffer of the draw's own and
        advanced now, by kernels (a TinyJit captures and replays them), so the draw's numbers
        are fixed here, however lazily they are computed later."""
        order = TensorCreation._devices_since_seed
        if device not in order:  # the device's first draw since the seed: it takes the next key
            order.append(device)
            if TensorCreation._key_positions.get(device) != len(order) - 1:
                cls._write_rng_state(device, len(order) - 1)
        counter = TensorCreation._device_rng_counters[device]
        mine = counter.contiguous().realize()
        # the count is data, not a constant of the kernel: one kernel advances the counter for
        # draws of every size (a constant made one per size, each compiled: a model of 10
        # layers waited 0.45 s on gcc before its first step)
        words = cls([count & 0xFFFFFFFF, count >> 32], device, dtype=dtypes.uint32,
                    requires_grad=False)
        counter.assign(_add_uint64(counter, words)).realize()
        return TensorCreation._device_seeds[device], mine  # type: ignore[return-value]

    @classmethod
    def _random_bits(cls, key: Self, counter: Self, count: int) -> Self:
        """`count` random uint32s (tinygrad's random_bits): the draw's own key is
        threefry(counter; key), and the bits are threefry(j, j + half; that key) for
        j = 0 .. half-1, half = ceil(count / 2): first every first word, then every second."""
        if count >= 0xFFFFFFFF:  # tinygrad splits such a draw in parts; 16 GiB fits no test here
            raise ValueError(f"a draw of {count} random 32-bit words is too large (at most "
                             f"{0xFFFFFFFF - 1})")
        draw_key = _threefry2x32(counter._row(0), counter._row(1), key._row(0), key._row(1))
        half = -(-count // 2)
        j = cls._arange_int(half, key.device).cast(dtypes.uint32).reshape(1, half)
        first, second = _threefry2x32(j, j + half, *draw_key)
        lane = cls._arange_int(2, key.device).reshape(2, 1)
        words = (lane == 0).where(first, second)  # (2, half): row 0 the first words
        return words.reshape(2 * half).shrink([(0, count)])

    @classmethod
    def _random_floats(cls, shape: tuple[int, ...], dtype: DType, device: str) -> Self:
        """Uniform floats in [0, 1) of `dtype` (tinygrad's _rand): random mantissa bits under
        the exponent of 1.0 give a float in [1, 2); minus 1 (exact) gives [0, 1)."""
        words = -(-prod(shape) * dtype.itemsize // 4)
        key, counter = cls._next_counter(device, words)
        bits = cls._random_bits(key, counter, words)
        as_float = _FLOAT_FROM_BITS[dtype.itemsize](bits, dtype)
        return (as_float - 1).shrink([(0, prod(shape))]).reshape(shape)

    @classmethod
    def rand(cls, *shape: Any, device: str | None = None, dtype: DType | str | None = None,
             contiguous: bool = True, requires_grad: bool | None = None) -> Self:
        """Uniform in [0, 1), tinygrad's numbers. On a tuple of devices: drawn on the first,
        and replicated (every device the same numbers)."""
        dims = _shape_from(shape)
        wanted = dtypes.default_float if dtype is None else dtypes.as_dtype(dtype)
        if wanted not in _FLOAT_LAYOUT:
            raise ArgumentError(f"rand makes floats (float16, bfloat16, float32, float64), "
                                f"not {wanted.name}")
        if isinstance(device, (tuple, list)):
            drawn = cls.rand(*dims, device=device[0], dtype=wanted, contiguous=contiguous)
            return drawn.shard(device)._with(requires_grad=requires_grad)
        result = cls._random_floats(dims, wanted, Device.canonicalize(device))
        result = result.contiguous() if contiguous else result
        result.requires_grad = requires_grad
        return result

    @classmethod
    def randn(cls, *shape: Any, dtype: DType | str | None = None, requires_grad: bool | None = None,
              **kwargs: Any) -> Self:
        """Standard normal, by the Box-Muller transform of two uniforms u0, u1 (float32):
        cos(2 pi u0) * sqrt(-2 ln(1 - u1)), tinygrad's formula, op for op."""
        dims = _shape_from(shape)
        wanted = dtypes.default_float if dtype is None else dtypes.as_dtype(dtype)
        u = cls.rand(2, *dims, dtype=dtypes.float32, **kwargs)
        # cos x = sin(pi/2 - x), and pi/2 - 2 pi u0 rounded once, as tinygrad's kernel fuses it
        cosine = _multiply_add(u._row(0), -2 * math.pi, math.pi / 2).sin()
        radius = ((1 - u._row(1)).log2() * math.log(2) * -2).sqrt()  # ln y = log2(y) ln 2
        result = (cosine * radius).cast(wanted)
        result.requires_grad = requires_grad
        return result

    @classmethod
    def uniform(cls, *shape: Any, low: float = 0.0, high: float = 1.0,
                dtype: DType | str | None = None, **kwargs: Any) -> Self:
        """Uniform in [low, high): (high - low) * rand, cast to dtype, + low (tinygrad's)."""
        if not low < high:
            raise ValueError(f"uniform needs low < high, got low={low}, high={high}")
        requires_grad = kwargs.pop("requires_grad", None)
        wanted = dtypes.default_float if dtype is None else dtypes.as_dtype(dtype)
        u = cls.rand(*shape, **kwargs)
        if u.dtype == wanted == dtypes.float32:  # tinygrad's kernel fuses it: one rounding
            result = _multiply_add(u, high - low, low)
        else:
            result = ((high - low) * u).cast(wanted) + low
        result.requires_grad = requires_grad
        return result

    @classmethod
    def randint(cls, *shape: Any, low: int = 0, high: int = 10, dtype: DType | str = dtypes.int32,
                **kwargs: Any) -> Self:
        """Uniform integers in [low, high): uniform floats cast to the integer dtype, which
        truncates (tinygrad's: float32, so a range wider than 2^24 skips values)."""
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high)):
            raise TypeError(f"randint needs integer bounds, got low={low!r}, high={high!r}")
        wanted = dtypes.as_dtype(dtype)
        if not dtypes.is_int(wanted):
            raise TypeError(f"randint makes integers, not {wanted.name}")
        if low >= high:
            raise ValueError(f"randint needs low < high, got low={low}, high={high}")
        return cls.uniform(*shape, low=low, high=high, dtype=wanted, **kwargs)

    @classmethod
    def normal(cls, *shape: Any, mean: float = 0.0, std: float = 1.0, **kwargs: Any) -> Self:
        if std < 0:
            raise ValueError(f"normal needs std >= 0, got std={std}")
        requires_grad = kwargs.pop("requires_grad", None)
        result = std * cls.randn(*shape, **kwargs) + mean
        result.requires_grad = requires_grad
        return result

    @classmethod
    def kaiming_uniform(cls, *shape: Any, a: float = 0.01, **kwargs: Any) -> Self:
        """Uniform in +-sqrt(6 / (1 + a^2) / fan_in), fan_in = prod(shape[1:]): PyTorch's
        kaiming_uniform_ for a leaky_relu of slope a (tinygrad's default a)."""
        dims = _shape_from(shape)
        bound = (6 / (1 + a ** 2) / max(prod(dims[1:]), 1)) ** 0.5  # tinygrad's arithmetic
        return cls.uniform(*dims, low=-bound, high=bound, **kwargs)

    @classmethod
    def glorot_uniform(cls, *shape: Any, **kwargs: Any) -> Self:
        dims = _shape_from(shape)
        bound = (6 / max(dims[0] + prod(dims[1:]), 1)) ** 0.5
        return cls.uniform(*dims, low=-bound, high=bound, **kwargs)

    @classmethod
    def scaled_uniform(cls, *shape: Any, **kwargs: Any) -> Self:
        """Uniform in [-1, 1), times 1 / sqrt(number of elements) (tinygrad's)."""
        dims = _shape_from(shape)
        return cls.uniform(*dims, low=-1.0, high=1.0, **kwargs) * max(prod(dims), 1) ** -0.5

    @classmethod
    def kaiming_normal(cls, *shape: Any, a: float = 0.01, **kwargs: Any) -> Self:
        """Normal with std = sqrt(2 / (1 + a^2) / fan_in), fan_in = prod(shape[1:]):
        PyTorch's kaiming_normal_ for a leaky_relu of slope a (tinygrad's default a)."""
        dims = _shape_from(shape)
        std = (2 / (1 + a ** 2) / max(prod(dims[1:]), 1)) ** 0.5
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


# ---- threefry2x32 and the bits -> float step, on uint32 tensors ----

THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))  # bits rotated in rounds 1-4, 5-8
THREEFRY_PARITY = 0x1BD11BDA  # the key schedule's third word is key0 ^ key1 ^ this


def _threefry2x32(x0: C, x1: C, key0: C, key1: C) -> tuple[C, C]:
    """Threefry-2x32 with 20 rounds (Salmon et al., "Parallel random numbers: as easy as
    1, 2, 3", SC 2011): a block cipher that scrambles the two 32-bit words (x0, x1) under
    the key (key0, key1), with nothing but 32-bit additions, xors and rotations. A round
    adds the words, rotates the second and xors the sum into it; every 4 rounds a word of
    the key schedule is added in. Written as tinygrad's decomp.threefry2x32, step for step.
    Any shapes that broadcast; every value a uint32."""
    schedule = (key1, key0 ^ key1 ^ THREEFRY_PARITY, key0)  # tinygrad's order of the words
    x0, x1 = x0 + schedule[2], x1 + schedule[0]
    for block in range(5):
        for rotation in THREEFRY_ROTATIONS[block % 2]:
            x0, x1 = _threefry_round(x0, x1, rotation)
        x0 = x0 + schedule[block % 3]
        x1 = x1 + schedule[(block + 1) % 3] + (block + 1)
    return x0, x1


def _threefry_round(x0: C, x1: C, rotation: int) -> tuple[C, C]:
    total = x0 + x1
    return total, total ^ _rotate_left(x1, rotation)


def _rotate_left(x: C, bits: int) -> C:
    """(x << bits) | (x >> (32 - bits)) for a uint32 x: the shifts are a multiplication and
    a division by powers of two (a uint32 product wraps, as a left shift does); their bits
    do not overlap, so tinygrad's + is the same as |."""
    return x * (1 << bits) + x._binary(Ops.IDIV, 1 << (32 - bits))


def _add_uint64(counter: C, count: C) -> C:
    """The 64-bit counter [low, high] (two uint32 words) plus `count` (the same two words),
    with the carry."""
    low, high = counter._row(0), counter._row(1)
    new_low = low + count._row(0)
    carry = (new_low < low).cast(dtypes.uint32)
    new_high = high + count._row(1) + carry
    return new_low.reshape(1).pad([(0, 1)]) + new_high.reshape(1).pad([(1, 0)])


# dtype -> (mantissa bits, the bits of 1.0): a float in [1, 2) is 1.0's bits with random
# mantissa bits
_FLOAT_LAYOUT = {dtypes.float16: (10, 0x3C00), dtypes.bfloat16: (7, 0x3F80),
                 dtypes.float32: (23, 0x3F800000), dtypes.float64: (52, 0x3FF0000000000000)}


def _bitcast(x: C, dtype: DType) -> C:
    return x._apply(x.uop.bitcast(dtype), x)


def _floats_from_words(bits: C, dtype: DType) -> C:
    """float32: each 32-bit word's top 23 bits under 1.0's exponent, read as a float."""
    mantissa, one = _FLOAT_LAYOUT[dtype]
    return _bitcast(bits._binary(Ops.IDIV, 1 << (32 - mantissa)) | one, dtype)


def _floats_from_half_words(bits: C, dtype: DType) -> C:
    """float16 and bfloat16: each word is two 16-bit numbers, the low half first (the bytes
    of little-endian memory, as tinygrad's bitcast to uint16 reads them)."""
    mantissa, one = _FLOAT_LAYOUT[dtype]
    count = bits.shape[0]
    low, high = bits & 0xFFFF, bits._binary(Ops.IDIV, 1 << 16)
    lane = bits._arange_int(2, bits.device).reshape(1, 2)
    halves = (lane == 0).where(low.reshape(count, 1), high.reshape(count, 1)).reshape(2 * count)
    pattern = halves._binary(Ops.IDIV, 1 << (16 - mantissa)) | one
    return _bitcast(pattern.cast(dtypes.uint16), dtype)


def _floats_from_word_pairs(bits: C, dtype: DType) -> C:
    """float64: each pair of words (low first) is one 64-bit number, of which the top 52
    bits are kept."""
    mantissa, one = _FLOAT_LAYOUT[dtype]
    pairs = bits.cast(dtypes.uint64).reshape(-1, 2)
    whole = _column(pairs, 0) + _column(pairs, 1) * (1 << 32)
    return _bitcast(whole._binary(Ops.IDIV, 1 << (64 - mantissa)) | one, dtype)


def _column(x: C, i: int) -> C:
    return x.shrink([None, (i, i + 1)]).reshape(x.shape[0])


# float size in bytes -> how 32-bit words become floats in [1, 2)
_FLOAT_FROM_BITS = {2: _floats_from_half_words, 4: _floats_from_words,
                    8: _floats_from_word_pairs}


# ---- a * x + b rounded once, from operations that each round ----

def _multiply_add(x: C, scale: float, offset: float) -> C:
    """scale * x + offset for a float32 x, rounded once (a fused multiply-add), as tinygrad's
    kernels compute uniform numbers: its compiler fuses the two (MULACC). tinyteach rounds
    each operation, as numpy does, so this computes the exact value in pieces and rounds it
    once: the product is p + p_low exactly (Dekker: numbers of 12 significant bits multiply
    without rounding), the sum of p, p_low and offset is a rounded w plus exact leftovers
    (error-free additions), and w is right unless the exact value lies just past a halfway
    point that w rounded away from. Only additions of exact terms and exact products: a
    device that fuses some of them itself gives the same bits. (Checked against
    long-double arithmetic for all 2^23 uniform floats: tests/test_random.py.)"""
    scale_high, scale_low = _float32_halves(scale)
    x_high = _bitcast(_bitcast(x, dtypes.uint32) & 0xFFFFF000, dtypes.float32)
    x_low = x - x_high
    product = x * scale
    product_low = (((x_high * scale_high - product) + x_high * scale_low) + x_low * scale_high
                   ) + x_low * scale_low
    total, total_error = _two_sum(product, x._const(offset))
    leftover, leftover_error = _two_sum(total_error, product_low)
    rounded, rounding_error = _two_sum(total, leftover)
    neighbour = rounded + 2 * rounding_error  # the float on the other side of the halfway point
    halfway = (rounding_error != 0) & ((neighbour - rounded) == 2 * rounding_error)
    past_halfway = halfway & (leftover_error != 0) & ((leftover_error > 0) == (rounding_error > 0))
    return past_halfway.where(neighbour, rounded)


def _two_sum(a: C, b: C) -> tuple[C, C]:
    """(a + b rounded, its rounding error), both exact: a + b == sum + error (Knuth)."""
    total = a + b
    b_part = total - a
    return total, (a - (total - b_part)) + (b - b_part)


def _float32_halves(value: float) -> tuple[float, float]:
    """value as float32, split into two floats of at most 12 significant bits each."""
    whole = np.float32(value)
    high = np.array(whole).view(np.uint32) & np.uint32(0xFFFFF000)
    high_value = np.array(high, np.uint32).view(np.float32)
    return float(high_value), float(whole - high_value)
