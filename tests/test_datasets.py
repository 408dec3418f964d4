"""Chapter 11d: the IDX parser, mnist() from a cache folder and its error paths, digits()."""
from __future__ import annotations

import gzip
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from tinyteach import dtypes
from tinyteach.nn import datasets
from tinyteach.nn.datasets import IDXError, parse_idx, write_idx


def handmade_idx(array: np.ndarray, type_code: int = 0x08) -> bytes:
    """IDX bytes written here by hand (not with write_idx), as the format describes."""
    header = bytes([0, 0, type_code, array.ndim])
    return header + b"".join(struct.pack(">I", size) for size in array.shape) + array.tobytes()


def test_parse_idx_raw_and_gzip() -> None:
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    content = handmade_idx(images)
    np.testing.assert_array_equal(parse_idx(content), images)
    np.testing.assert_array_equal(parse_idx(gzip.compress(content)), images)


def test_parse_idx_big_endian_types() -> None:
    values = np.array([[1, -2, 300000]], dtype=">i4")
    parsed = parse_idx(handmade_idx(values, type_code=0x0C))
    assert parsed.dtype == np.int32
    np.testing.assert_array_equal(parsed, [[1, -2, 300000]])


@pytest.mark.parametrize("array", [np.arange(12, dtype=np.uint8).reshape(3, 4),
                                   np.linspace(-1, 1, 6, dtype=np.float32),
                                   np.array([[-3, 4]], dtype=np.int16)])
def test_write_idx_round_trips(array: np.ndarray) -> None:
    np.testing.assert_array_equal(parse_idx(write_idx(array)), array)


def test_corrupt_magic_and_truncated_files() -> None:
    content = handmade_idx(np.zeros((2, 2, 2), dtype=np.uint8))
    with pytest.raises(IDXError, match="not an IDX file"):
        parse_idx(b"\x01\x02" + content[2:], "bad.idx")
    with pytest.raises(IDXError, match="not an IDX file"):
        parse_idx(b"\x00\x00\x42\x01" + content[4:])  # unknown type code
    with pytest.raises(IDXError, match="needs 8 bytes of data but the file has 5"):
        parse_idx(content[:-3])
    with pytest.raises(IDXError, match="truncated inside the header"):
        parse_idx(content[:9])
    with pytest.raises(IDXError, match="gzip data is corrupt or truncated"):
        parse_idx(gzip.compress(content)[:-10])


def write_fake_mnist(folder: Path, train: int = 5, test: int = 3, compress: bool = True) -> None:
    rng = np.random.default_rng(0)
    for prefix, count in [("train", train), ("t10k", test)]:
        images = rng.integers(0, 256, size=(count, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, size=count, dtype=np.uint8)
        for kind, array in [("images-idx3-ubyte", images), ("labels-idx1-ubyte", labels)]:
            content = handmade_idx(array)
            name = f"{prefix}-{kind}"
            if compress:
                (folder / f"{name}.gz").write_bytes(gzip.compress(content))
            else:
                (folder / name).write_bytes(content)
            np.save(folder / f"{name}.npy", array)


@pytest.mark.parametrize("compress", [True, False])
def test_mnist_reads_the_cache_folder(tmp_path: Path, compress: bool) -> None:
    write_fake_mnist(tmp_path, compress=compress)
    X_train, Y_train, X_test, Y_test = datasets.mnist(tmp_path)
    assert X_train.shape == (5, 1, 28, 28) and X_test.shape == (3, 1, 28, 28)
    assert X_train.dtype == dtypes.uint8 and Y_train.dtype == dtypes.uint8
    np.testing.assert_array_equal(X_train.numpy()[:, 0],
                                  np.load(tmp_path / "train-images-idx3-ubyte.npy"))
    np.testing.assert_array_equal(Y_test.numpy(), np.load(tmp_path / "t10k-labels-idx1-ubyte.npy"))


def test_mnist_directory_from_the_environment(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    write_fake_mnist(tmp_path)
    monkeypatch.setenv("TINYTEACH_MNIST_DIR", str(tmp_path))
    assert datasets.mnist_directory() == tmp_path
    assert datasets.mnist()[1].shape == (5,)


def test_mnist_downloads_from_the_base_url(tmp_path: Path) -> None:
    """A file:// URL stands in for the network: the download path and the cache are real."""
    source, cache = tmp_path / "mirror", tmp_path / "cache"
    source.mkdir()
    write_fake_mnist(source)
    X_train = datasets.mnist(cache, base_url=source.as_uri() + "/")[0]
    assert X_train.shape == (5, 1, 28, 28)
    assert (cache / "train-images-idx3-ubyte.gz").exists()


def test_mnist_offline_error_says_which_files_go_where(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError) as error:
        datasets.mnist(tmp_path, base_url=missing.as_uri() + "/")
    message = str(error.value)
    assert str(tmp_path) in message and "TINYTEACH_MNIST_DIR" in message
    for name in datasets.MNIST_FILES:
        assert f"{name}.gz" in message


def test_digits_shapes_scale_and_split() -> None:
    sklearn_datasets = pytest.importorskip("sklearn.datasets")
    X_train, Y_train, X_test, Y_test = datasets.digits()
    assert X_train.shape == (1500, 1, 8, 8) and X_test.shape == (297, 1, 8, 8)
    assert X_train.dtype == dtypes.float32 and Y_train.dtype == dtypes.int32
    bunch = sklearn_datasets.load_digits()
    order = np.random.default_rng(0).permutation(1797)
    np.testing.assert_allclose(X_test.numpy().reshape(297, 64), bunch.data[order][1500:] / 16.0,
                               rtol=1e-6)
    np.testing.assert_array_equal(Y_train.numpy(), bunch.target[order][:1500])
    assert sorted(order[:1500].tolist() + order[1500:].tolist()) == list(range(1797))
    assert 0.0 <= X_train.numpy().min() and X_train.numpy().max() == 1.0
    assert sorted(set(Y_test.numpy().tolist())) == list(range(10))


def test_digits_without_scikit_learn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(ImportError, match="pip install scikit-learn"):
        datasets.digits()
