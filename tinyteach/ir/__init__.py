"""The IR: one node type for every stage, how shapes become index math, and graph rewriting.

| module     | chapter | what it holds                                                     |
|------------|---------|-------------------------------------------------------------------|
| uop.py     | 3       | UOp(op, dtype, src, arg) and the primitive op set (Ops)           |
| view.py    | 4       | movement ops as index arithmetic (reshape, permute, pad, ...)     |
| rewrite.py | 5       | the pattern matcher, graph_rewrite and the symbolic rules         |

Builds on: dtype.py. Used by: every stage above it (tensor/, engine/, codegen/, opt/, render/).
"""
