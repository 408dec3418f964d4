"""Per-cell run times of executed notebooks (from nbclient's execution metadata)."""
import sys
from datetime import datetime

import nbformat

for path in sys.argv[1:]:
    nb = nbformat.read(path, 4)
    total = 0.0
    rows = []
    for cell in nb.cells:
        meta = cell.metadata.get("execution", {})
        if "iopub.execute_input" in meta:
            start = datetime.fromisoformat(meta["iopub.execute_input"].rstrip("Z"))
            end = datetime.fromisoformat(meta["shell.execute_reply"].rstrip("Z"))
            seconds = (end - start).total_seconds()
            total += seconds
            rows.append((seconds, cell.id))
    print(f"{path}: {total:.1f} s in cells;", ", ".join(f"{i} {s:.1f}s" for s, i in
                                                     sorted(rows, reverse=True)[:5]))
