"""Chapter 12: exercises — build a backend's primitive ops yourself, and grade them offline.

What this teaches:
- a backend is the primitive op set of ir/uop.py plus three small classes (Allocator, Compiler,
  Program). Everything above it — fusion, autograd, the JIT, nn — comes for free;
- Exercise A (interpreter.py): write each primitive op as a small numpy function, as the NUMPY
  device does (runtime/numpy.py is the solution);
- Exercise B (codegen.py): write `code_for_op`, the C snippet of every ALU op, plus the Compiler
  and Program glue; the renderer writes the loops and the indexing, the system C compiler does
  the rest (render/c.py and runtime/cpu.py are the solution);
- the stretch exercise (rewrites.py): an optimization pass as rewrite rules (chapter 5's
  pattern matcher), such as the strength reduction x*2 -> x+x; each rule must give the expected
  graph and keep every value, NaN and inf included;
- autograder.py checks each op on its own, on edge cases (negative integers, division by zero, NaN,
  broadcasting, padding masks), shows what went wrong with a hint, and finally trains a small
  model on the student's device.

Builds on: everything (tensor, realize, render, runtime, nn). Used by:
chapters/12_exercise_backend.ipynb and `python -m tinyteach.exercises` (__main__.py).

>>> from tinyteach.exercises import InterpreterBackend, grade
>>> from tinyteach.runtime.numpy import NUMPY_OPS
>>> grade(InterpreterBackend(NUMPY_OPS)).passed
True
"""
from tinyteach.exercises.autograder import GradeReport, grade
from tinyteach.exercises.codegen import CODEGEN_OPS, CodegenBackend
from tinyteach.exercises.interpreter import INTERPRETER_OPS, InterpreterBackend
from tinyteach.exercises.rewrites import RULE_NAMES, RewriteRules

__all__ = ["CODEGEN_OPS", "INTERPRETER_OPS", "RULE_NAMES", "CodegenBackend", "GradeReport",
           "InterpreterBackend", "RewriteRules", "grade"]
