"""Print a notebook's code cells and their text outputs (for reviewing the generated chapters)."""
import sys

import nbformat

for path in sys.argv[1:]:
    nb = nbformat.read(path, 4)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        print(f"==== [{cell.id}] {cell.source.splitlines()[0] if cell.source else ''}")
        for out in cell.outputs:
            if out.output_type == "stream":
                print(f"<{out.name}>", out.text[:3000])
            elif out.output_type == "error":
                print("ERROR", out.ename, out.evalue)
            else:
                text = out.get("data", {}).get("text/plain", "")
                print(f"<{out.output_type} {sorted(out.get('data', {}))}>", text[:800])
