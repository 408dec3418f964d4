"""Chapter 11 (part 4): Datasets — MNIST from its IDX files, and scikit-learn's 8x8 digits offline.

What this teaches:
- the IDX format of MNIST is tiny: a 4-byte magic number (two zero bytes, a type code, the number
  of dimensions), one big-endian u32 per dimension, then the raw values. `parse_idx` reads it with
  `struct` and `np.frombuffer`, and checks every size so a broken file fails loudly;
- `mnist()` returns what tinygrad's `nn.datasets.mnist()` returns: `X_train, Y_train, X_test,
  Y_test` as Tensors, images as **uint8** of shape (N, 1, 28, 28) with values 0..255 and labels
  as **uint8** of shape (N,). Scale the images yourself (`X.float() / 255`), as tinygrad users do;
- the files are read from a cache directory (`~/.cache/tinyteach/mnist`, or `$TINYTEACH_MNIST_DIR`)
  and downloaded with urllib from `$TINYTEACH_MNIST_URL` (default `MNIST_URL`) when missing;
  offline, the error says exactly which files to put where;
- `digits()` needs no network: scikit-learn ships 1,797 8x8 digit images. tinyteach returns them
  as float32 (N, 1, 8, 8) scaled from 0..16 to [0, 1], int32 labels, and a fixed split: the last
  297 images are the test set (the first 1,500 train), so every run sees the same data;
- `digits_mnist()` is the same digits in MNIST's format — uint8 (N, 1, 28, 28) images in 0..255
  (each 8x8 pixel a 3x3 block, centred with a 2-pixel border as MNIST centres its digits) and
  uint8 labels — so tinygrad's programs that call `mnist()` run offline unchanged but for the
  import; `fetch_digits_mnist()` does the same for the older `extra.datasets.fetch_mnist()`;
- those digits are far easier than MNIST (a CNN gets every test digit right), so
  `standin_mnist()` draws each one many times with MNIST's size and framing, through its own
  random distortion (rotation, scale, shear, shift, an elastic warp, stroke width): 10,000
  training and 2,000 test images, the test images from the held-out digits only. tinygrad's
  beautiful_mnist gets 97.8% on it (about 98% on MNIST); made in seconds with numpy, deterministic;
- every loader returns tensors with requires_grad=False. backward() fills `.grad` on every
  float tensor its graph reaches (tinygrad's rule), and a batch `X_train[idx]` reaches
  X_train: without JIT, each step would add a lazy gradient graph to X_train.grad, holding
  every step's buffers alive. False stops the gradient there.

Builds on: tensor/. Used by: the training examples and chapter 11's notebook.

>>> X_train, Y_train, X_test, Y_test = digits()  # doctest: +SKIP
>>> X_train.shape, Y_train.dtype, X_test.shape  # doctest: +SKIP
((1500, 1, 8, 8), dtypes.int, (297, 1, 8, 8))
"""
from __future__ import annotations

import functools
import gzip
import os
import struct
import urllib.request
from pathlib import Path

import numpy as np

from tinyteach.settings import TINYTEACH_MNIST_DIR, TINYTEACH_MNIST_URL
from tinyteach.tensor import Tensor

# ---- the IDX format ----

IDX_TYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"), 0x09: np.dtype(">i1"), 0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8"),
}


class IDXError(ValueError):
    """A file that is not a valid IDX file (wrong magic, truncated, wrong size)."""


def parse_idx(content: bytes, name: str = "<bytes>") -> np.ndarray:
    """The array stored in IDX bytes (gzip-compressed bytes are unpacked first)."""
    if content[:2] == b"\x1f\x8b":  # the gzip magic number
        try:
            content = gzip.decompress(content)
        except (OSError, EOFError) as error:
            raise IDXError(f"{name}: the gzip data is corrupt or truncated ({error})") from None
    if len(content) < 4 or content[:2] != b"\x00\x00" or content[2] not in IDX_TYPES:
        raise IDXError(f"{name}: not an IDX file (magic {content[:4].hex() or 'missing'}; "
                       f"expected 0000 then a type code in {[hex(t) for t in IDX_TYPES]})")
    dtype, ndim = IDX_TYPES[content[2]], content[3]
    header_size = 4 + 4 * ndim
    if len(content) < header_size:
        raise IDXError(f"{name}: truncated inside the header ({len(content)} bytes)")
    shape = struct.unpack(f">{ndim}I", content[4:header_size])
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(content) - header_size != expected:
        raise IDXError(f"{name}: shape {shape} needs {expected} bytes of data but the file has "
                       f"{len(content) - header_size}; it is truncated or corrupt")
    data = np.frombuffer(content, dtype=dtype, offset=header_size).reshape(shape)
    return data.astype(dtype.newbyteorder("="))


def write_idx(array: np.ndarray) -> bytes:
    """IDX bytes for `array` (the inverse of parse_idx; used by the tests and for small files)."""
    codes = {dtype.newbyteorder("="): code for code, dtype in IDX_TYPES.items()}
    native = np.dtype(array.dtype).newbyteorder("=")
    if native not in codes:
        raise TypeError(f"IDX cannot store dtype {array.dtype}")
    header = bytes([0, 0, codes[native], array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + np.ascontiguousarray(array).astype(native.newbyteorder(">")).tobytes()


# ---- MNIST ----

MNIST_URL = "https://storage.googleapis.com/cvdf-datasets/mnist/"
MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
               "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def mnist_directory() -> Path:
    """Where the MNIST files live: $TINYTEACH_MNIST_DIR, or ~/.cache/tinyteach/mnist."""
    default = Path.home() / ".cache" / "tinyteach" / "mnist"
    return Path(TINYTEACH_MNIST_DIR.get(default))


def mnist(directory: str | os.PathLike[str] | None = None, base_url: str | None = None,
          device: str | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """X_train (60000, 1, 28, 28) uint8, Y_train (60000,) uint8, X_test, Y_test — as tinygrad."""
    folder = Path(directory) if directory is not None else mnist_directory()
    url = base_url or TINYTEACH_MNIST_URL.get(MNIST_URL)
    arrays = [parse_idx(_mnist_file(folder, name, url), name) for name in MNIST_FILES]
    train_images, train_labels, test_images, test_labels = arrays
    return (_data(train_images.reshape(-1, 1, 28, 28), device), _data(train_labels, device),
            _data(test_images.reshape(-1, 1, 28, 28), device), _data(test_labels, device))


def _data(array: np.ndarray, device: str | None) -> Tensor:
    """A dataset tensor: requires_grad=False, so no backward piles a .grad onto it."""
    return Tensor(array, device=device, requires_grad=False)


def _mnist_file(folder: Path, name: str, base_url: str) -> bytes:
    """The bytes of one MNIST file: `name` or `name.gz` from the cache, else downloaded."""
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.exists():
            return candidate.read_bytes()
    try:
        with urllib.request.urlopen(f"{base_url}{name}.gz", timeout=30) as response:
            content: bytes = response.read()
    except OSError as error:
        raise FileNotFoundError(_missing_mnist_message(folder, base_url, error)) from None
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.gz").write_bytes(content)
    return content


def _missing_mnist_message(folder: Path, base_url: str, error: Exception) -> str:
    files = ", ".join(f"{name}.gz" for name in MNIST_FILES)
    return (f"MNIST is not in {folder} and downloading {base_url} failed ({error}). "
            f"Put these four files (gzipped or not) in {folder}: {files} — or set "
            f"TINYTEACH_MNIST_DIR to a folder that has them, or TINYTEACH_MNIST_URL to a mirror.")


# ---- scikit-learn's digits ----

DIGITS_TEST_SIZE = 297


def digits_order(count: int) -> np.ndarray:
    """The fixed shuffle of the digits set (the same on every machine and numpy version)."""
    return np.random.default_rng(0).permutation(count)


def digits(device: str | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """X_train (1500, 1, 8, 8) float32 in [0, 1], Y_train (1500,) int32, X_test, Y_test (297).

    The split is fixed: the 1,797 images in a shuffled order that never changes (numpy's
    default_rng(0) permutation), the first 1,500 for training. (The set is stored grouped by
    writer; its last 297 images come from writers the rest never shows, which caps a small
    CNN near 95%, so we shuffle as scikit-learn's train_test_split would.)"""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ImportError("digits() reads the 8x8 digits bundled with scikit-learn; install it "
                          "with `pip install scikit-learn`") from None
    bunch = load_digits()
    images = (bunch.images / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    labels = bunch.target.astype(np.int32)
    order = digits_order(len(labels))
    images, labels = images[order], labels[order]
    split = len(labels) - DIGITS_TEST_SIZE
    return (_data(images[:split], device), _data(labels[:split], device),
            _data(images[split:], device), _data(labels[split:], device))


# ---- the digits in MNIST's format, for tinygrad's programs ----

DIGITS_UPSCALE, DIGITS_BORDER = 3, 2  # 8 * 3 + 2 * 2 = 28, MNIST's size


def digits_as_mnist_arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The digits() split as numpy arrays in MNIST's format: uint8 images (N, 1, 28, 28) in
    0..255 and uint8 labels."""
    X_train, Y_train, X_test, Y_test = digits(device="NUMPY")
    return (_to_mnist_images(X_train.numpy()), Y_train.numpy().astype(np.uint8),
            _to_mnist_images(X_test.numpy()), Y_test.numpy().astype(np.uint8))


def _to_mnist_images(images: np.ndarray) -> np.ndarray:
    """(N, 1, 8, 8) floats in [0, 1] -> (N, 1, 28, 28) uint8 in 0..255: each pixel becomes a
    3x3 block, with a border of 2 zero pixels."""
    big = images.repeat(DIGITS_UPSCALE, axis=2).repeat(DIGITS_UPSCALE, axis=3)
    border = ((0, 0), (0, 0), (DIGITS_BORDER,) * 2, (DIGITS_BORDER,) * 2)
    return np.pad(np.rint(big * 255), border).astype(np.uint8)


def digits_mnist(device: str | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """What `mnist()` returns — X_train (1500, 1, 28, 28) uint8, Y_train (1500,) uint8, X_test,
    Y_test (297) — made from scikit-learn's digits, with no network. tinygrad's programs run
    on it with `from tinyteach.nn.datasets import digits_mnist as mnist`."""
    return tuple(_data(array, device)  # type: ignore[return-value]
                 for array in digits_as_mnist_arrays())


def fetch_digits_mnist(tensors: bool = False) -> tuple[np.ndarray | Tensor, ...]:
    """What tinygrad's older `extra.datasets.fetch_mnist()` returns, from the digits: numpy
    images (N, 784) float32 in 0..255 and uint8 labels, or with tensors=True Tensors of shape
    (N, 1, 28, 28)."""
    X_train, Y_train, X_test, Y_test = digits_as_mnist_arrays()
    flat_train = X_train.reshape(-1, 28 * 28).astype(np.float32)
    flat_test = X_test.reshape(-1, 28 * 28).astype(np.float32)
    if tensors:
        return (_data(flat_train, None).reshape(-1, 1, 28, 28), _data(Y_train, None),
                _data(flat_test, None).reshape(-1, 1, 28, 28), _data(Y_test, None))
    return flat_train, Y_train, flat_test, Y_test


# ---- a stand-in for MNIST that is about as hard as MNIST ----

STANDIN_TRAIN, STANDIN_TEST = 10_000, 2_000
STANDIN_SEED = 2026
BOX = 20  # MNIST draws each digit inside a 20x20 box centred in its 28x28 image
# the range of each random distortion (drawn uniformly), in output pixels where it is a length
ROTATION_DEGREES = 8.0
SCALE = (0.9, 1.05)
ASPECT = (0.85, 1.15)
SHEAR = 0.1
SHIFT_PIXELS = 1.0
ELASTIC_PIXELS = 0.5       # how far the smooth random displacement moves a pixel (its std)
ELASTIC_GRID = 5           # the displacement is drawn on a 5x5 grid and interpolated: smooth
THRESHOLD = (0.2, 0.35)    # ink below it is cut off: a higher threshold draws a thinner stroke
EDGE = 0.2                 # the width of the stroke's soft edge, in ink


def _upsample(grid: np.ndarray, size: int) -> np.ndarray:
    """(..., g, g) values on a grid spread evenly over an image -> (..., size, size), linearly
    interpolated along each axis in turn (elementwise arithmetic only: the same bits on every
    machine, where a matrix product's summation order may differ)."""
    position = np.linspace(0, grid.shape[-1] - 1, size)
    lower = np.minimum(np.floor(position).astype(np.int64), grid.shape[-1] - 2)
    weight = position - lower
    columns = grid[..., lower] * (1 - weight) + grid[..., lower + 1] * weight
    down = weight[:, None]
    return columns[..., lower, :] * (1 - down) + columns[..., lower + 1, :] * down


def _source_coordinates(count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """For each of `count` images and each of its 28x28 pixels, the point of the 8x8 source it
    shows (row, column): an inverse affine map (rotation, scale, aspect, shear, shift) of the
    pixel moved by a smooth random displacement (an elastic distortion)."""
    angle = np.radians(rng.uniform(-ROTATION_DEGREES, ROTATION_DEGREES, count))
    scale = rng.uniform(*SCALE, count) * BOX / 8  # output pixels per source pixel
    aspect = rng.uniform(*ASPECT, count)
    shear = rng.uniform(-SHEAR, SHEAR, count)
    shift = rng.uniform(-SHIFT_PIXELS, SHIFT_PIXELS, (count, 2))
    grid = rng.standard_normal((count, 2, ELASTIC_GRID, ELASTIC_GRID)) * ELASTIC_PIXELS
    displacement = _upsample(grid, 28)
    centre = (28 - 1) / 2
    rows, columns = np.meshgrid(np.arange(28) - centre, np.arange(28) - centre, indexing="ij")
    y = rows[None] + displacement[:, 0] - shift[:, 0, None, None]
    x = columns[None] + displacement[:, 1] - shift[:, 1, None, None]
    cos, sin = np.cos(angle)[:, None, None], np.sin(angle)[:, None, None]
    y, x = cos * y - sin * x, sin * y + cos * x                    # undo the rotation
    x = x - shear[:, None, None] * y                               # undo the shear
    y = y / (scale / aspect)[:, None, None]                        # undo scale and aspect
    x = x / (scale * aspect)[:, None, None]
    return y + (8 - 1) / 2, x + (8 - 1) / 2


def _bilinear(sources: np.ndarray, y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """sources (N, 8, 8) read at the points (y, x) (N, 28, 28), bilinearly; zero outside."""
    padded = np.pad(sources, ((0, 0), (1, 1), (1, 1))).reshape(len(sources), -1)
    y, x = np.clip(y + 1, 0, 8.999), np.clip(x + 1, 0, 8.999)  # the zero border reads as zero
    top, left = np.floor(y).astype(np.int64), np.floor(x).astype(np.int64)
    dy, dx = y - top, x - left
    image = np.arange(len(sources))[:, None, None]

    def at(row: np.ndarray, column: np.ndarray) -> np.ndarray:
        return padded[image, row * 10 + column]
    return ((1 - dy) * ((1 - dx) * at(top, left) + dx * at(top, left + 1))
            + dy * ((1 - dx) * at(top + 1, left) + dx * at(top + 1, left + 1)))


def distorted_digits(sources: np.ndarray, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`count` MNIST-sized images drawn from `sources` (N, 8, 8) floats in [0, 1], source after
    source in turn, each through its own random distortion: affine (rotation, scale, aspect,
    shear, shift), elastic, and stroke width (the ink threshold). Returns uint8 images
    (count, 1, 28, 28) in 0..255 and the index of each image's source. The same arguments give
    the same bytes: numpy's default_rng(seed), in float64."""
    rng = np.random.default_rng(seed)
    chosen = np.arange(count) % len(sources)
    y, x = _source_coordinates(count, rng)
    ink = _bilinear(sources[chosen].astype(np.float64), y, x)
    threshold = rng.uniform(*THRESHOLD, count)[:, None, None]
    stroke = np.clip((ink - threshold) / EDGE, 0, 1)
    return np.rint(stroke * 255).astype(np.uint8)[:, None], chosen


@functools.cache
def standin_mnist_arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The arrays of `standin_mnist()`: made once per process (about a second)."""
    X_train, Y_train, X_test, Y_test = (t.numpy() for t in digits(device="NUMPY"))
    train, train_from = distorted_digits(X_train[:, 0], STANDIN_TRAIN, STANDIN_SEED)
    test, test_from = distorted_digits(X_test[:, 0], STANDIN_TEST, STANDIN_SEED + 1)
    return (train, Y_train[train_from].astype(np.uint8), test,
            Y_test[test_from].astype(np.uint8))


def standin_mnist(device: str | None = None,
                  fashion: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """What `mnist()` returns, made with no network and about as hard as MNIST: X_train (10000,
    1, 28, 28) uint8, Y_train (10000,) uint8, X_test, Y_test (2000). The images are the digits()
    split's 8x8 digits, each drawn many times at MNIST's size with its own distortion
    (`distorted_digits`); the test images come from the 297 test digits only, so no digit (nor
    any drawing of it) is in both sets. examples/beautiful_mnist.py's 70 steps reach 97.8% on it
    (tinygrad's reach about 98% on MNIST), where the undistorted digits (`digits_mnist`) let it
    reach 100%. `fashion` is tinygrad's mnist() argument (`mnist(fashion=getenv("FASHION"))`):
    there is no offline stand-in for Fashion-MNIST, so a true value is refused."""
    if fashion:
        raise ValueError("standin_mnist has no Fashion-MNIST stand-in (it draws digits): unset "
                         "FASHION, or load Fashion-MNIST's files yourself")
    return tuple(_data(array, device)  # type: ignore[return-value]
                 for array in standin_mnist_arrays())
