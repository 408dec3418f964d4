"""tinyteach's benchmark suite: `python benchmarks/run.py` (see benchmarks/README.md).

Modules: `run` (orchestrates the subprocesses and prints the table), `worker` (one framework,
one workload, in its own process), `data` (the shared inputs, from a fixed numpy seed),
`timing` (clocks and medians), and one `impl_*` module per kind of framework.
"""
