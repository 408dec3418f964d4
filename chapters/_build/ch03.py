"""Chapter 3: The IR."""
from nbtools import Book


def chapter_03(setup: str) -> Book:
    b = Book("ir")
    b.md("""
    # Chapter 3 — The IR: UOps and the primitive op set

    Every stage of the compiler speaks one language. A Tensor is a graph of `UOp`s; a kernel
    handed to the code generator is a graph of `UOp`s; even the loops and loads of a lowered
    kernel are `UOp`s. Learning this one node type is learning to read the whole stack.

    **What you will learn**
    - a node is `UOp(op, dtype, src, arg)`: what it does, what it produces, its inputs, and an
      op-specific argument;
    - the backend contract is 28 primitive ops (`PRIMITIVE_OPS`), each with reference semantics;
    - nodes are *hash-consed*: building the same node twice gives the same object, so equal
      subgraphs are shared for free;
    - every node knows its shape, and integer nodes know their smallest and largest value;
    - how to print a graph (`pretty`) and draw it (`viz.graph`).

    **Where it lives:** [`tinyteach/uop.py`](../tinyteach/uop.py).
    """)
    b.code(setup)
    b.code("""
    from tinyteach.uop import UOp, Ops, PRIMITIVE_OPS, pretty
    """)
    b.md("""
    ## One node type

    A `UOp` is a frozen dataclass with four fields. Constants have no sources; an `ADD` has two.
    Python operators on UOps build nodes (a scalar is turned into a constant of the same dtype).
    """)
    b.code("""
    three = UOp.const(dtypes.int32, 3)
    expression = three * 4 + 1
    print(expression.op, expression.dtype, expression.arg)
    print([source.op.name for source in expression.src])
    print(pretty(expression))
    """)
    b.md("""
    `pretty` prints a graph one node per line, sources before users, numbering the nodes; a node
    used twice is printed once and referred to by number (`repr` of a UOp does the same).

    ## The primitive op set

    `Ops` has more members than the backend contract: `CONTIGUOUS`, `DETACH` and `ASSIGN` shape
    the graph for the Tensor layer, and `RANGE`, `LOAD`, `STORE`… appear only inside lowered
    kernels (chapter 7). What a backend must implement is `PRIMITIVE_OPS`:
    """)
    b.code("""
    print(len(Ops), "ops in all;", len(PRIMITIVE_OPS), "primitive:")
    print(", ".join(op.name for op in PRIMITIVE_OPS))
    print("not primitive:", ", ".join(op.name for op in Ops if op not in PRIMITIVE_OPS))
    assert len(PRIMITIVE_OPS) == 28
    """)
    b.md("""
    Each primitive op has *reference semantics*: one numpy function in the `NUMPY` device,
    [`runtime/numpy.py`](../tinyteach/runtime/numpy.py). Integer ops follow C, not Python:
    `IDIV` truncates toward zero and `MOD` takes the sign of the dividend. Running the same tiny
    graph on the reference device and on compiled C gives the same answer:
    """)
    b.code("""
    a = Tensor([7, -7, 7, -7], dtype=dtypes.int32)
    d = Tensor([2, 2, -2, -2], dtype=dtypes.int32)
    c_idiv = Tensor(a.uop.alu(Ops.IDIV, d.uop), "CPU").numpy()
    c_mod = Tensor(a.uop.alu(Ops.MOD, d.uop), "CPU").numpy()
    ref_idiv = Tensor(a.to("NUMPY").uop.alu(Ops.IDIV, d.to("NUMPY").uop), "NUMPY").numpy()
    assert np.array_equal(c_idiv, ref_idiv)
    assert np.array_equal(c_idiv, np.trunc(a.numpy() / d.numpy()).astype(np.int32))
    assert np.array_equal(c_mod, np.fmod(a.numpy(), d.numpy()))
    print("IDIV:", c_idiv, "  MOD:", c_mod, "  (Python's // would give", a.numpy() // d.numpy(), ")")
    """)
    b.md("""
    ## Shapes are derived, not stored

    A node's shape follows from its sources and its arg (`SHAPE_RULES` in uop.py): movement ops
    say their new shape in the arg, `REDUCE_AXIS` keeps reduced axes with size 1, elementwise ops
    take their sources' shape.
    """)
    b.code("""
    x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    node = x.uop
    for step in [node.permute((1, 0)), node.reshape((6,)), node.expand((2, 3)).reduce(Ops.ADD, (1,)),
                 node.pad(((1, 0), (0, 2))), node.shrink(((0, 1), (1, 3)))]:
        arg = (step.arg[0].name, step.arg[1]) if step.op is Ops.REDUCE_AXIS else step.arg
        print(f"{step.op.name:<12} arg={str(arg):<22} shape {step.shape}")
    """)
    b.md("""
    ## Hash-consing: equal nodes are the same object

    `UOp(...)` first looks the node up in a table keyed by `(op, dtype, src, arg)`; if an
    identical node is alive it returns that one. So structural equality *is* identity, and
    building an expression twice does not build two graphs:
    """)
    b.code("""
    assert (three * 4 + 1) is expression
    x = Tensor([1.0, 2.0])
    assert ((x + 1) * 2).uop is ((x + 1) * 2).uop
    print("same object:", (three * 4 + 1) is expression)
    """)
    b.md("""
    This gives common-subexpression elimination by construction. Below, `(x + 1)` is written
    three times but exists once in the graph: the `MUL` reads the same node twice, and the last
    `ADD` reads it again.
    """)
    b.code("""
    y = (x + 1) * (x + 1) + (x + 1)
    nodes = y.uop.toposort
    adds = [n for n in nodes if n.op is Ops.ADD]
    print(len(nodes), "nodes;", len(adds), "ADD nodes")
    print(y.uop)
    assert np.array_equal(y.numpy(), (x.numpy() + 1) ** 2 + x.numpy() + 1)
    """)
    b.md("""
    A subtle detail: the table keeps `0.0` and `-0.0` apart (they compare equal in Python but
    `1/x` differs), and likewise `1` and `True`.
    """)
    b.code("""
    print(UOp.const(dtypes.float32, 0.0) is UOp.const(dtypes.float32, -0.0))
    """)
    b.md("""
    ## Value bounds

    Integer nodes know their smallest and largest value (`vmin`, `vmax`). A `RANGE` is a loop
    counter `0 ≤ r < n`; bounds propagate through `+`, `*`, `//`, `%`. The rewrite chapter uses
    them to prove that, for example, `(i*8 + j) // 8` is just `i` when `j < 8`.
    """)
    b.code("""
    i = UOp(Ops.RANGE, dtypes.int32, (), ("g", 0, 4))   # 0 <= i < 4
    j = UOp(Ops.RANGE, dtypes.int32, (), ("g", 1, 8))   # 0 <= j < 8
    for e in [i, i * 8 + j, (i * 8 + j) // 8, (i * 8 + j) % 8, i * -3]:
        print(f"{str(e.op.name):>6}: {e.vmin} .. {e.vmax}")
    """)
    b.md("""
    ## Drawing graphs

    `viz.graph` draws a Tensor's graph (or a UOp's). Each box shows op, shape and dtype; chains
    of movement ops are folded into one box (they cost nothing — chapter 4); colours are the
    kernels the scheduler will make (chapter 6). Nothing is computed to draw it.
    """)
    b.code("""
    p = Tensor(rng.standard_normal((3, 4)).astype(np.float32))
    q = Tensor(rng.standard_normal((3, 4)).astype(np.float32))
    out = ((p + q) * 2).relu().sum(1)
    viz.graph(out)
    """)
    b.md("""
    The same view without folding shows every node, and `repr` prints the text form of the
    figure (what a terminal shows):
    """)
    b.code("""
    figure = viz.graph(out, collapse_movement=False)
    print(figure)
    """)
    b.md("""
    ## Try it

    1. How many nodes does the graph of `Tensor.ones(4, 4).softmax()` have, and which primitive
       ops does it use?
    2. Write a tiny interpreter `evaluate(node)` for scalar UOps made of `CONST`, `ADD`, `MUL`,
       `NEG` and `MAX`, and check it on `(c * 4 + 1).maximum(-c)` for `c = 3`.
    3. Build `x * 2 + x * 2` (x a Tensor). How many `MUL` nodes are in the graph? Why?
    """)
    b.solution(1, """
    graph = Tensor.ones(4, 4).softmax().uop.toposort
    print(len(graph), "nodes:", sorted({n.op.name for n in graph}))
    """)
    b.solution(2, """
    SCALAR_OPS = {Ops.ADD: lambda a, b: a + b, Ops.MUL: lambda a, b: a * b,
                  Ops.NEG: lambda a: -a, Ops.MAX: max}

    def evaluate(node: UOp):
        if node.op is Ops.CONST:
            return node.arg
        return SCALAR_OPS[node.op](*(evaluate(s) for s in node.src))

    c = UOp.const(dtypes.int32, 3)
    assert evaluate((c * 4 + 1).maximum(-c)) == 13
    evaluate((c * 4 + 1).maximum(-c))
    """)
    b.solution(3, """
    x = Tensor([1.0, 2.0])
    muls = [n for n in (x * 2 + x * 2).uop.toposort if n.op is Ops.MUL]
    print(len(muls), "MUL node: both `x * 2` are the same hash-consed UOp")
    """)
    return b
