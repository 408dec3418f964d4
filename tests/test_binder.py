"""binder/: the course runs on mybinder.org. repo2docker prints the Dockerfile it would build
(offline, no Docker needed); it must install Python 3.11, the apt packages, the course's pip
requirements and tinyteach itself."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BINDER = ROOT / "binder"
# what the notebooks import (besides tinyteach and viz, which postBuild installs)
COURSE_NEEDS = {"numpy", "jupyterlab", "ipykernel", "ipywidgets", "matplotlib", "graphviz",
                "pygments", "tqdm", "scikit-learn"}
# apt packages the course may ask for; each exists on Ubuntu 24.04 (repo2docker's base image)
UBUNTU_NOBLE_PACKAGES = {"graphviz", "build-essential", "gcc", "clang"}


def requirements() -> set[str]:
    lines = (BINDER / "requirements.txt").read_text().splitlines()
    return {line.split("#")[0].strip().lower() for line in lines if line.split("#")[0].strip()}


def test_binder_files():
    assert COURSE_NEEDS <= requirements()
    apt = set((BINDER / "apt.txt").read_text().split())
    assert {"graphviz", "build-essential"} <= apt <= UBUNTU_NOBLE_PACKAGES  # no chromium
    assert (BINDER / "runtime.txt").read_text().strip() == "python-3.11"
    post_build = BINDER / "postBuild"
    assert os.access(post_build, os.X_OK)
    script = post_build.read_text()
    assert "pip install --no-cache-dir -e ." in script
    assert "jupyter trust chapters/*.ipynb" in script  # stored outputs show as written
    assert 'cp binder/overrides.json "$settings/overrides.json"' in script


def test_the_course_settings_silence_jupyterlabs_news_and_update_check():
    """binder/overrides.json, which `make course` and postBuild install as JupyterLab's
    overrides.json (tests/test_viz_browser.py checks that no news popup shows)."""
    import json
    overrides = json.loads((BINDER / "overrides.json").read_text())
    notification = overrides["@jupyterlab/apputils-extension:notification"]
    assert notification == {"fetchNews": "false", "checkForUpdates": False}
    makefile = (ROOT / "Makefile").read_text()
    assert "LAB_SETTINGS := $(VENV)/share/jupyter/lab/settings/overrides.json" in makefile
    assert "jupyter trust chapters/*.ipynb" in makefile
    assert "--LabApp.default_url=/lab/tree/00_tour.ipynb" in makefile


@pytest.fixture(scope="module")
def dockerfile() -> str:
    repo2docker = shutil.which("repo2docker")
    if repo2docker is None:
        pytest.skip("repo2docker is not installed (pip install jupyter-repo2docker, in the test "
                    "extra); binder/ files are still checked above")
    result = subprocess.run([repo2docker, "--no-build", "--no-run", "--debug", "."], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout + result.stderr


def test_repo2docker_installs_what_the_course_needs(dockerfile):
    assert "python=3.11" in dockerfile
    assert "apt-get install --yes --no-install-recommends build-essential graphviz" in dockerfile
    assert 'pip install --no-cache-dir -r "binder/requirements.txt"' in dockerfile
    assert "RUN ./binder/postBuild" in dockerfile
    assert "FROM docker.io/library/buildpack-deps:24.04" in dockerfile


def test_binder_link_is_built_from_the_remote():
    import importlib.util
    spec = importlib.util.spec_from_file_location("binder_link", BINDER / "link.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    expected = ("https://mybinder.org/v2/gh/ada/tinyteach/HEAD?urlpath=lab/tree/chapters/"
                "00_tour.ipynb")  # the course opens on the tour
    for remote in ("https://github.com/ada/tinyteach.git", "https://github.com/ada/tinyteach",
                   "git@github.com:ada/tinyteach.git", "ssh://git@github.com/ada/tinyteach"):
        assert module.binder_link(remote) == expected
    with pytest.raises(ValueError, match="not a GitHub repository URL"):
        module.binder_link("/srv/git/tinyteach.git")
    readme = (ROOT / "README.md").read_text()
    assert "YOUR-GITHUB-ORG" not in readme and "binder/link.py" in readme
