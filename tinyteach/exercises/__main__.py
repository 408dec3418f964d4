"""Chapter 12 (the grader's CLI): `python -m tinyteach.exercises <module or file> [--train]`.

It loads a module, a .py file or an .ipynb notebook (skipping cells tagged skip-when-grading),
grades every InterpreterBackend, CodegenBackend and RewriteRules defined there, prints one table
each (and one for all its GPU puzzle kernels, chapter 8c), and exits with 0 when everything
passes. The grader itself is autograder.py.

(The file is the package's `__main__`, not a module named after the command: a submodule
`grade` would replace the function `grade` that the package exports, as soon as it was imported.)

Builds on: exercises/autograder.py.
"""
import sys

from tinyteach.exercises.autograder import main

if __name__ == "__main__":
    sys.exit(main())
