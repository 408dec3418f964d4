"""Chapter 11d: Datasets — MNIST from its IDX files, and scikit-learn's 8x8 digits offline.

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
- every loader returns tensors with requires_grad=False. backward() fills `.grad` on every
  float tensor its graph reaches (tinygrad's rule), and a batch `X_train[idx]` reaches
  X_train: without JIT, each step would add a lazy gradient graph to X_train.grad, holding
  every step's buffers alive. False stops the gradient there.

Builds on: tensor.py. Used by: the training examples and chapter 11's notebook.

>>> X_train, Y_train, X_test, Y_test = digits()  # doctest: +SKIP
>>> X_train.shape, Y_train.dtype, X_test.shape  # doctest: +SKIP
((1500, 1, 8, 8), dtypes.int32, (297, 1, 8, 8))
"""
from __future__ import annotations

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
