"""Generate chapters 06-11 (without outputs); then execute them with nbconvert.

    python chapters/_build/build_06_11.py [06 07 ...]
    jupyter nbconvert --to notebook --execute --inplace chapters/06_scheduling.ipynb ...
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

CHAPTERS = {"06": ("ch06", "06_scheduling.ipynb"), "07": ("ch07", "07_lowering.ipynb"),
            "08": ("ch08", "08_codegen.ipynb"), "09": ("ch09", "09_devices.ipynb"),
            "10": ("ch10", "10_jit.ipynb"), "11": ("ch11", "11_deep_learning.ipynb")}

if __name__ == "__main__":
    for number in sys.argv[1:] or list(CHAPTERS):
        module, name = CHAPTERS[number]
        importlib.import_module(module).build().write(str(HERE.parent / name))
        print("wrote", name)
