"""The backends, one module per device: numpy (the reference interpreter), cpu (generated C).

The settings of a backend live here, not in its module: `import tinyteach` imports this
package (not the backends, which load when a device is first used), so `Context(CPU_TIERED=0)`
is known before the CPU device has ever been opened."""
from tinyteach.helpers import ContextVar

CPU_TIERED = ContextVar("CPU_TIERED", 1)  # 0: no fast tier, every kernel waits for gcc -O2
