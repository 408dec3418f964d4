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


# ---- the stand-in for MNIST ----

def nearest_neighbour_accuracy(X_train: np.ndarray, Y_train: np.ndarray, X_test: np.ndarray,
                               Y_test: np.ndarray) -> float:
    """The accuracy of 1-nearest-neighbour (Euclidean) on flattened images."""
    train = X_train.reshape(len(X_train), -1).astype(np.float32)
    test = X_test.reshape(len(X_test), -1).astype(np.float32)
    distances = (test * test).sum(1)[:, None] - 2 * test @ train.T + (train * train).sum(1)
    return float((Y_train[distances.argmin(1)] == Y_test).mean())


def test_standin_mnist_has_mnists_format_and_holds_the_test_digits_out() -> None:
    pytest.importorskip("sklearn.datasets")
    X_train, Y_train, X_test, Y_test = datasets.standin_mnist()
    assert X_train.shape == (datasets.STANDIN_TRAIN, 1, 28, 28)
    assert X_test.shape == (datasets.STANDIN_TEST, 1, 28, 28)
    assert X_train.dtype == Y_train.dtype == X_test.dtype == dtypes.uint8
    assert not X_train.requires_grad
    digits_train, digits_train_labels, digits_test, digits_test_labels = (
        t.numpy() for t in datasets.digits(device="NUMPY"))
    images, sources = datasets.distorted_digits(digits_test[:, 0], datasets.STANDIN_TEST,
                                                datasets.STANDIN_SEED + 1)
    np.testing.assert_array_equal(images, X_test.numpy())  # drawn from the 297 test digits only
    np.testing.assert_array_equal(digits_test_labels[sources], Y_test.numpy())
    assert sorted(set(sources.tolist())) == list(range(len(digits_test)))  # each one, many times
    _, train_sources = datasets.distorted_digits(digits_train[:, 0], 20, datasets.STANDIN_SEED)
    np.testing.assert_array_equal(digits_train_labels[train_sources], Y_train.numpy()[:20])
    train = X_train.numpy()
    # MNIST-like: white strokes on a black background that is mostly exactly 0, every digit
    # inside the image with an empty border of at least one pixel in most images
    assert 0.6 < (train == 0).mean() < 0.9 and 0.05 < train.mean() / 255 < 0.25
    assert (train.max(axis=(1, 2, 3)) == 255).mean() > 0.99
    assert (train[:, 0, 0, :].max(axis=1) == 0).mean() > 0.9


def test_standin_mnist_is_deterministic_and_distorted() -> None:
    sources = np.random.default_rng(5).uniform(0, 1, (7, 8, 8))
    first, chosen = datasets.distorted_digits(sources, 21, seed=3)
    again, _ = datasets.distorted_digits(sources, 21, seed=3)
    other, _ = datasets.distorted_digits(sources, 21, seed=4)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    np.testing.assert_array_equal(chosen, np.arange(21) % 7)
    assert not np.array_equal(first[0], first[7])  # the same source, drawn differently


def test_standin_mnist_is_harder_than_the_undistorted_digits() -> None:
    """A nearest-neighbour classifier, the simplest measure of how hard a set is: perfect or
    nearly on the undistorted digits in MNIST's format, clearly not on the stand-in (on MNIST
    itself it gets about 97%)."""
    pytest.importorskip("sklearn.datasets")
    plain = [t.numpy() for t in datasets.digits_mnist(device="NUMPY")]
    standin = [t.numpy() for t in datasets.standin_mnist(device="NUMPY")]
    easy, hard = nearest_neighbour_accuracy(*plain), nearest_neighbour_accuracy(*standin)
    assert easy > 0.97 and 0.75 < hard < easy - 0.04, (easy, hard)


def test_standin_mnist_takes_tinygrads_fashion_argument() -> None:
    """tinygrad's newest beautiful_mnist calls mnist(fashion=getenv("FASHION")): a false value
    gives the stand-in, a true one is refused by name (there is no offline Fashion-MNIST)."""
    with pytest.raises(ValueError, match="Fashion-MNIST"):
        datasets.standin_mnist(fashion=True)
    X_train, _, _, _ = datasets.standin_mnist(fashion=0)  # type: ignore[arg-type]
    assert X_train.shape == (10000, 1, 28, 28)
