"""The backends, one module per device: numpy (the reference interpreter), cpu (generated C)."""
