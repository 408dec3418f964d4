"""Each dtype exists once (dtype._InternedDType): equal dtypes are the same object, so they
hash and compare by identity, and pickle, copy and vec() hand back that object."""
import copy
import dataclasses
import pickle

import numpy as np
import pytest

from tinyteach.dtype import ALL_DTYPES, DType, dtypes, least_upper_dtype
from tinyteach.ir.uop import UOp

SCALARS = sorted(set(ALL_DTYPES.values()))
VECTORS = [d.vec(n) for d in SCALARS for n in (2, 4, 16)]
EVERY = SCALARS + VECTORS


def _fields(dtype: DType) -> tuple:
    return (dtype.priority, dtype.itemsize, dtype.name, dtype.kind, dtype.count)


def test_building_a_dtype_again_returns_the_same_object():
    for dtype in EVERY:
        assert DType(*_fields(dtype)) is dtype
    assert DType(11, 4, "float32", "float") is dtypes.float32
    assert DType(priority=5, itemsize=4, name="int32", kind="int") is dtypes.int32


def test_vec_and_scalar_return_interned_objects():
    for dtype in SCALARS:
        assert dtype.vec(4) is dtype.vec(4)
        assert dtype.vec(4).scalar is dtype
        assert dtype.vec(4).itemsize == 4 * dtype.itemsize and dtype.vec(4).count == 4
    assert dtypes.float32.vec(4) is not dtypes.float32.vec(8)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_pickle_returns_the_interned_object(protocol):
    for dtype in EVERY:
        assert pickle.loads(pickle.dumps(dtype, protocol)) is dtype
    nested = {"weights": [dtypes.half, dtypes.float32.vec(4)]}
    assert pickle.loads(pickle.dumps(nested, protocol))["weights"][1] is dtypes.float32.vec(4)


def test_copy_deepcopy_and_replace_return_the_interned_object():
    for dtype in EVERY:
        assert copy.copy(dtype) is dtype
        assert copy.deepcopy(dtype) is dtype
        assert copy.deepcopy([dtype, (dtype,)])[1][0] is dtype
    assert dataclasses.replace(dtypes.int32, name="int32") is dtypes.int32


def test_dtypes_stay_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        dtypes.float32.name = "float64"  # type: ignore[misc]


def test_hash_and_eq_across_every_dtype():
    for a in EVERY:
        for b in EVERY:
            same_fields = _fields(a) == _fields(b)
            assert (a == b) is same_fields and (a != b) is not same_fields
            if same_fields:
                assert hash(a) == hash(b)
    assert len({hash(d) for d in EVERY}) == len(EVERY)
    assert dtypes.float32 != "float32" and dtypes.int32 != 5 and dtypes.bool != False  # noqa: E712


def test_dtypes_as_dict_keys():
    table = {dtype: dtype.name for dtype in EVERY}
    assert len(table) == len(EVERY)
    for dtype in EVERY:
        assert table[DType(*_fields(dtype))] == dtype.name
        assert table[pickle.loads(pickle.dumps(dtype))] == dtype.name
    assert dtypes.half in table and dtypes.double in table


def test_ordering_follows_the_lattice_priority():
    assert sorted([dtypes.float32, dtypes.int8, dtypes.bool]) == [dtypes.bool, dtypes.int8,
                                                                    dtypes.float32]
    assert least_upper_dtype(dtypes.int8, dtypes.uint8) is dtypes.int16
    assert max(dtypes.float16, dtypes.bfloat16) is dtypes.bfloat16


def test_numpy_round_trip_is_the_interned_object():
    for name in ("bool", "int8", "uint16", "int64", "float16", "float32", "float64"):
        assert dtypes.from_np(np.dtype(name)) is ALL_DTYPES[name]
        assert dtypes.as_dtype(name) is ALL_DTYPES[name]


def test_nodes_built_with_a_pickled_dtype_are_shared():
    rebuilt = pickle.loads(pickle.dumps(dtypes.float32))
    assert UOp.const(rebuilt, 1.5) is UOp.const(dtypes.float32, 1.5)
    node = UOp.const(dtypes.int32, 3)
    assert node.op is UOp.const(dtypes.int32, 3).op and node.dtype is dtypes.int32
    assert (node.arg, node.src) == (3, ())
    assert UOp.const(dtypes.float32, 0.0) is not UOp.const(dtypes.float32, -0.0)


def test_a_node_built_without_the_dataclass_init_is_a_whole_frozen_node():
    node = UOp.const(dtypes.float32, 2.0)
    assert {f.name: getattr(node, f.name) for f in dataclasses.fields(UOp)} == {
        "op": node.op, "dtype": dtypes.float32, "src": (), "arg": 2.0}
    assert node.replace(dtype=dtypes.float16).dtype is dtypes.float16
    with pytest.raises(dataclasses.FrozenInstanceError):
        node.arg = 3.0  # type: ignore[misc]
    added = node + node
    assert added.src == (node, node) and added.dtype is dtypes.float32 and added.arg is None
