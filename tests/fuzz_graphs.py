"""A differential fuzzer: random graphs of tensor ops, run on every device, compared with NUMPY.

Each graph starts from one to three random inputs and applies a few random steps: elementwise
ops (with broadcasting), movement ops (reshape, permute, pad, shrink, flip, expand), reductions
and high-level ops (softmax, matmul, cumsum, cat, layernorm). About one graph in five is on
int32 instead of float32 (integer +, *, //, %, max, comparisons, argmax).

About two inputs in five carry special values: NaN, ±inf, -0.0, huge (1e30 or -1e30, one sign
per graph) and subnormal (±1e-40) floats, or the int32 limits (which wrap on overflow, and
INT_MIN // -1). The float ops include unbounded ones (log, sqrt and 1/x of anything, so NaN,
±inf and the sign of zero reach the output); the ops that bound their inputs (exp of tanh, ...)
stay as they were.

A graph is first built on NUMPY, the reference; its recipe (the list of steps) is then replayed
on each device and the results compared. NaN must be where the reference has NaN and
infinities must be equal; other floats use a tolerance scaled to the result's largest finite
value; integers and bools must be equal.

    python tests/fuzz_graphs.py --graphs 1000            # every available device
    python tests/fuzz_graphs.py --graphs 50 --devices OPENCL --seed 7 --verbose
    python tests/fuzz_graphs.py --graphs 500 --devices CPU --vector-width 2   # vector tiles

tests/test_backends.py runs a fixed-seed slice of it.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tinyteach import Tensor  # noqa: E402
from tinyteach.device import Device  # noqa: E402

Step = tuple[str, tuple[int, ...], tuple[Any, ...]]  # (op name, value indices, parameters)


# ---- the ops a step may apply: name -> function(values, params) -> Tensor ----

def _axis_ops() -> dict[str, Callable[..., Tensor]]:
    return {
        "sum": lambda x, axis, keep: x.sum(axis=axis, keepdim=keep),
        "max": lambda x, axis, keep: x.max(axis=axis, keepdim=keep),
        "min": lambda x, axis, keep: x.min(axis=axis, keepdim=keep),
        "mean": lambda x, axis, keep: x.mean(axis=axis, keepdim=keep),
    }


FLOAT_UNARY: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": lambda x: x.relu(),
    "neg": lambda x: -x,
    "exp": lambda x: x.tanh().exp(),  # bounded inputs keep values finite
    "log": lambda x: (x.abs() + 0.5).log(),
    "sqrt": lambda x: x.abs().sqrt(),
    "sin": lambda x: (x.tanh() * 3).sin(),  # sin of a huge number differs between libms
    "sigmoid": lambda x: x.sigmoid(),
    "reciprocal": lambda x: (x.abs() + 0.5).reciprocal(),
    "gelu": lambda x: x.tanh().gelu(),
    "square": lambda x: x.tanh() * x,
    "clip": lambda x: x.clip(-0.5, 0.75),
    "log_raw": lambda x: x.log(),  # NaN below 0, -inf at 0 (either sign)
    "sqrt_raw": lambda x: x.sqrt(),
    "reciprocal_raw": lambda x: x.reciprocal(),  # the sign of zero matters: 1/-0.0 is -inf
    "is_nan": lambda x: (x != x).where(-1.0, x),
}
FLOAT_BINARY: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b.tanh(),
    "div": lambda a, b: a / (b.abs() + 0.5),
    "maximum": lambda a, b: a.maximum(b),
    "minimum": lambda a, b: a.minimum(b),
    "where": lambda a, b: (a < b).where(a, b * 2),
    "equal": lambda a, b: (a == b).where(a, -b),
    "greater_equal": lambda a, b: (a >= b).where(b, a),
}
INT_UNARY: dict[str, Callable[[Tensor], Tensor]] = {
    "neg": lambda x: -x,
    "abs": lambda x: x.abs(),
    "floordiv_const": lambda x: x // 3,
    "mod_const": lambda x: x % -4,
    "relu": lambda x: x.relu(),
}
INT_BINARY: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: (a % 50) * b,
    "floordiv": lambda a, b: a // b,  # dividing by 0 gives 0 on every device
    "mod": lambda a, b: a % b,
    "maximum": lambda a, b: a.maximum(b),
    "where": lambda a, b: (a < b).where(a, b),
    "xor": lambda a, b: a ^ b,
    "mul_wrap": lambda a, b: a * b,  # overflows and wraps, as numpy's int32 does
    "not_equal": lambda a, b: (a != b).where(a, b),
}


@dataclass
class Graph:
    """A recipe: inputs (numpy arrays) and steps; the result is the last value."""

    inputs: list[np.ndarray]
    steps: list[Step] = field(default_factory=list)
    is_int: bool = False
    huge_sign: float = 1.0  # the sign of every huge input value (see random_input)

    def build(self, device: str) -> list[Tensor]:
        """Every value the steps compute (not the inputs), realized together."""
        values: list[Tensor] = []
        for name, sources, params in self.steps:
            if name == "input":
                values.append(Tensor(self.inputs[params[0]], device=device))
            else:
                values.append(apply_step(name, [values[i] for i in sources], params,
                                         self.is_int))
        results = [v for v, step in zip(values, self.steps) if step[0] != "input"]
        Tensor.realize(*results)  # one schedule for all: values shared between results
        return results

    def describe(self) -> str:
        lines = []
        for k, (name, sources, params) in enumerate(self.steps):
            if name == "input":
                lines.append(f"v{k} = input{self.inputs[params[0]].shape}")
            else:
                arguments = ", ".join([f"v{i}" for i in sources] + [repr(p) for p in params])
                lines.append(f"v{k} = {name}({arguments})")
        return f"({'int32' if self.is_int else 'float32'}) " + "; ".join(lines)


def apply_step(name: str, sources: list[Tensor], params: tuple[Any, ...], is_int: bool) -> Tensor:
    unary = INT_UNARY if is_int else FLOAT_UNARY
    binary = INT_BINARY if is_int else FLOAT_BINARY
    if name in unary and len(sources) == 1 and not params:
        return unary[name](sources[0])
    if name in binary and len(sources) == 2:
        return binary[name](sources[0], sources[1])
    x = sources[0]
    if name in _axis_ops():
        return _axis_ops()[name](x, *params)
    movement: dict[str, Callable[..., Tensor]] = {
        "reshape": lambda shape: x.reshape(shape),
        "permute": lambda order: x.permute(order),
        "pad": lambda padding: x.pad(padding),
        "shrink": lambda bounds: x.shrink(bounds),
        "flip": lambda axes: x.flip(axes),
        "expand": lambda shape: x.expand(shape),
        "stride": lambda axis: x[(slice(None),) * axis + (slice(None, None, 2),)],
        "softmax": lambda axis: x.softmax(axis),
        "log_softmax": lambda axis: x.log_softmax(axis),
        "layernorm": lambda axis: x.layernorm(axis),
        "cumsum": lambda axis: x.cumsum(axis),
        "argmax": lambda axis: x.argmax(axis),
        "cat": lambda axis: Tensor.cat(x, sources[1], dim=axis),
        "matmul": lambda: x @ sources[1],
        "contiguous": lambda: x.contiguous(),
    }
    return movement[name](*params)


# ---- generating a random graph ----

def random_shape(rng: np.random.Generator) -> tuple[int, ...]:
    ndim = int(rng.integers(1, 5))
    return tuple(int(s) for s in rng.integers(1, 7, size=ndim))


FLOAT_SPECIALS = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e30, 1e-40, -1e-40],
                          dtype=np.float32)
HUGE = 1e30  # its square overflows to inf; sums of a few of them do not
_INT32 = np.iinfo(np.int32)
INT_SPECIALS = np.array([_INT32.min, _INT32.max, _INT32.min + 1, _INT32.max - 1, 0, -1],
                        dtype=np.int32)


def random_input(rng: np.random.Generator, shape: tuple[int, ...], is_int: bool,
                 huge_sign: float = 1.0) -> np.ndarray:
    """Uniform values; two inputs in five have a quarter of their elements replaced by special
    values. The huge ones have one sign in a whole graph: a sum of 1e30, x and -1e30 is x or 0
    depending on the order of the additions, which each device may choose."""
    if is_int:
        values = rng.integers(-20, 21, size=shape).astype(np.int32)
    else:
        values = rng.uniform(-2, 2, size=shape).astype(np.float32)
    if rng.random() < 0.4:
        specials = INT_SPECIALS if is_int else FLOAT_SPECIALS * np.where(
            FLOAT_SPECIALS == HUGE, np.float32(huge_sign), np.float32(1))
        chosen = rng.random(size=shape) < 0.25
        values[chosen] = rng.choice(specials, size=int(chosen.sum()))
    return values


def broadcast_partner(rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts with `shape`: some axes set to 1, sometimes fewer axes."""
    partner = tuple(1 if rng.random() < 0.3 else s for s in shape)
    drop = int(rng.integers(0, len(shape) + 1)) if rng.random() < 0.3 else 0
    return partner[drop:]


def random_step(rng: np.random.Generator, graph: Graph, values: list[Tensor]) -> Step:
    """One valid step on the current values (their shapes decide what is valid)."""
    index = len(values) - 1 if rng.random() < 0.7 else int(rng.integers(0, len(values)))
    x = values[index]
    shape, ndim = x.shape, len(x.shape)
    unary = INT_UNARY if graph.is_int else FLOAT_UNARY
    binary = INT_BINARY if graph.is_int else FLOAT_BINARY
    kinds = ["unary", "binary", "movement", "movement", "reduce", "high"]
    kind = kinds[int(rng.integers(0, len(kinds)))]
    if ndim == 0:
        kind = "unary" if rng.random() < 0.5 else "binary"
    if kind == "unary":
        return (str(rng.choice(sorted(unary))), (index,), ())
    if kind == "binary":
        partner = broadcast_partner(rng, shape)
        if rng.random() < 0.5:  # broadcast against a fresh input
            fresh = add_input(graph, values, random_input(rng, partner, graph.is_int,
                                                              graph.huge_sign))
            order = (index, fresh) if rng.random() < 0.5 else (fresh, index)
            return (str(rng.choice(sorted(binary))), order, ())
        other = int(rng.integers(0, len(values)))
        if values[other].shape != shape:
            other = index  # x op x: still a binary op, with shared loads
        order = (index, other) if rng.random() < 0.5 else (other, index)
        return (str(rng.choice(sorted(binary))), order, ())
    axis = int(rng.integers(0, ndim))
    if kind == "reduce":
        names = sorted(_axis_ops()) if not graph.is_int else ["sum", "max", "min"]
        axes = axis if rng.random() < 0.7 else tuple(range(ndim))
        return (str(rng.choice(names)), (index,), (axes, bool(rng.random() < 0.5)))
    if kind == "high":
        return _high_level_step(rng, graph, values, index, axis)
    return _movement_step(rng, index, shape, axis)


def add_input(graph: Graph, values: list[Tensor], array: np.ndarray) -> int:
    """A new input, as a step of its own; returns its value index."""
    graph.inputs.append(array)
    graph.steps.append(("input", (), (len(graph.inputs) - 1,)))
    values.append(Tensor(array, device="NUMPY"))
    return len(values) - 1


def _movement_step(rng: np.random.Generator, index: int, shape: tuple[int, ...],
                   axis: int) -> Step:
    ndim = len(shape)
    choice = int(rng.integers(0, 7))
    if choice == 0:
        size = int(np.prod(shape))
        first = int(rng.choice([d for d in range(1, size + 1) if size % d == 0]))
        return ("reshape", (index,), ((first, size // first),))
    if choice == 1:
        return ("permute", (index,), (tuple(int(a) for a in rng.permutation(ndim)),))
    if choice == 2:
        padding = tuple((int(rng.integers(0, 3)), int(rng.integers(0, 3))) for _ in shape)
        return ("pad", (index,), (padding,))
    if choice == 3:
        bounds = []
        for size in shape:
            start = int(rng.integers(0, size))
            bounds.append((start, int(rng.integers(start + 1, size + 1))))
        return ("shrink", (index,), (tuple(bounds),))
    if choice == 4:
        axes = tuple(a for a in range(ndim) if rng.random() < 0.5) or (axis,)
        return ("flip", (index,), (axes,))
    if choice == 5 and 1 in shape:
        new_shape = tuple(int(rng.integers(2, 5)) if s == 1 else s for s in shape)
        return ("expand", (index,), (new_shape,))
    return ("stride", (index,), (axis,))


def _high_level_step(rng: np.random.Generator, graph: Graph, values: list[Tensor], index: int,
                     axis: int) -> Step:
    x = values[index]
    choice = int(rng.integers(0, 5))
    if graph.is_int:
        return ("argmax" if choice < 2 else "cumsum", (index,), (axis,)) if choice < 4 \
            else ("contiguous", (index,), ())
    if choice == 0:
        return ("softmax" if rng.random() < 0.5 else "log_softmax", (index,), (axis,))
    if choice == 1:
        return ("layernorm" if rng.random() < 0.5 else "cumsum", (index,), (axis,))
    if choice == 2 and len(x.shape) == 2:
        columns = int(rng.integers(1, 6))
        weights = add_input(graph, values, random_input(rng, (x.shape[1], columns), False,
                                                        graph.huge_sign))
        return ("matmul", (index, weights), ())
    same = [k for k, v in enumerate(values) if v.shape == x.shape]
    if choice == 3:
        return ("cat", (index, int(rng.choice(same))), (axis,))
    return ("contiguous", (index,), ())


def random_graph(rng: np.random.Generator) -> Graph:
    is_int = bool(rng.random() < 0.2)
    graph = Graph([], is_int=is_int, huge_sign=1.0 if rng.random() < 0.5 else -1.0)
    values: list[Tensor] = []
    add_input(graph, values, random_input(rng, random_shape(rng), is_int, graph.huge_sign))
    for _ in range(int(rng.integers(1, 7))):
        step = random_step(rng, graph, values)  # may add an input step first
        graph.steps.append(step)
        values.append(apply_step(step[0], [values[i] for i in step[1]], step[2], is_int))
    return graph


# ---- running and comparing ----

def matches(result: np.ndarray, reference: np.ndarray) -> bool:
    """Integers and bools exactly; floats NaN-aware: NaN where the reference has NaN, the same
    infinities, the rest within a tolerance scaled to the largest finite reference value."""
    if result.shape != reference.shape or result.dtype != reference.dtype:
        return False
    if reference.dtype.kind in "biu":
        return bool(np.array_equal(result, reference))
    if not np.array_equal(np.isnan(result), np.isnan(reference)):
        return False
    finite = np.isfinite(reference)
    if not np.array_equal(result[~finite], reference[~finite], equal_nan=True):
        return False
    scale = 1.0 + float(np.max(np.abs(reference[finite]), initial=0.0))
    return bool(np.allclose(result[finite], reference[finite], rtol=1e-3, atol=1e-4 * scale))


@dataclass
class Report:
    graphs: int = 0
    special_results: int = 0  # graphs whose reference result holds NaN or ±inf
    mismatches: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def ok(self) -> bool:
        return not self.failures


def run_graph(graph: Graph, devices: list[str], report: Report) -> None:
    reference = [t.numpy() for t in graph.build("NUMPY")]
    if any(r.dtype.kind == "f" and not np.isfinite(r).all() for r in reference):
        report.special_results += 1
    for device in devices:
        try:
            result = [t.numpy() for t in graph.build(device)]
        except Exception as error:  # an exception is a finding too
            report.errors[device] = report.errors.get(device, 0) + 1
            report.failures.append(f"{device} raised {type(error).__name__}: {error}\n  "
                                   f"{graph.describe()}\n{traceback.format_exc(limit=3)}")
            continue
        wrong = [k for k, (r, e) in enumerate(zip(result, reference)) if not matches(r, e)]
        if wrong:
            report.mismatches[device] = report.mismatches.get(device, 0) + 1
            k = wrong[0]
            report.failures.append(f"{device} differs from NUMPY in result {k}:\n  "
                                   f"{graph.describe()}\n  got {result[k].ravel()[:8]} "
                                   f"expected {reference[k].ravel()[:8]}")


def fuzz(graphs: int, devices: list[str], seed: int = 0, verbose: bool = False) -> Report:
    rng = np.random.default_rng(seed)
    report = Report(mismatches={d: 0 for d in devices}, errors={d: 0 for d in devices})
    for k in range(graphs):
        graph = random_graph(rng)
        if verbose:
            print(f"graph {k}: {graph.describe()}")
        before = len(report.failures)
        run_graph(graph, devices, report)
        report.graphs += 1
        if verbose and len(report.failures) > before:
            print("\n".join(report.failures[before:]))
    return report


def available_devices() -> list[str]:
    return [d for d in ("CPU", "OPENCL", "WEBGPU", "CUDA") if Device.is_available(d)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--graphs", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--devices", nargs="*", default=None)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--vector-width", type=int, default=None,
                        help="CPU vector lanes (the fuzzer's shapes are small: 2 or 4 makes "
                             "the vector tiles and packing-free vector code run)")
    args = parser.parse_args()
    devices = args.devices or available_devices()
    if args.vector_width is not None:
        Device["CPU"].renderer.vector_width = args.vector_width
    start = time.perf_counter()
    report = fuzz(args.graphs, devices, args.seed, args.verbose)
    for failure in report.failures[:20]:
        print(failure)
    print(f"{report.graphs} graphs in {time.perf_counter() - start:.1f}s (seed {args.seed}), "
          f"{report.special_results} with NaN or ±inf in their results")
    for device in devices:
        print(f"  {device:<7} mismatches {report.mismatches[device]:4d}   "
              f"errors {report.errors[device]:4d}")
    return 0 if report.ok() else 1


if __name__ == "__main__":
    sys.exit(main())

