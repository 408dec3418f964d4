from nbhelp import Book


def build() -> Book:
    b = Book("dev")
    b.md("""
    # Chapter 9 — Devices and runtimes

    Chapters 6-8 produce, for each kernel, an AST, a linear program and source code. This chapter
    is about what finally runs them:

    - a **backend** is three small pieces: an **Allocator** (get memory, copy bytes in and out), a
      **Compiler** (source → binary) and a **Program** (run a binary on buffers);
    - two kinds of backend: the **NUMPY** device *interprets* a kernel's ops with numpy (no
      renderer, no compiler), the **CPU** device *compiles* the generated C with gcc or clang and
      calls it with ctypes. Same schedule, same results;
    - the **engine** (`realize.py`): schedule → get a runnable program per kernel → run them in
      order, counting everything in `GlobalCounters`. Programs are cached, in memory and on disk;
    - `Device.DEFAULT` and `DEV=NAME` choose the device; a `Buffer` is allocated when first needed
      and freed when nothing refers to it.

    Modules: [`tinyteach/device.py`](../tinyteach/device.py) (Allocator, Compiler, Buffer, Device),
    [`tinyteach/realize.py`](../tinyteach/realize.py) (the engine),
    [`runtime/numpy.py`](../tinyteach/runtime/numpy.py) (the interpreter, and the reference
    meaning of every primitive op) and [`runtime/cpu.py`](../tinyteach/runtime/cpu.py) (compiled C).
    """)
    b.setup('''
    import gc
    import os
    import subprocess
    import sys
    import weakref

    from tinyteach.device import Buffer
    from tinyteach.dtype import dtypes
    from tinyteach.realize import _runner_cache, get_runner
    from tinyteach.schedule import create_schedule
    ''')
    b.md("""
    ## A backend is three pieces

    `Device[name]` loads a backend by name. Look at what the two host devices are made of:
    """)
    b.code('''
    def describe(name):
        backend = Device[name]
        parts = {"allocator": backend.allocator, "renderer": backend.renderer,
                 "compiler": backend.compiler}
        print(name)
        for part, value in parts.items():
            print(f"  {part:9}: {type(value).__name__ if value is not None else None}")
        print(f"  program  : {getattr(backend.program, '__name__', type(backend.program).__name__)}")

    describe("NUMPY")
    describe("CPU")
    assert Device["NUMPY"].renderer is None and Device["NUMPY"].compiler is None
    ''')
    b.md("""
    Both keep their memory in the host's RAM (`HostAllocator`). The NUMPY device has neither a
    renderer nor a compiler: its program walks the kernel's AST. The CPU device renders C
    (chapter 8) and compiles it.

    ## Choosing a device

    The first cell of every chapter sets `Device.DEFAULT = "CPU"`. Without that, tinyteach picks
    the best device available, and the environment variable `DEV=NAME` (or tinygrad's `NAME=1`)
    overrides the choice. Settings are read when a program starts, so we start small Python
    programs to see it:
    """)
    b.code('''
    def default_device_with(**environment):
        program = "from tinyteach import Device; print(Device.DEFAULT)"
        result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                                env={**os.environ, **environment})
        return result.stdout.strip() or result.stderr.strip().splitlines()[-1]

    print("DEV=NUMPY ->", default_device_with(DEV="NUMPY"))
    print("NUMPY=1   ->", default_device_with(NUMPY="1"))
    print("DEV=CPU   ->", default_device_with(DEV="CPU"))
    assert default_device_with(DEV="NUMPY") == "NUMPY"
    ''')
    b.md("""
    A tensor can also name its device, and `.to()` copies between devices:
    """)
    b.code('''
    x_numpy = Tensor([1.0, 2.0, 3.0], device="NUMPY")
    x_cpu = x_numpy.to("CPU")
    print(x_numpy.device, x_cpu.device, (x_cpu * 2).tolist())
    assert Device.DEFAULT == "CPU" and Device.is_available("NUMPY")
    ''')
    b.md("""
    ## Buffers: allocated late, freed by Python

    A `Buffer` is a size and a dtype on a device. It takes no memory until something needs its
    storage — a copy in, or a kernel that writes it:
    """)
    b.code('''
    buffer = Buffer("CPU", 4, dtypes.float32)
    print(buffer)
    buffer.copyin(np.array([1, 2, 3, 4], dtype=np.float32))
    print(buffer)
    print(buffer.numpy())
    assert buffer.is_allocated
    ''')
    b.md("""
    The schedule creates the output buffers of its kernels, but allocates nothing: allocation
    happens in the engine, right before a kernel runs.
    """)
    b.code('''
    a = Tensor(rng.standard_normal((4, 4)).astype(np.float32)).realize()
    items, _ = create_schedule([(a * 2).sum(1).uop], "CPU")
    print("before running:", items[0].output)
    ''')
    b.md("""
    Nobody frees a buffer by hand: when the last tensor (or schedule item) that refers to it is
    gone, Python's garbage collector releases the memory. A weak reference lets us watch that
    happen without keeping the buffer alive:
    """)
    b.code('''
    def buffer_of(tensor):
        node = tensor.uop
        while node.op.name == "RESHAPE":
            node = node.src[0]
        return node.arg

    temporary = (a + 1).realize()
    watcher = weakref.ref(buffer_of(temporary))
    print("while the tensor lives:", watcher())
    del temporary
    gc.collect()
    print("after `del` :", watcher())
    assert watcher() is None
    ''')
    b.md("""
    ## One schedule, two backends

    The schedule is the same for every device: only `item.device` differs. Here is softmax on both
    host devices — three kernels each:
    """)
    b.code('''
    data = rng.standard_normal((3, 5)).astype(np.float32)
    on_numpy = Tensor(data, device="NUMPY").softmax(1)
    on_cpu = Tensor(data, device="CPU").softmax(1)
    for tensor in (on_numpy, on_cpu):
        items, _ = create_schedule([tensor.uop], tensor.device)
        print(tensor.device, [(item.name, item.device) for item in items])
    ''')
    b.md("""
    The engine's `get_runner` turns an item into something runnable. For NUMPY the runner holds an
    interpreter and no source; for CPU it holds the linear program, the C source and the loaded
    function:
    """)
    b.code('''
    for tensor in (on_numpy, on_cpu):
        items, _ = create_schedule([tensor.uop], tensor.device)
        runner = get_runner(items[-1])
        source = "no source (interpreted)" if runner.source is None else \\
            f"{len(runner.source.splitlines())} lines of C"
        print(f"{runner.device:5} {runner.name}: {source}; program {type(runner.program).__name__}")
    ''')
    b.md("""
    and the results agree to float rounding — the NUMPY device is the reference every other
    backend is tested against:
    """)
    b.code('''
    np.testing.assert_allclose(on_cpu.numpy(), on_numpy.numpy(), rtol=1e-6)
    np.testing.assert_allclose(on_cpu.numpy().sum(1), np.ones(3), rtol=1e-6)
    print(on_cpu.numpy().round(3))
    ''')
    b.md("""
    What does "interpret" mean? The NUMPY device has one small numpy function per primitive op —
    this table *is* the definition of what each op means:
    """)
    b.code('''
    from tinyteach.runtime.numpy import NUMPY_OPS
    from tinyteach.uop import PRIMITIVE_OPS

    print(len(NUMPY_OPS), "numpy functions;", len(PRIMITIVE_OPS), "primitive ops")
    print(sorted(op.name for op in NUMPY_OPS)[:10], "...")
    ''')
    b.md("""
    ## Compiling once: two caches

    Compiling C costs tens of milliseconds, so the engine never does it twice:

    1. **in memory**, runners are cached by kernel AST. New *data* with the same shapes gives the
       same AST (inputs are `DEFINE_GLOBAL`s, not values), so nothing is compiled again;
    2. **on disk**, the compiled shared object is keyed by a hash of the source, the compiler and
       its flags, under `$TINYTEACH_CACHE` (default `~/.cache/tinyteach`): a new Python process
       reuses it.
    """)
    b.code('''
    x1 = Tensor(rng.standard_normal((8, 8)).astype(np.float32)).realize()
    (x1.exp() * 3).sum(0).realize()
    cached_before = len(_runner_cache)
    x2 = Tensor(rng.standard_normal((8, 8)).astype(np.float32)).realize()  # new data, same shape
    (x2.exp() * 3).sum(0).realize()
    print("runners compiled for the second call:", len(_runner_cache) - cached_before)
    assert len(_runner_cache) == cached_before
    ''')
    b.md("""
    The disk cache, in a fresh temporary directory so that we see it fill (the path is not
    printed: it differs on every run). The second compile of the same source is a lookup:
    """)
    b.code('''
    import tempfile
    import time
    from pathlib import Path

    compiler = Device["CPU"].compiler
    source = "void add_one(float* restrict out) { out[0] += 1.0f; }\\n"
    saved = os.environ.get("TINYTEACH_CACHE")
    with tempfile.TemporaryDirectory() as directory:
        os.environ["TINYTEACH_CACHE"] = directory
        start = time.perf_counter()
        first = compiler.compile(source)
        compile_seconds = time.perf_counter() - start
        start = time.perf_counter()
        second = compiler.compile(source)
        lookup_seconds = time.perf_counter() - start
        files = sorted(p.suffix for p in Path(directory).rglob("*") if p.is_file())
        print("files in the cache:", files)
        print("same file both times:", first == second)
        print("the lookup is >10x faster than compiling:", lookup_seconds * 10 < compile_seconds)
        assert first == second and files == [".so"]
    if saved is None:
        del os.environ["TINYTEACH_CACHE"]
    else:
        os.environ["TINYTEACH_CACHE"] = saved
    ''')
    b.md("""
    A kernel that does not compile raises `CompileError` with the compiler's message and the
    offending source line — never a crash deep inside ctypes:
    """)
    b.code('''
    from tinyteach.device import CompileError

    try:
        compiler.compile("void broken(float* out) { out[0] = 1.0f }\\n")
    except CompileError as error:
        message = str(error)
        print(message.splitlines()[0])
        print([line for line in message.splitlines() if line.startswith("  line")])
    ''')
    b.md("""
    ## Counting: `GlobalCounters` and `DEBUG=2`

    The engine counts every launch: kernels, estimated arithmetic operations, and bytes of the
    buffers each kernel touches (time too, which we do not print). `DEBUG=1` prints a line per
    launch and `DEBUG=2` adds its time (replaced by `TIME` in the stored notebook).
    """)
    b.code('''
    y = Tensor(rng.standard_normal((16, 16)).astype(np.float32)).realize()
    GlobalCounters.reset()
    with Context(DEBUG=2):
        (y @ y).relu().sum().realize()
    print("kernels:", GlobalCounters.kernel_count, " ops:", GlobalCounters.global_ops,
          " bytes:", GlobalCounters.global_mem)
    assert GlobalCounters.kernel_count == 2
    ''')
    b.md("""
    `%%tinyteach` shows the same launches, with what each one fused and how long it took:
    """)
    b.code('''
    %%tinyteach --show kernels
    z = Tensor(rng.standard_normal((16, 16)).astype(np.float32))
    (z.softmax(1) * 2).realize()
    ''')
    b.md("## Try it")
    b.exercise("interpreter vs compiler", """
        Realize `(t * t).sum()` for `t = Tensor(np.arange(10, dtype=np.float32), device=...)` on
        both NUMPY and CPU and check the results agree. Which of the two runners has a `.linear`
        program?
        """, '''
        results = {}
        for name in ("NUMPY", "CPU"):
            t = Tensor(np.arange(10, dtype=np.float32), device=name)
            items, _ = create_schedule([(t * t).sum().uop], name)
            runner = get_runner(items[0])
            results[name] = (t * t).sum().item()
            print(name, results[name], "linear program:", runner.linear is not None)
        assert results["NUMPY"] == results["CPU"] == 285.0
        ''')
    b.exercise("count the bytes", """
        Before running it, predict `GlobalCounters.global_mem` for `(p + q).realize()` with two
        realized 4×4 float32 tensors `p` and `q`. Then check.
        """, '''
        p = Tensor(np.ones((4, 4), dtype=np.float32)).realize()
        q = Tensor(np.full((4, 4), 2, dtype=np.float32)).realize()
        GlobalCounters.reset()
        (p + q).realize()
        print(GlobalCounters.global_mem, "bytes")  # 3 buffers (out, p, q) x 16 floats x 4 bytes
        assert GlobalCounters.global_mem == 3 * 16 * 4
        ''')
    b.exercise("your own Program", """
        A backend's Program is just a callable on buffers. Compile this C with
        `Device["CPU"].compiler`, load it with `Device["CPU"].program("scale", path)` and run it on
        a 4-element Buffer: `void scale(float* restrict out) { for (int i = 0; i < 4; i++)
        out[i] *= 2.0f; }`.
        """, '''
        path = Device["CPU"].compiler.compile(
            "void scale(float* restrict out) { for (int i = 0; i < 4; i++) out[i] *= 2.0f; }\\n")
        scale = Device["CPU"].program("scale", path)
        values = Buffer("CPU", 4, dtypes.float32).copyin(np.arange(4, dtype=np.float32))
        scale(values)
        print(values.numpy())
        assert values.numpy().tolist() == [0.0, 2.0, 4.0, 6.0]
        ''')
    return b
