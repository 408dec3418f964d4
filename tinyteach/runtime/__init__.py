"""Chapter 9: the backends, one module per device — numpy, cpu, opencl, webgpu, cuda (python: 8b).

The settings of a backend live in settings.py, not in its module: `import tinyteach` imports
them (not the backends, which load when a device is first used), so `Context(CPU_TIERED=0)` is
known before the CPU device has ever been opened. CPU_TIERED is re-exported here, where it was."""
from tinyteach.settings import CPU_TIERED  # noqa: F401  (0: every kernel waits for gcc -O2)
