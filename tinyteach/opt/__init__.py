"""Chapter 7 (the optimizer): a kernel is an AST plus a list of actions, as in tinygrad.

`from tinyteach.opt import Opt, OptOps, Kernel, hand_coded_optimizations` is the student's
API: `Kernel(ast, device).apply_opt(Opt(OptOps.UPCAST, 0, 4))`, `.applied_opts`,
`.to_program()`, and the heuristic's list for a kernel. The modules, in reading order:

| module       | what it holds                                                           |
|--------------|-------------------------------------------------------------------------|
| kernel.py    | the actions (OptOps, Opt), Kernel, each action's check and its hook     |
| heuristic.py | hand_coded_optimizations: the hand-written choice, as a list of actions |
| search.py    | BEAM: a timed search over lists of actions, cached per kernel and device |
| pack.py      | packing copies: big matmul operands copied into the order a tile reads   |

Builds on: codegen/ (the plan the actions build, lowering). Used by: engine/realize.py.
"""
from tinyteach.opt.heuristic import hand_coded_optimizations
from tinyteach.opt.kernel import Kernel, KernelOptError, Opt, OptOps

__all__ = ["Opt", "OptOps", "Kernel", "KernelOptError", "hand_coded_optimizations"]
