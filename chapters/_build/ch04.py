"""Chapter 4: Views."""
from nbtools import Book


def chapter_04(setup: str) -> Book:
    b = Book("views")
    b.md("""
    # Chapter 4 — Shapes without copies: views

    `reshape`, `permute`, `expand`, `pad`, `shrink` and `flip` never move data. Each one is a
    small *function from an index into its output to an index into its input*. Follow a chain of
    them down to a buffer and you get, for every output element, the address to read.

    **What you will learn**
    - the index function of each movement op (and, for `pad`, the condition saying whether the
      element exists at all);
    - composing them with `index_into_buffer`, and checking the result element by element;
    - why the raw expressions look clumsy — and why that is fine, because chapter 5 simplifies
      them.

    **Where it lives:** [`tinyteach/view.py`](../tinyteach/view.py). Its user is
    [`lower.py`](../tinyteach/lower.py), which turns these expressions into the loads of
    generated code (chapter 7).
    """)
    b.code(setup)
    b.code("""
    from tinyteach.uop import UOp, Ops
    from tinyteach.view import view_index, index_into_buffer
    from viz.rewrites import expression   # prints an index UOp as a formula: ((gidx0*4)+gidx1)
    """)
    b.md("""
    ## Movement ops are views

    A realized tensor is a `BUFFER` node (a flat block of memory) plus, usually, a `RESHAPE`.
    Transposing it adds a `PERMUTE` node on top — the buffer is the very same object, and no
    kernel runs:
    """)
    b.code("""
    base_np = np.arange(12, dtype=np.float32).reshape(3, 4)
    base = Tensor(base_np)
    GlobalCounters.reset()
    transposed = base.permute(1, 0)
    print(transposed.uop)
    print("kernels run:", GlobalCounters.kernel_count)
    assert transposed.uop.src[0] is base.uop    # the PERMUTE reads the original node
    """)
    b.md("""
    ## An index is a tuple of integer UOps

    To talk about "element `(i, j)` of the output" we need symbols for `i` and `j`. Loop
    counters are `RANGE` nodes (`gidx0 < 4`, `gidx1 < 3`); an index is a tuple with one per
    output axis. `view_index(node, index)` maps it through one movement op:
    """)
    b.code("""
    def ranges(shape: tuple[int, ...]) -> tuple[UOp, ...]:
        return tuple(UOp(Ops.RANGE, dtypes.int32, (), ("g", axis, size))
                     for axis, size in enumerate(shape))

    def show(node: UOp) -> None:
        index = ranges(node.shape)
        source_index, valid = view_index(node, index)
        out = ", ".join(expression(i) for i in index)
        into = ", ".join(expression(i) for i in source_index)
        condition = "" if valid is None else f"   if {expression(valid)}"
        print(f"{node.op.name:>8} {str(node.src[0].shape):>8} -> {str(node.shape):<8}"
              f" out[{out}] = in[{into}]{condition}")

    square = base.uop   # shape (3, 4)
    show(square.permute((1, 0)))
    show(square.reshape((12,)))
    show(square.reshape((2, 6)))
    show(square.shrink(((1, 3), (0, 2))))
    show(square.flip((1,)))
    show(square.pad(((1, 1), (0, 0))))
    show(square.reshape((3, 1, 4)).expand((3, 5, 4)))
    """)
    b.md("""
    Read each line as a rule:

    - **permute** swaps which counter goes where;
    - **reshape** flattens the output index to a position (`i*6 + j`) and unflattens it into the
      input shape (`// 4`, `% 4`);
    - **shrink** adds the start offset; **flip** reads from the other end (`3 - j`);
    - **pad** shifts by the padding, and the element only exists where the shifted index is in
      range — outside, the load is skipped and gives 0. (`!(i-1 < 0) & (i-1 < 3)` is `0 ≤ i-1 < 3`
      written with the only comparison op we have, `<`);
    - **expand** reads element 0 of a broadcast axis, whatever the output index is.

    ## Composing views down to the buffer

    `index_into_buffer` applies these maps one after another, from the top of a chain of
    movement ops down to the `BUFFER`, and flattens the final index into a position in memory.
    """)
    b.code("""
    chain = base[:, ::-1].permute(1, 0)[1:3]      # flip, permute, shrink: still a view
    buffer, position, valid = index_into_buffer(chain.uop, ranges(chain.shape))
    print("shape", chain.shape, "reads", buffer.op.name, buffer.arg)
    print("position:", expression(position))
    print("valid:   ", valid)
    """)
    b.md("""
    To check the formula, evaluate it for every output index and read the numpy buffer at that
    position. A small evaluator substitutes numbers for the `RANGE`s, using the same Python
    reference semantics as constant folding (`PYTHON_ALU`, chapter 5):
    """)
    b.code("""
    import itertools
    from tinyteach.rewrite import PYTHON_ALU

    def evaluate(node: UOp, env: dict[UOp, int]):
        if node.op is Ops.RANGE:
            return env[node]
        if node.op is Ops.CONST:
            return node.arg
        return PYTHON_ALU[node.op](*(evaluate(s, env) for s in node.src))

    def gather_through_view(view: Tensor, flat: np.ndarray) -> np.ndarray:
        index = ranges(view.shape)
        buffer, position, valid = index_into_buffer(view.uop, index)
        out = np.zeros(view.shape, flat.dtype)
        for values in itertools.product(*(range(s) for s in view.shape)):
            env = dict(zip(index, values))
            if valid is None or evaluate(valid, env):
                out[values] = flat[evaluate(position, env)]
        return out

    flat = base_np.reshape(-1)
    assert np.array_equal(gather_through_view(chain, flat), base_np[:, ::-1].T[1:3])
    gather_through_view(chain, flat)
    """)
    b.md("""
    The same check on a view with padding (the zeros come from the `valid` condition) and on
    one with a broadcast:
    """)
    b.code("""
    padded = base.pad(((1, 0), (0, 2))).flip(0)
    assert np.array_equal(gather_through_view(padded, flat),
                          np.pad(base_np, ((1, 0), (0, 2)))[::-1])
    stretched = base[1].reshape(1, 4).expand(3, 4).permute(1, 0)
    assert np.array_equal(gather_through_view(stretched, flat),
                          np.broadcast_to(base_np[1], (3, 4)).T)
    print("both views agree with numpy")
    """)
    b.md("""
    ## Why the raw expressions are clumsy

    Each map is simple, but composing them naively piles up arithmetic. Flattening to `(12,)`
    and unflattening back to `(3, 4)` changes nothing, yet:
    """)
    b.code("""
    round_trip = base.reshape(12).reshape(3, 4).permute(1, 0)
    _, position, _ = index_into_buffer(round_trip.uop, ranges(round_trip.shape))
    print(expression(position))
    print(len(position.toposort), "nodes")
    """)
    b.md("""
    The position of element `(gidx0, gidx1)` of `round_trip` is simply `gidx1*4 + gidx0`, but
    the formula adds zeros, multiplies by one, and divides and takes remainders it does not
    need. Every generated load would pay for that.
    Knowing that `0 ≤ i < 4` and `0 ≤ j < 3` (the `vmin`/`vmax` of chapter 3), a rewrite pass can
    remove it — that is chapter 5's `symbolic`:
    """)
    b.code("""
    from tinyteach.rewrite import graph_rewrite, symbolic
    simplified = graph_rewrite(position, symbolic)
    print(expression(simplified), "-", len(simplified.toposort), "nodes")
    assert simplified is graph_rewrite(ranges((4, 3))[1] * 4 + ranges((4, 3))[0], symbolic)
    """)
    b.md("""
    Going through `(6, 2)` instead of `(12,)` is harder: the first reshape splits the index into
    a quotient and a remainder, and the second merges them back. The raw formula contains
    `(x//4)*4 + x%4`, which is just `x`; `symbolic` has a rule for exactly that (chapter 5), and
    the result is as tidy as before.
    """)
    b.code("""
    detour = base.reshape(6, 2).reshape(3, 4)
    _, position, _ = index_into_buffer(detour.uop, ranges(detour.shape))
    print(expression(graph_rewrite(position, symbolic)))
    """)
    b.md("""
    tinygrad keeps views in a different form (`ShapeTracker`: shape, strides, offset and mask per
    view, merged when possible); tinyteach keeps the movement ops in the graph and derives index
    arithmetic from them, leaving the tidying to the rewriter. The result — one formula per
    load — is the same.

    ## Try it

    1. Write the index map of a 2-D transpose by hand (`(i, j) -> (j, i)`) and check it against
       what `view_index` gives for `square.permute((1, 0))`.
    2. For `t = base.reshape(4, 3).permute(1, 0)[::2]`, which position of the buffer does
       element `t[1, 2]` read? Work it out, then check with `index_into_buffer`.
    3. Is `base.pad(((2, 0), (0, 0))).shrink(((2, 5), (0, 4)))` the original tensor? Look at its
       position and validity formulas before and after `symbolic`.
    """)
    b.solution(1, """
    i, j = ranges((4, 3))
    (source_i, source_j), valid = view_index(square.permute((1, 0)), (i, j))
    assert (source_i, source_j) == (j, i) and valid is None
    print(expression(source_i), expression(source_j))
    """)
    b.solution(2, """
    t = base.reshape(4, 3).permute(1, 0)[::2]
    index = ranges(t.shape)
    _, position, valid = index_into_buffer(t.uop, index)
    env = dict(zip(index, (1, 2)))
    where = evaluate(position, env)
    # t[1, 2] = reshaped[2, 2*1] -> row 2 of the (4, 3) reshape, column 2 -> 2*3 + 2 = 8
    assert where == 8 and flat[where] == t.numpy()[1, 2]
    where
    """)
    b.solution(3, """
    back = base.pad(((2, 0), (0, 0))).shrink(((2, 5), (0, 4)))
    index = ranges(back.shape)
    _, position, valid = index_into_buffer(back.uop, index)
    print("raw:       ", expression(position), " valid:", expression(valid))
    print("simplified:", expression(graph_rewrite(position, symbolic)),
          " valid:", expression(graph_rewrite(valid, symbolic)))
    assert np.array_equal(back.numpy(), base_np)
    """)
    return b
