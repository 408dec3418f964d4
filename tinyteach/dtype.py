"""Chapter 1 (part 2): dtypes — what a number is stored as, and how mixed dtypes promote.

What this teaches:
- a dtype is a name, a size in bytes and a kind (bool, signed int, unsigned int, float);
- mixing dtypes follows a promotion lattice (tinygrad's): bool < int8 < int16 < ... < float64,
  and an operation takes the least dtype both operands can be promoted to;
- a Python scalar adapts to the tensor it meets (`int_tensor * 2` stays int,
  `int_tensor * 0.5` becomes `dtypes.default_float`);
- bfloat16 is the top half of a float32: the same sign and 8 exponent bits, 7 of the 23
  mantissa bits. numpy has no such type, so its host format is the 16-bit word (uint16
  storage, tagged so that it is not mistaken for uint16); `to_bfloat16_bits` rounds float32
  to the nearest word (ties to even), `from_bfloat16_bits` shifts a word back into a float32.
  Arithmetic on bfloat16 is computed in float32 and rounded back, as tinygrad and PyTorch do.

Used by every later chapter: the IR carries a dtype on every node and each renderer turns
it into its language's type name.

>>> least_upper_dtype(dtypes.int8, dtypes.uint8)
dtypes.short
>>> least_upper_dtype(dtypes.int32, dtypes.float16)
dtypes.half
"""
from __future__ import annotations

import builtins  # inside `dtypes`, the names bool/int/float are dtypes
import math
from dataclasses import dataclass
from typing import Final, Literal

import numpy as np

from tinyteach.settings import DEFAULT_FLOAT

Kind = Literal["bool", "int", "uint", "float"]


class _InternedDType(type):
    """Interning: `DType(...)` returns the one existing dtype with those fields, so equal
    dtypes are the same object. A dtype sits in the key of every UOp and of many caches;
    being unique, it can hash and compare by identity (`object.__hash__`, `object.__eq__`: C
    slots, where a Python `__hash__` cost a Python call on every node built)."""

    interned: dict[tuple, DType] = {}

    def __call__(cls, priority: int, itemsize: int, name: str, kind: Kind,
                 count: int = 1) -> DType:
        key = (priority, itemsize, name, kind, count)
        found = _InternedDType.interned.get(key)
        if found is None:
            found = _InternedDType.interned[key] = super().__call__(*key)
        return found


@dataclass(frozen=True, order=True)
class DType(metaclass=_InternedDType):
    """A scalar type: `priority` orders the lattice, `itemsize` is in bytes. `count` > 1 makes
    it a vector of that many lanes (only the kernel optimizer makes those: `float32.vec(16)`).
    Each dtype exists once (`_InternedDType`), so `==` is `is`."""

    priority: int
    itemsize: int
    name: str
    kind: Kind
    count: int = 1

    # identity, not the dataclass's field tuples: interning makes equal fields the same object
    __hash__ = object.__hash__
    __eq__ = object.__eq__

    def __reduce__(self) -> tuple:
        """Pickle and copy rebuild a dtype through `DType(...)`, which hands back the interned
        object (the default would make a second, unequal object with the same fields)."""
        return (DType, (self.priority, self.itemsize, self.name, self.kind, self.count))

    def __copy__(self) -> DType:
        return self

    def __deepcopy__(self, memo: dict) -> DType:
        return self

    def vec(self, count: int) -> DType:
        """A vector of `count` lanes of this scalar type (one SIMD register's worth)."""
        return DType(self.priority, self.itemsize * count, f"{self.name}x{count}", self.kind, count)

    @property
    def scalar(self) -> DType:
        """The type of one lane."""
        if self.count == 1:
            return self
        return DType(self.priority, self.itemsize // self.count, self.name.split("x")[0],
                     self.kind)

    def __repr__(self) -> str:
        """tinygrad's spelling, C's short names: dtypes.float, dtypes.uchar, dtypes.half;
        a vector is dtypes.float.vec(4)."""
        if self.count > 1:
            return f"{self.scalar!r}.vec({self.count})"
        return f"dtypes.{SHORT_NAMES.get(self.name, self.name)}"

    @property
    def np(self) -> np.dtype:
        """The matching numpy dtype (numpy is the reference and the host format); bfloat16's
        is its 16-bit word, uint16 tagged as bfloat16 (`BFLOAT16_WORDS`)."""
        if self.scalar.name == "bfloat16":
            return BFLOAT16_WORDS
        return np.dtype("bool" if self.kind == "bool" else self.scalar.name)

    @property
    def min(self) -> float | int | bool:
        if self.kind == "float":
            return -math.inf
        if self.kind == "bool":
            return False
        return int(np.iinfo(self.np).min)

    @property
    def max(self) -> float | int | bool:
        if self.kind == "float":
            return math.inf
        if self.kind == "bool":
            return True
        return int(np.iinfo(self.np).max)


# the names tinygrad prints a dtype by (its repr): C's, where C has one
SHORT_NAMES = {"int8": "char", "uint8": "uchar", "int16": "short", "uint16": "ushort",
               "int32": "int", "uint32": "uint", "int64": "long", "uint64": "ulong",
               "float16": "half", "float32": "float", "float64": "double"}


class dtypes:
    """All the dtypes, by name, and the questions asked about them."""

    bool: Final = DType(0, 1, "bool", "bool")
    int8: Final = DType(1, 1, "int8", "int")
    uint8: Final = DType(2, 1, "uint8", "uint")
    int16: Final = DType(3, 2, "int16", "int")
    uint16: Final = DType(4, 2, "uint16", "uint")
    int32: Final = DType(5, 4, "int32", "int")
    uint32: Final = DType(6, 4, "uint32", "uint")
    int64: Final = DType(7, 8, "int64", "int")
    uint64: Final = DType(8, 8, "uint64", "uint")
    float16: Final = DType(9, 2, "float16", "float")
    bfloat16: Final = DType(10, 2, "bfloat16", "float")
    float32: Final = DType(11, 4, "float32", "float")
    float64: Final = DType(12, 8, "float64", "float")
    half, float, double = float16, float32, float64
    int, uint = int32, uint32
    # C's names, as tinygrad spells them too
    char, uchar, short, ushort = int8, uint8, int16, uint16
    long, ulong = int64, uint64
    default_float: DType = float32
    default_int: DType = int32

    @staticmethod
    def is_float(dtype: DType) -> builtins.bool:
        return dtype.kind == "float"

    @staticmethod
    def is_int(dtype: DType) -> builtins.bool:
        return dtype.kind in ("int", "uint")

    @staticmethod
    def is_unsigned(dtype: DType) -> builtins.bool:
        return dtype.kind == "uint"

    @staticmethod
    def min(dtype: DType) -> builtins.float | builtins.int | builtins.bool:
        """The smallest value of `dtype` (tinygrad's `dtypes.min(dtypes.int)`)."""
        return dtype.min

    @staticmethod
    def max(dtype: DType) -> builtins.float | builtins.int | builtins.bool:
        """The largest value of `dtype`."""
        return dtype.max

    @staticmethod
    def from_py(value: object) -> DType:
        """The dtype a Python scalar (or nested list of them) gets on its own."""
        if isinstance(value, (list, tuple)):
            if not value:
                return dtypes.default_float
            return max(dtypes.from_py(item) for item in value)
        if isinstance(value, (bool, np.bool_)):
            return dtypes.bool
        if isinstance(value, (int, np.integer)):
            return dtypes.default_int
        return dtypes.default_float

    @staticmethod
    def from_np(dtype: np.dtype) -> DType:
        if is_bfloat16_words(dtype):
            return dtypes.bfloat16
        name = "bool" if dtype == np.bool_ else np.dtype(dtype).name
        if name not in ALL_DTYPES:
            raise TypeError(f"numpy dtype {dtype} has no tinyteach dtype; use one of "
                            f"{sorted(ALL_DTYPES)}")
        return ALL_DTYPES[name]

    @staticmethod
    def as_dtype(value: DType | str | type | np.dtype) -> DType:
        """Accept a DType, a name ("float32"), a numpy dtype or a Python type (float is
        float64, int int64, as in numpy and PyTorch)."""
        if isinstance(value, DType):
            return value
        if isinstance(value, str):
            # a name of dtypes: "float32", or an alias tinygrad uses ("float", "half", "uchar")
            found = ALL_DTYPES.get(value, getattr(dtypes, value, None) if value else None)
            if not isinstance(found, DType):
                raise UnknownDTypeError(f"unknown dtype {value!r}; use one of "
                                        f"{sorted(ALL_DTYPES)}")
            return found
        return dtypes.from_np(np.dtype(value))

    @staticmethod
    def named(name: str | DType) -> DType:
        """A dtype from its name in any case ("HALF", "float16"), as the DEFAULT_FLOAT setting
        is written."""
        if isinstance(name, DType):
            return name
        found = getattr(dtypes, str(name).lower(), None)
        if not isinstance(found, DType):
            raise ValueError(f"unknown dtype {name!r}; use one of {sorted(ALL_DTYPES)}")
        return found


class UnknownDTypeError(TypeError, AttributeError):
    """A dtype name that dtypes does not have: TypeError here, AttributeError in tinygrad
    (which looks the name up as an attribute of dtypes)."""


ALL_DTYPES: dict[str, DType] = {
    d.name: d for d in vars(dtypes).values() if isinstance(d, DType)
}

# Each dtype promotes directly to these (tinygrad's lattice). The least upper bound of two
# dtypes is the smallest dtype both can reach.
PROMOTES_TO: dict[DType, tuple[DType, ...]] = {
    dtypes.bool: (dtypes.int8, dtypes.uint8),
    dtypes.int8: (dtypes.int16,), dtypes.int16: (dtypes.int32,),
    dtypes.int32: (dtypes.int64,), dtypes.int64: (dtypes.float16, dtypes.bfloat16),
    dtypes.uint8: (dtypes.int16, dtypes.uint16), dtypes.uint16: (dtypes.int32, dtypes.uint32),
    dtypes.uint32: (dtypes.int64, dtypes.uint64), dtypes.uint64: (dtypes.float16, dtypes.bfloat16),
    dtypes.float16: (dtypes.float32,), dtypes.bfloat16: (dtypes.float32,),
    dtypes.float32: (dtypes.float64,),
    dtypes.float64: (),
}


# ---- bfloat16: float32's top 16 bits, kept as words in numpy ----

# numpy has no bfloat16: a bfloat16 array on the host is an array of its 16-bit words, uint16
# with a tag (numpy keeps a dtype's metadata through copies and views, and == still says uint16)
BFLOAT16_WORDS: np.dtype = np.dtype(np.uint16, metadata={"tinyteach": "bfloat16"})


def is_bfloat16_words(dtype: np.dtype) -> builtins.bool:
    """Is this numpy dtype bfloat16's host format (uint16 tagged as bfloat16)?"""
    metadata = getattr(dtype, "metadata", None)
    return metadata is not None and metadata.get("tinyteach") == "bfloat16"


def to_bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """float32 values -> bfloat16 words, rounded to the nearest (ties to even), as PyTorch and
    tinygrad round. Adding 0x7FFF plus the lowest kept bit to the 32-bit pattern carries into
    the kept half exactly when the dropped half is more than half way (or half way with an odd
    kept half). A NaN stays a NaN (its quiet bit is set, so rounding cannot turn it into inf)."""
    shape = np.shape(values)  # (ascontiguousarray makes a 0-d array 1-d)
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).reshape(shape)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> 16
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    words = np.where(nan, (bits >> np.uint32(16)) | np.uint32(0x40), rounded)
    return words.astype(np.uint16).astype(BFLOAT16_WORDS)


def from_bfloat16_bits(words: np.ndarray) -> np.ndarray:
    """bfloat16 words -> float32 values (exact: the word becomes the float's top half)."""
    shape = np.shape(words)
    wide = np.ascontiguousarray(words).view(np.uint16).astype(np.uint32) << np.uint32(16)
    return wide.view(np.float32).reshape(shape)


def _reachable(dtype: DType) -> set[DType]:
    reached = {dtype}
    for parent in PROMOTES_TO[dtype]:
        reached |= _reachable(parent)
    return reached


def least_upper_dtype(*ds: DType) -> DType:
    """The smallest dtype every one of `ds` promotes to."""
    common = set.intersection(*(_reachable(d) for d in ds))
    return min(common)


def least_upper_float(dtype: DType) -> DType:
    """Float ops (exp, sqrt, division) on ints compute in the default float."""
    return dtype if dtypes.is_float(dtype) else dtypes.default_float


def truncate_to(dtype: DType, value: float | int | bool) -> float | int | bool:
    """A Python scalar as the given dtype would store it (wrapping ints, rounding floats)."""
    if dtype.kind == "bool":
        return bool(value)
    if dtype == dtypes.bfloat16:
        return float(from_bfloat16_bits(to_bfloat16_bits(np.array(value, dtype=np.float32))))
    if dtype.kind == "float":
        with np.errstate(over="ignore"):  # a value beyond the dtype's range is stored as +-inf
            return float(np.array(value, dtype=np.float64).astype(dtype.np))
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"cannot store {value} in {dtype}")
    bits = 8 * dtype.itemsize
    wrapped = int(value) % (1 << bits)
    if dtype.kind == "int" and wrapped >= 1 << (bits - 1):
        wrapped -= 1 << bits
    return wrapped


def float_to_int(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Floats converted to the integer type `dtype` as a CAST converts them on every device:
    toward zero, saturated to the type's range, NaN -> 0 (float32 1e10 -> uint32 is
    4294967295, -1e10 -> 0, inf -> the largest value): OpenCL's `convert_int_sat_rtz`, Rust's
    and Java's `as`. C leaves a value outside the range undefined, and there numpy's own
    `astype` changes with the CPU (its SIMD loops and its scalar ones differ), so it is only
    asked for values inside.

    The comparisons are made in float64, which holds every float16, float32 and float64 value
    exactly, against two limits that are exact there too: the type's smallest value (0 or
    -2**(bits-1)) and its largest plus one (a power of two; int64's largest, 2**63 - 1, is no
    float64, so a value is compared with 2**63 and the largest is chosen by a `where`).
    Used by the NUMPY and PYTHON devices (runtime/numpy.py) and by constant folding."""
    info = np.iinfo(dtype)
    low, high = float(info.min), float(info.max + 1)  # (both exact: powers of two, or 0)
    with np.errstate(invalid="ignore"):  # (some numpy builds warn when a NaN is compared)
        wide = np.asarray(values, dtype=np.float64)
        below, above = wide < low, wide >= high
        inside = (wide >= low) & (wide < high)  # NaN is neither inside nor outside: 0
        converted = np.where(inside, wide, 0.0).astype(dtype)
    converted = np.where(below, np.array(info.min, dtype), converted)
    return np.where(above, np.array(info.max, dtype), converted)


def _set_default_float(name: str | DType) -> None:
    """DEFAULT_FLOAT=HALF (environment) or `Context(DEFAULT_FLOAT=dtypes.half)`: the dtype that
    float data and float results of integer ops get. An empty name keeps float32."""
    wanted = dtypes.float32 if name == "" else dtypes.named(name)
    if not dtypes.is_float(wanted):
        raise ValueError(f"DEFAULT_FLOAT must be a float dtype, not {wanted.name}")
    dtypes.default_float = wanted


DEFAULT_FLOAT.watch(_set_default_float)


# ---- PyTorch's dtypes (tinygrad's names; torch is imported only when asked) ----

def _to_torch_dtype(dtype: DType) -> object:
    """The torch dtype holding `dtype` (torch.float32 for dtypes.float), through numpy's
    dtype, the one mapping torch promises; bfloat16 has no numpy dtype, so it is named."""
    import torch  # noqa: PLC0415  (optional: only for code that talks to PyTorch)
    if dtype.scalar == dtypes.bfloat16:
        return torch.bfloat16
    return torch.from_numpy(np.empty(0, dtype=dtype.scalar.np)).dtype


def _from_torch_dtype(torch_dtype: object) -> DType:
    """The dtype for a torch dtype, as tinygrad's runtime.md uses it:
    `Tensor.from_blob(t.data_ptr(), t.shape, dtype=_from_torch_dtype(t.dtype))`."""
    for dtype in ALL_DTYPES.values():
        if _to_torch_dtype(dtype) == torch_dtype:
            return dtype
    raise TypeError(f"torch dtype {torch_dtype} has no tinyteach dtype; use one of "
                    f"{sorted(ALL_DTYPES)}")
