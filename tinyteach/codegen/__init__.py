"""Code generation's first half: a kernel's AST becomes a linear program (render/ writes it out).

| module            | chapter | what it holds                                                 |
|-------------------|---------|---------------------------------------------------------------|
| plan.py           | 7       | KernelOptions, the plan lowering reads, and facts of a kernel |
| wmma.py           | 8b      | tensor cores: the instruction, its fragments, its lowering    |
| lower.py          | 7       | AST -> loops, accumulators, index math -> LinearProgram (CPU) |
| transcendental.py | 8       | exp2 from primitive ops, rewriting a linear program           |

Builds on: ir/. Used by: opt/ (which builds plans), render/, runtime/, engine/realize.py.
"""
