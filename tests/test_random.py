"""Random numbers are tinygrad's: threefry2x32 of per-device counters, bit for bit.

Two references. A table of tinygrad 0.14.0's own numbers, written into this file: printed by
tinygrad 0.14.0 on its CPU device (clang 14, this project's machine, 2026-12-03) with
`Tensor.manual_seed(n)` and the calls in the order listed; tinygrad's CPU, OpenCL (pocl) and
PYTHON devices printed the same numbers for every entry but randn (randn's cos and log are each
device's own, in tinygrad too). Each tensor was realized in the order drawn: tinygrad 0.14's
lazy draw reads its device's counter when realized, so realizing a later draw first changes an
earlier one's numbers there (tinyteach fixes a draw's numbers when it is made). And, where
tinygrad 0.14 is installed, tinygrad itself, run in a subprocess on the same calls (odd sizes,
several draws in a row, two devices).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from helpers import skip_unless_supported

from tinyteach import Context, Device, Tensor, TinyJit, dtypes, nn

# ---- tinygrad 0.14.0's numbers (see the module docstring for where they come from) ----

SEQUENCE_AFTER_SEED_42 = {
    "rand(3)": [0.5334206819534302, 0.6701551675796509, 0.7630789279937744],
    "rand(5)": [0.1739814281463623, 0.8899328708648682, 0.9782277345657349,
                0.31057631969451904, 0.3030778169631958],
    "rand(1)": [0.8149237632751465],
    "uniform(2, 3, low=-0.3, high=0.7)": [
        [0.017220795154571533, 0.17689818143844604, 0.2756083607673645],
        [0.35599106550216675, -0.21184474229812622, -0.0166206955909729]],
    "kaiming_uniform(3, 2)": [[-0.5172300934791565, -0.4823261499404907],
                              [-0.9007861018180847, -0.8758842349052429],
                              [-1.4938710927963257, 1.4488792419433594]],
    "glorot_uniform(2, 3)": [[0.6522699594497681, -0.36469176411628723, -0.3818185329437256],
                             [0.9665325880050659, -0.3406355082988739, -0.4458828270435333]],
    "scaled_uniform(2, 2)": [[-0.24972224235534668, 0.27384185791015625],
                             [0.432966947555542, -0.24062788486480713]],
    "randint(2, 3, low=5, high=10)": [[5, 9, 6], [7, 8, 8]],
    "randperm(6)": [3, 4, 2, 0, 5, 1],
    "randn(2, 3)": [[1.557237148284912, 1.3667622804641724, -1.5752036571502686],
                    [-0.16322799026966095, -0.7206186652183533, -1.0883255004882812]],
    "Linear(3, 2).weight": [[-0.43560081720352173, 0.3410784602165222, 0.4726216495037079],
                            [0.5127411484718323, 0.26461371779441833, -0.06062770634889603]],
    "Linear(3, 2).bias": [0.4559248387813568, 0.4991403818130493],
    "ones(6).dropout(0.5)": [2.0, 2.0, 2.0, 0.0, 0.0, 0.0],
    "multinomial(8, replacement=True)": [3, 3, 1, 0, 1, 1, 3, 3],
    "multinomial(3)": [2, 3, 0],
    "counter": [81, 0],
}
FIRST_RAND_4_AFTER_SEED_7 = {
    "float16": [0.48046875, 0.3408203125, 0.0771484375, 0.4287109375],
    "bfloat16": [0.4765625, 0.3359375, 0.0703125, 0.421875],
    "float64": [0.7059452727704836, 0.13185269192436566, 0.5646695032665416,
                0.7929614806509413],
}
# rand(1000), then rand(2**16 + 1), after manual_seed(1): the first three numbers and the
# first 16 hex digits of the sha256 of the float32 bytes
BIG_AFTER_SEED_1 = {
    1000: ([0.8712923526763916, 0.5529849529266357, 0.13793134689331055], "bbb772d323f03f5a"),
    2 ** 16 + 1: ([0.4523282051086426, 0.21935021877288818, 0.1931138038635254],
                  "1056197413557a13"),
}
# nn.ConvTranspose2d(2, 3, 2) after manual_seed(1), rand(1000) and rand(2**16 + 1):
# weight[0][0] and bias (tinygrad draws a Conv2d-shaped weight first)
CONV_TRANSPOSE_AFTER_BIG = ([[-0.07201404124498367, -0.15106964111328125],
                             [0.17721940577030182, 0.12148238718509674]],
                            [-0.1448342651128769, 0.04591536521911621, 0.06507279723882675])

RANDN_TOLERANCE = 3e-6  # cos and log differ by an ulp between devices (tinygrad's too)


def _draw_sequence() -> dict[str, list]:
    """The calls of SEQUENCE_AFTER_SEED_42, in its order, on Device.DEFAULT."""
    Tensor.manual_seed(42)
    drawn = {
        "rand(3)": Tensor.rand(3), "rand(5)": Tensor.rand(5), "rand(1)": Tensor.rand(1),
        "uniform(2, 3, low=-0.3, high=0.7)": Tensor.uniform(2, 3, low=-0.3, high=0.7),
        "kaiming_uniform(3, 2)": Tensor.kaiming_uniform(3, 2),
        "glorot_uniform(2, 3)": Tensor.glorot_uniform(2, 3),
        "scaled_uniform(2, 2)": Tensor.scaled_uniform(2, 2),
        "randint(2, 3, low=5, high=10)": Tensor.randint(2, 3, low=5, high=10),
        "randperm(6)": Tensor.randperm(6), "randn(2, 3)": Tensor.randn(2, 3)}
    layer = nn.Linear(3, 2)
    drawn["Linear(3, 2).weight"], drawn["Linear(3, 2).bias"] = layer.weight, layer.bias
    with Context(TRAINING=1):
        drawn["ones(6).dropout(0.5)"] = Tensor.ones(6).dropout(0.5)
    weights = Tensor([1, 2, 3, 4])
    drawn["multinomial(8, replacement=True)"] = weights.multinomial(8, replacement=True)
    drawn["multinomial(3)"] = weights.multinomial(3)
    drawn["counter"] = Tensor._device_rng_counters[Device.DEFAULT]
    return {name: tensor.tolist() for name, tensor in drawn.items()}


def _assert_tinygrads(name: str, ours: list, theirs: list, device: str) -> None:
    ours_np, theirs_np = np.array(ours), np.array(theirs)
    if name.startswith("randn"):
        np.testing.assert_allclose(ours_np, theirs_np, rtol=0, atol=RANDN_TOLERANCE, err_msg=name)
    elif device == "WEBGPU" and theirs_np.dtype.kind == "f":
        # lavapipe reassociates float additions (WGSL promises no rounding), which undoes
        # uniform's single rounding: within one float32 step there, exact everywhere else
        np.testing.assert_array_max_ulp(ours_np.astype(np.float32), theirs_np.astype(np.float32),
                                        maxulp=1)
    else:
        np.testing.assert_array_equal(ours_np, theirs_np, err_msg=name)


def test_a_sequence_of_draws_gives_tinygrads_numbers(device):
    ours = _draw_sequence()
    assert ours.keys() == SEQUENCE_AFTER_SEED_42.keys()
    for name, theirs in SEQUENCE_AFTER_SEED_42.items():
        _assert_tinygrads(name, ours[name], theirs, device)


def test_rand_on_a_fresh_seed_is_exact_and_in_range(device):
    Tensor.manual_seed(42)
    first = Tensor.rand(3).numpy()
    np.testing.assert_array_equal(first, np.float32(SEQUENCE_AFTER_SEED_42["rand(3)"]))
    assert first.dtype == np.float32 and ((first >= 0) & (first < 1)).all()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_rand_of_other_float_dtypes_gives_tinygrads_numbers(device, dtype):
    skip_unless_supported(device, dtypes.as_dtype(dtype))
    Tensor.manual_seed(7)
    values = Tensor.rand(4, dtype=dtype)
    assert values.dtype == dtypes.as_dtype(dtype)
    as_float = values if dtype == "float64" else values.cast(dtypes.float32)
    assert as_float.numpy().astype(np.float64).tolist() == FIRST_RAND_4_AFTER_SEED_7[dtype]


def test_odd_sizes_and_the_counter_after_them(device):
    Tensor.manual_seed(1)
    for size, (first, digest) in BIG_AFTER_SEED_1.items():
        values = Tensor.rand(size).numpy()
        assert values.shape == (size,)
        assert values[:3].tolist() == first
        assert hashlib.sha256(values.tobytes()).hexdigest()[:16] == digest, size
    counter = Tensor._device_rng_counters[device].tolist()
    assert counter == [1000 + 2 ** 16 + 1, 0]
    layer = nn.ConvTranspose2d(2, 3, 2)
    weight, bias = CONV_TRANSPOSE_AFTER_BIG
    _assert_tinygrads("weight", layer.weight.tolist()[0][0], weight, device)
    _assert_tinygrads("bias", layer.bias.tolist(), bias, device)


def test_every_device_draws_the_same_bits():
    """Threefry is integer arithmetic, so every device gives the same bits (WEBGPU's uniform
    within a float step: see _assert_tinygrads)."""
    def draws(device: str) -> list[np.ndarray]:
        Tensor.manual_seed(3)
        return [Tensor.rand(33, device=device).numpy(),
                Tensor.randint(17, low=-5, high=1000, device=device).numpy(),
                Tensor.randperm(9, device=device).numpy(),
                Tensor.uniform(5, low=-1.5, high=2.5, device=device).numpy()]
    reference = draws("NUMPY")
    for device in ("CPU", "PYTHON"):
        for ours, theirs in zip(draws(device), reference):
            np.testing.assert_array_equal(ours, theirs)


# ---- several devices: a device's key is its place in the order of first draws ----

def test_the_second_device_drawn_from_gets_the_second_key():
    Tensor.manual_seed(42)
    Tensor.rand(2, device="NUMPY")
    second = Tensor.rand(3, device="CPU").tolist()
    Tensor.manual_seed(42)
    first = Tensor.rand(3, device="CPU").tolist()
    assert first == SEQUENCE_AFTER_SEED_42["rand(3)"]  # CPU first after this seed: key 0
    assert second != first
    assert Tensor._device_seeds["CPU"].tolist()[1] == 42
    Tensor.manual_seed(42)
    Tensor.rand(2, device="PYTHON")
    assert Tensor.rand(3, device="CPU").tolist() == second  # second again: the same key


def test_manual_seed_makes_every_device_start_over():
    Tensor.manual_seed(5)
    a = [Tensor.rand(4, device=name).numpy() for name in ("NUMPY", "CPU")]
    Tensor.rand(100, device="NUMPY")
    Tensor.manual_seed(5)
    b = [Tensor.rand(4, device=name).numpy() for name in ("NUMPY", "CPU")]
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


# ---- a tuple of devices, and TinyJit ----

def test_a_tuple_of_devices_draws_on_the_first_and_replicates():
    devices = ("CPU", "CPU:1")
    Tensor.manual_seed(42)
    sharded = [Tensor.rand(3, device=devices), Tensor.randn(2, 3, device=devices),
               Tensor.uniform(2, 3, low=-0.3, high=0.7, device=devices),
               Tensor.randperm(6, device=devices)]
    Tensor.manual_seed(42)
    alone = [Tensor.rand(3, device="CPU"), Tensor.randn(2, 3, device="CPU"),
             Tensor.uniform(2, 3, low=-0.3, high=0.7, device="CPU"),
             Tensor.randperm(6, device="CPU")]
    assert sharded[0].tolist() == SEQUENCE_AFTER_SEED_42["rand(3)"]
    for ours, theirs in zip(sharded, alone):
        assert ours.device == devices
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    assert "CPU:1" not in Tensor._devices_since_seed  # only the first device drew


def test_each_tinyjit_replay_draws_the_next_numbers():
    """A replay runs the counter's kernels again: the numbers of the calls without the JIT."""
    @TinyJit
    def draw(x: Tensor) -> Tensor:
        return (x + Tensor.rand(3)).realize()

    Tensor.manual_seed(42)
    plain = [Tensor.rand(3).numpy() for _ in range(4)]
    Tensor.manual_seed(42)
    jitted = [draw(Tensor.zeros(3).contiguous().realize()).numpy() for _ in range(4)]
    assert plain[0].tolist() == SEQUENCE_AFTER_SEED_42["rand(3)"]
    for ours, theirs in zip(jitted, plain):
        np.testing.assert_array_equal(ours, theirs)
    assert Tensor._device_rng_counters[Device.DEFAULT].tolist() == [12, 0]


# ---- the counter: 64 bits in two words, advanced by each draw ----

def test_each_draw_advances_the_counter_by_its_32_bit_words():
    Tensor.manual_seed(0)
    counters = []
    for make in (lambda: Tensor.rand(3), lambda: Tensor.rand(3, dtype=dtypes.float16),
                 lambda: Tensor.randn(5), lambda: Tensor.randint(0), lambda: Tensor.rand(7)):
        make()
        counters.append(Tensor._device_rng_counters[Device.DEFAULT].tolist()[0])
    assert counters == [3, 5, 15, 15, 22]  # float16: 2 per word; randn: 2 uniforms each


def test_the_counter_carries_into_its_high_word():
    Tensor.manual_seed(9)
    Tensor.rand(1)
    counter = Tensor._device_rng_counters[Device.DEFAULT]
    counter.assign(Tensor([0xFFFFFFF0, 6], dtype=dtypes.uint32)).realize()
    Tensor.rand(32)
    assert counter.tolist() == [0x10, 7]


# ---- uniform rounds once: (high - low) * u + low as one fused multiply-add ----

def _exactly_rounded(u: np.ndarray, scale: float, offset: float) -> np.ndarray:
    """scale * u + offset rounded once to float32: the product of two float32s has 48 bits
    and the sum stays within long double's 64 (these inputs), so only the cast rounds."""
    wide = np.longdouble
    return (u.astype(wide) * wide(np.float32(scale)) + wide(np.float32(offset))).astype(np.float32)


@pytest.mark.parametrize("scale, offset", [(2 / math.sqrt(3), -1 / math.sqrt(3)), (1.0, -0.3),
                                           (2 * 1.4141428, -1.4141428), (1e-3, 5.0),
                                           (3.0, 1e-8), (0.7, 0.3)])
def test_uniform_scaling_is_rounded_once_for_every_uniform_float(scale, offset):
    from tinyteach.tensor.create import _multiply_add
    if np.finfo(np.longdouble).nmant < 63:
        pytest.skip("needs an 80-bit long double for the exact reference")
    mantissas = np.arange(2 ** 23, dtype=np.uint32)  # every float rand can give
    u = (mantissas | np.uint32(0x3F800000)).view(np.float32) - np.float32(1)
    for device in ("NUMPY", "CPU"):
        ours = _multiply_add(Tensor(u, device=device), scale, offset).numpy()
        np.testing.assert_array_equal(ours.view(np.uint32),
                                      _exactly_rounded(u, scale, offset).view(np.uint32))


# ---- distributions ----

@pytest.mark.parametrize("size", [1, 3, 1000, 2 ** 16 + 1])
def test_sizes_and_distributions(size):
    Tensor.manual_seed(11)
    u = Tensor.rand(size).numpy()
    n = Tensor.randn(size).numpy()
    k = Tensor.randint(size, low=-3, high=4).numpy()
    assert u.shape == n.shape == k.shape == (size,)
    assert ((u >= 0) & (u < 1)).all() and np.isfinite(n).all()
    assert ((k >= -3) & (k < 4)).all() and k.dtype == np.int32
    if size > 10000:
        assert abs(u.mean() - 0.5) < 0.005 and abs(u.var() - 1 / 12) < 0.002
        assert abs(n.mean()) < 0.01 and abs(n.var() - 1) < 0.02
        np.testing.assert_allclose(np.bincount(k + 3) / size, 1 / 7, atol=0.005)


def test_an_unseeded_run_is_seeded_from_the_clock():
    code = ("from tinyteach import Tensor\nv = Tensor.rand(4).numpy()\n"
            "assert ((v >= 0) & (v < 1)).all()\nprint(Tensor._seed)")
    before = int(time.time())
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert before <= int(done.stdout.strip()) <= int(time.time())


# ---- bad input: a clear error ----

@pytest.mark.parametrize("make, error, message", [
    (lambda: Tensor.rand(2, -1), ValueError, "negative size"),
    (lambda: Tensor.rand(3, dtype=dtypes.int32), ValueError, "floats"),
    (lambda: Tensor.rand(3, dtype=dtypes.bool), ValueError, "floats"),
    (lambda: Tensor.randn(-2), ValueError, "negative size"),
    (lambda: Tensor.uniform(3, low=1.0, high=1.0), ValueError, "low < high"),
    (lambda: Tensor.randint(3, low=4, high=2), ValueError, "low < high"),
    (lambda: Tensor.randint(3, low=0.5, high=2), TypeError, "integer bounds"),
    (lambda: Tensor.randint(3, dtype=dtypes.float32), TypeError, "makes integers"),
    (lambda: Tensor.normal(3, std=-1.0), ValueError, "std >= 0"),
    (lambda: Tensor.randperm(-1), ValueError, "non-negative"),
    (lambda: Tensor.manual_seed("1"), TypeError, "takes an int"),
    (lambda: Tensor.manual_seed(1.5), TypeError, "takes an int"),
])
def test_bad_input_says_what_is_wrong(make, error, message):
    with pytest.raises(error, match=message):
        make()


# ---- against tinygrad itself, where it is installed ----

TINYGRAD_SCRIPT = textwrap.dedent("""
    import json, sys
    from tinygrad import Tensor, nn
    from tinygrad.helpers import DEV
    DEV.value = "CPU"
    out = {}
    Tensor.manual_seed(123)
    for size in (1, 3, 1000, 2 ** 16 + 1):
        out[f"rand({size})"] = Tensor.rand(size).numpy().tolist()
        out[f"uniform({size})"] = Tensor.uniform(size, low=-2.5, high=0.75).numpy().tolist()
        out[f"randint({size})"] = Tensor.randint(size, low=-7, high=100).numpy().tolist()
    out["randn(1001)"] = Tensor.randn(1001).numpy().tolist()
    out["kaiming_uniform(9, 7)"] = Tensor.kaiming_uniform(9, 7).numpy().tolist()
    out["Conv2d(3, 4, 3).weight"] = nn.Conv2d(3, 4, 3).weight.numpy().tolist()
    out["Embedding(11, 5).weight"] = nn.Embedding(11, 5).weight.numpy().tolist()
    out["second device: rand(5)"] = Tensor.rand(5, device="PYTHON").numpy().tolist()
    counter = Tensor._device_rng_counters["CPU"]
    counter.assign(Tensor([0xFFFFFFFE, 3], dtype="uint32", device="CPU")).realize()
    out["rand(9) at the carry"] = Tensor.rand(9).numpy().tolist()
    out["counter"] = counter.numpy().tolist()
    json.dump(out, sys.stdout)
""")


@pytest.fixture(scope="module")
def tinygrads_numbers() -> dict[str, list]:
    if importlib.util.find_spec("tinygrad") is None:
        pytest.skip("tinygrad is not installed (pip install tinygrad==0.14.0 to compare live)")
    done = subprocess.run([sys.executable, "-c", TINYGRAD_SCRIPT], capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0:
        pytest.skip(f"tinygrad's CPU device did not run here: {done.stderr[-300:]}")
    return json.loads(done.stdout)


def test_live_against_tinygrad(device, tinygrads_numbers):
    second = "NUMPY" if device != "NUMPY" else "CPU"
    ours = {}
    Tensor.manual_seed(123)
    for size in (1, 3, 1000, 2 ** 16 + 1):
        ours[f"rand({size})"] = Tensor.rand(size).tolist()
        ours[f"uniform({size})"] = Tensor.uniform(size, low=-2.5, high=0.75).tolist()
        ours[f"randint({size})"] = Tensor.randint(size, low=-7, high=100).tolist()
    ours["randn(1001)"] = Tensor.randn(1001).tolist()
    ours["kaiming_uniform(9, 7)"] = Tensor.kaiming_uniform(9, 7).tolist()
    ours["Conv2d(3, 4, 3).weight"] = nn.Conv2d(3, 4, 3).weight.tolist()
    ours["Embedding(11, 5).weight"] = nn.Embedding(11, 5).weight.tolist()
    ours["second device: rand(5)"] = Tensor.rand(5, device=second).tolist()
    counter = Tensor._device_rng_counters[device]
    counter.assign(Tensor([0xFFFFFFFE, 3], dtype=dtypes.uint32)).realize()
    ours["rand(9) at the carry"] = Tensor.rand(9).tolist()
    ours["counter"] = counter.tolist()
    assert ours.keys() == tinygrads_numbers.keys()
    for name, theirs in tinygrads_numbers.items():
        _assert_tinygrads(name, ours[name], theirs, device)
