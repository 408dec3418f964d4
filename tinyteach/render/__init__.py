"""Chapter 8: code generation — a linear program becomes source code.

What this teaches:
- a renderer walks the linear program once, giving each value a name and each op a snippet of
  source. C, OpenCL C, CUDA C and WGSL differ in a handful of places (how a kernel and its
  parameters are declared, type names, how loops and constants are written), so one
  `CStyleRenderer` serves them all, with small subclasses;
- values used once are written inline (`data0[i] = (val0+val1)`), values used more than once get
  a name (`alu0`), loads always get one (`val0`), so the code reads like a person wrote it.

The contract: `code_for_op`
---------------------------
Every ALU op is one entry of the class-level table `code_for_op`, and every entry has the same
signature — the one exercise B asks a student to implement:

    def code(renderer, operands, operand_dtypes, dtype) -> str

- `renderer`: the renderer, for the language's words: `renderer.type_name(dtype)`,
  `renderer.render_const(value, dtype)`, `renderer.where(condition, if_true, if_false)`;
- `operands`: the source text of each operand, in order (`["val0", "1.0f"]`);
- `operand_dtypes`: the dtype of each operand (WHERE's first operand is a bool);
- `dtype`: the dtype of the result (bool for CMPLT and CMPNE; for CAST, the dtype to convert to).

It returns one C-like expression, in parentheses (it is pasted into bigger ones). For a vector
value (DType.vec) an entry is called with the dtypes of one lane. A language changes entries by
merging tables: `code_for_op = {**CStyleRenderer.code_for_op, Ops.MAX: wgsl_max}`.

A bitcast (a CAST with arg BITCAST: the same bits, read as another dtype of the same size) is
no entry of the table: it is `renderer.bitcast(operand, source_dtype, dtype)`, where each
language says how it reinterprets bits — C and CUDA through a few functions that read a float's
bits as the signed integer of its size and back (`bits_functions`), OpenCL with `as_float`,
WGSL with `bitcast<f32>`. Never with arithmetic: every bit pattern, NaN payloads included, must
come out as it went in.

Everything else a renderer knows about one kernel while it renders it (each value's name, the
loop depth, a GPU kernel's launch) lives in the `KernelWriter` of that render, never on the
renderer, which all kernels of a device share: two kernels can be rendered at once.

GPU kernels add a few words a GPU language gives (render/gpu.py): `define_local` (shared memory),
`local_id` (SPECIAL), `barrier`, and loops over work-groups; every language writes a guarded
load so that an invalid index is never read (`guarded_load`) and a gated store as an `if`
(`gated_store`). A LOAD's and a STORE's parts come from uop.load_parts / store_parts.

Builds on: ir/uop.py, codegen/lower.py (LinearProgram). Used by: the compiled runtimes
(runtime/cpu.py, ...).

>>> from tinyteach.dtype import dtypes
>>> renderer = CStyleRenderer()
>>> renderer.code_for_op[Ops.ADD](renderer, ["a", "b"], [dtypes.float32] * 2, dtypes.float32)
'(a+b)'
>>> renderer.code_for_op[Ops.IDIV](renderer, ["a", "b"], [dtypes.int32] * 2, dtypes.int32)
'(b==0?0:(b==-1?-(a):a/b))'
"""
from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from tinyteach.codegen.lower import LinearProgram, ProgramSpec, spec_of
from tinyteach.device import Capabilities
from tinyteach.dtype import DType, dtypes
from tinyteach.ir.uop import ALU, Ops, UOp, is_bitcast, load_parts, store_parts

# values written inline where they are used, when they are used once
INLINE_OPS = set(ALU) | {Ops.CONST}
# an inline expression nests at most this deep, then gets a name: C compilers limit how deeply
# parentheses nest (clang, which OpenCL drivers use, stops at 256), and x+1 chained 1,000 times
# would nest 1,000 deep
MAX_INLINE_DEPTH = 64

CodeForOp = Callable[["CStyleRenderer", list[str], list[DType], DType], str]
"""One entry of `code_for_op`: (renderer, operands, operand_dtypes, dtype) -> expression."""


# ---- entries that every C-like language shares ----

def infix(symbol: str) -> CodeForOp:
    """`(a+b)`, `(a<b)`, ...: an operator written between its two operands."""
    def code(renderer: CStyleRenderer, operands: list[str], operand_dtypes: list[DType],
             dtype: DType) -> str:
        a, b = operands
        return f"({a}{symbol}{b})"
    return code


def logic(bool_symbol: str, int_symbol: str) -> CodeForOp:
    """AND, OR and XOR: `bool_symbol` on bools, bitwise on integers (`&`). (C's `&` and `|`
    give the same 0 or 1 as `&&` and `||` on bools, without the short circuit: the operands
    are plain values, and a branch-free expression lets gcc vectorize instead of jumping.)"""
    def code(renderer: CStyleRenderer, operands: list[str], operand_dtypes: list[DType],
             dtype: DType) -> str:
        a, b = operands
        return f"({a}{bool_symbol if dtype == dtypes.bool else int_symbol}{b})"
    return code


def math_function(name: str) -> CodeForOp:
    """`exp2(a)`: a math function that the language overloads for every float type."""
    def code(renderer: CStyleRenderer, operands: list[str], operand_dtypes: list[DType],
             dtype: DType) -> str:
        return f"{name}({operands[0]})"
    return code


def negate(renderer: CStyleRenderer, operands: list[str], operand_dtypes: list[DType],
           dtype: DType) -> str:
    (a,) = operands
    return f"(!{a})" if dtype == dtypes.bool else f"(-({a}))"  # -(a): -(-1) is not --1


def reciprocal(renderer: CStyleRenderer, operands: list[str], operand_dtypes: list[DType],
               dtype: DType) -> str:
    return f"({renderer.render_const(1, dtype)}/{operands[0]})"


def cast(renderer: CStyleRenderer, operands: list[str], operand_dtypes: list[DType],
         dtype: DType) -> str:
    return f"(({renderer.type_name(dtype)})({operands[0]}))"


def maximum(renderer: CStyleRenderer, operands: list[str], operand_dtypes: list[DType],
            dtype: DType) -> str:
    a, b = operands
    if dtypes.is_float(dtype):
        # NaN wins, as numpy's maximum; `|`, not `||`: no branch (a max-pool kernel 700 -> 132 us)
        return renderer.where(f"(({a}>{b})|({a}!={a}))", a, b)
    return renderer.where(f"{a}>{b}", a, b)


def where(renderer: CStyleRenderer, operands: list[str], operand_dtypes: list[DType],
          dtype: DType) -> str:
    condition, if_true, if_false = operands
    return renderer.where(condition, if_true, if_false)


_INTEGER_LITERAL = re.compile(r"(-?\d+)[a-z]*")  # 4, 4u, 4ll, 4i: how every renderer writes ints


def is_safe_divisor(operand: str) -> bool:
    """Is this operand an integer literal that can neither trap nor overflow a division (not 0,
    not -1)? Index arithmetic divides by such constants all the time: `(gidx0/4)`."""
    found = _INTEGER_LITERAL.fullmatch(operand)
    return found is not None and int(found.group(1)) not in (0, -1)


def integer_division(renderer: CStyleRenderer, operands: list[str],
                     operand_dtypes: list[DType], dtype: DType) -> str:
    """IDIV that never traps: x/0 gives 0 and MIN/-1 wraps to MIN (-MIN does, with -fwrapv),
    as the NUMPY reference says. The one copy every renderer uses."""
    a, b = operands
    if is_safe_divisor(b):
        return f"({a}/{b})"
    zero = renderer.render_const(0, dtype)
    if dtypes.is_unsigned(dtype):
        return renderer.where(f"{b}=={zero}", zero, f"{a}/{b}")
    minus_one = renderer.render_const(-1, dtype)
    divided = renderer.where(f"{b}=={minus_one}", f"-({a})", f"{a}/{b}")
    return renderer.where(f"{b}=={zero}", zero, divided)


def integer_remainder(renderer: CStyleRenderer, operands: list[str],
                      operand_dtypes: list[DType], dtype: DType) -> str:
    """MOD of integers that never traps: x%0 and MIN%-1 give 0. Otherwise C's %, whose result
    takes the dividend's sign, as the NUMPY reference's MOD does."""
    a, b = operands
    if is_safe_divisor(b):
        return f"({a}%{b})"
    zero = renderer.render_const(0, dtype)
    if dtypes.is_unsigned(dtype):
        return renderer.where(f"{b}=={zero}", zero, f"{a}%{b}")
    minus_one = renderer.render_const(-1, dtype)
    return renderer.where(f"({b}=={zero}||{b}=={minus_one})", zero, f"{a}%{b}")


def remainder(renderer: CStyleRenderer, operands: list[str], operand_dtypes: list[DType],
              dtype: DType) -> str:
    """MOD: `%` is for integers; floats use fmod, which has the same sign rule."""
    if dtypes.is_float(dtype):
        a, b = operands
        return f"fmod({a},{b})"
    return integer_remainder(renderer, operands, operand_dtypes, dtype)


def typed_math_function(base: str, half_to_float: str, float_to_half: str) -> CodeForOp:
    """C's math library is typed: `sinf` for float, `sin` for double; half goes through float.
    `half_to_float` and `float_to_half` are format strings around one value, `{}`."""
    def code(renderer: CStyleRenderer, operands: list[str], operand_dtypes: list[DType],
             dtype: DType) -> str:
        (a,) = operands
        if dtype == dtypes.float64:
            return f"{base}({a})"
        if dtype == dtypes.float16:
            return float_to_half.format(f"{base}f({half_to_float.format(a)})")
        return f"{base}f({a})"
    return code


MATH_FUNCTIONS = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.SQRT: "sqrt"}
# the signed integer of each size: a float's bits are read as it (C's `tt_float_to_bits`)
SIGNED_OF_SIZE = {1: dtypes.int8, 2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}


class CStyleRenderer:
    """Renders a LinearProgram in a C-like language. Subclasses change the details."""

    device = "C"
    kernel_prefix = ""
    type_names: dict[DType, str] = {
        dtypes.bool: "bool", dtypes.int8: "signed char", dtypes.uint8: "unsigned char",
        dtypes.int16: "short", dtypes.uint16: "unsigned short", dtypes.int32: "int",
        dtypes.uint32: "unsigned int", dtypes.int64: "long long",
        dtypes.uint64: "unsigned long long", dtypes.float16: "half", dtypes.float32: "float",
        dtypes.float64: "double",
    }
    infinity, nan = "INFINITY", "NAN"
    # ops whose code writes an operand more than once (`maximum`): see KernelWriter
    repeats_operands: frozenset[Ops] = frozenset({Ops.MAX})
    code_for_op: dict[Ops, CodeForOp] = {
        Ops.NEG: negate, Ops.RECIPROCAL: reciprocal, Ops.CAST: cast,
        **{op: math_function(name) for op, name in MATH_FUNCTIONS.items()},
        Ops.ADD: infix("+"), Ops.MUL: infix("*"), Ops.IDIV: integer_division, Ops.MOD: remainder,
        Ops.FDIV: infix("/"),  # on floats C's `/` is IEEE 754's correctly rounded division
        Ops.MAX: maximum, Ops.CMPLT: infix("<"), Ops.CMPNE: infix("!="),
        Ops.AND: logic("&", "&"), Ops.OR: logic("|", "|"), Ops.XOR: logic("!=", "^"),
        Ops.WHERE: where,
    }
    # float dtype -> (bits to value, value to bits): two functions of the language between the
    # float and the signed integer of its size (SIGNED_OF_SIZE), the same bits read either way
    bits_functions: dict[DType, tuple[str, str]] = {}
    # float dtypes the language holds as integers (C's bfloat16 word): an integer cast
    # reinterprets them
    held_as_integers: tuple[DType, ...] = ()
    bitcasts_vectors = False  # does `bitcast` take vectors whole? (else lane by lane)
    # C computes on narrow ints (and bools) as int: the result of these ops is cast back, so
    # that int8 127+1 wraps to -128 here, not only when stored, as numpy does
    wrapping_ops: tuple[Ops, ...] = (Ops.ADD, Ops.MUL, Ops.NEG, Ops.IDIV, Ops.MOD)
    narrow_dtypes: tuple[DType, ...] = (dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16,
                                        dtypes.uint16)

    # ---- the pieces a language changes ----

    def type_name(self, dtype: DType) -> str:
        if dtype.count > 1:
            return self.vector_type_name(dtype)
        return self.type_names[dtype]

    # vectors (DType.vec; made by lower.vectorize when `vector_width` > 0). OpenCL's words are
    # the defaults: float16 is a built-in type there; C (c.py) declares its own.
    vector_width = 0  # lanes of float32 per vector register; 0: no vector types

    # what the device can do besides its vector width, declared once per renderer class
    # (C: threads; render/gpu.py: work-groups and shared memory; CUDA: tensor cores too)
    device_capabilities = Capabilities()

    @property
    def capabilities(self) -> Capabilities:
        """What this renderer's device can do (device.Capabilities): its class's declaration
        with this renderer's `vector_width` (a device may set it: OpenCL's preferred width)."""
        return replace(self.device_capabilities, vector_width=self.vector_width)

    def vector_type_name(self, dtype: DType) -> str:
        """`float8`; a mask (a vector of bools, lower.vectorize) is `int8`, each lane 0 or 1:
        OpenCL has no vectors of bool."""
        lane = dtypes.int32 if dtype.scalar == dtypes.bool else dtype.scalar
        return f"{self.type_names[lane]}{dtype.count}"

    def vector_declarations(self, vector_dtypes: list[DType]) -> list[str]:
        """Lines a kernel needs before it may use these vector types."""
        return []

    def vector_literal(self, dtype: DType, lanes: list[str]) -> str:
        return f"({self.type_name(dtype)})({', '.join(lanes)})"

    def broadcast(self, scalar: str, dtype: DType) -> str:
        """A vector with `scalar` in every lane."""
        return f"({self.type_name(dtype)})({scalar})"

    def scalar_in_vector_op(self, scalar: str, dtype: DType) -> str:
        """A scalar operand of a whole-vector op (`val0*val1`, val0 a scalar). OpenCL applies
        it to every lane as it is."""
        return scalar

    def lane(self, vector: str, number: int) -> str:
        return f"{vector}.s{number:x}"

    def load_vector(self, buffer: str, index: str, dtype: DType) -> str:
        return f"vload{dtype.count}(0, {buffer}+{index})"

    def store_vector(self, buffer: str, index: str, value: str, dtype: DType) -> str:
        return f"vstore{dtype.count}({value}, 0, {buffer}+{index});"

    def render_const(self, value: float | int | bool, dtype: DType) -> str:
        if dtype.count > 1:  # the same value in every lane
            return self.broadcast(self.render_const(value, dtype.scalar), dtype)
        if dtypes.is_float(dtype):
            if math.isnan(value):
                return self.nan
            if math.isinf(value):
                return self.infinity if value > 0 else f"-{self.infinity}"
            return self.float_literal(float(value), dtype)
        if dtype == dtypes.bool:
            return "1" if value else "0"
        return self.int_literal(int(value), dtype)

    def float_literal(self, value: float, dtype: DType) -> str:
        text = repr(value)
        return text if dtype == dtypes.float64 else f"{text}f"

    def int_literal(self, value: int, dtype: DType) -> str:
        suffix = {dtypes.int64: "ll", dtypes.uint64: "ull", dtypes.uint32: "u"}.get(dtype, "")
        if value == dtype.min and value < 0:
            return f"({value + 1}{suffix}-1)"  # -2147483648 is not a valid C literal
        return f"{value}{suffix}"

    def render_kernel(self, writer: KernelWriter, name: str, params: list[str],
                      body: list[str]) -> str:
        raise NotImplementedError

    def param(self, define: UOp, is_output: bool) -> str:
        raise NotImplementedError

    def variable_params(self, program: LinearProgram) -> list[str]:
        """The kernel parameters of the program's Variables (symbolic sizes, passed at each
        launch after the buffers): `const int i` each."""
        return [f"const int {v.arg[0]}" for v in program.variables]

    def variable(self, writer: KernelWriter, name: str) -> str:
        """How the kernel reads a Variable's value (WGSL reads it from a buffer)."""
        return name

    def loop(self, writer: KernelWriter, name: str, size: int | str) -> str:
        return f"for (int {name} = 0; {name} < {size}; {name}++) {{"

    def parallel_pragma(self) -> str | None:
        """How to split the outermost loop across cores (None: this language does not)."""
        return None

    def simd_pragma(self, accumulators: list[str]) -> str | None:
        """How to let the compiler reorder a loop's sums into vector lanes (None: it can't)."""
        return None

    def declare(self, name: str, dtype: DType, value: str) -> str:
        return f"{self.type_name(dtype)} {name} = {value};"

    def where(self, condition: str, if_true: str, if_false: str) -> str:
        """`condition ? if_true : if_false` (WGSL, which has no `?:`, says `select`)."""
        return f"({condition}?{if_true}:{if_false})"

    def load(self, buffer: str, index: str) -> str:
        return f"{buffer}[{index}]"

    def store(self, buffer: str, index: str, value: str) -> str:
        return f"{buffer}[{index}] = {value};"

    def guarded_load(self, name: str, dtype: DType, valid: str, value: str) -> str:
        """`name = valid ? buffer[index] : 0`: C's `?:` evaluates only the side it takes, so
        an invalid index is never read."""
        return self.declare(name, dtype, self.where(valid, value, self.render_const(0, dtype)))

    def gated_store(self, gate: str, statement: str) -> str:
        """A store that only the threads where `gate` holds perform."""
        return f"if ({gate}) {{ {statement} }}"

    # GPU kernels (render/gpu.py): a plain C kernel has no work-groups
    def define_local(self, writer: KernelWriter, name: str, dtype: DType, size: int) -> str | None:
        """Declare `size` elements of a work-group's shared memory (None: declared elsewhere)."""
        raise NotImplementedError(f"{type(self).__name__} has no shared memory (DEFINE_LOCAL)")

    def local_id(self, dimension: int) -> str:
        """This thread's index within its work-group along `dimension`."""
        raise NotImplementedError(f"{type(self).__name__} has no work-groups (SPECIAL)")

    def barrier(self) -> str:
        """Every thread of the work-group waits here; shared memory is up to date after it."""
        raise NotImplementedError(f"{type(self).__name__} has no work-groups (BARRIER)")

    def from_storage(self, loaded: str, dtype: DType) -> str:
        """A value of `dtype` from what a buffer holds (WGSL keeps bools as u32)."""
        return loaded

    def to_storage(self, value: str, dtype: DType) -> str:
        """What a buffer of `dtype` holds for this value."""
        return value

    def wrap_narrow(self, expression: str, dtype: DType) -> str:
        """Bring a result computed in a wider type back into a narrow dtype's range."""
        return f"(({self.type_name(dtype)})({expression}))"

    # ---- ALU ops: the table ----

    def code(self, op: Ops) -> CodeForOp:
        """The table's entry for `op` (a clear error when the language has none)."""
        if op not in self.code_for_op:
            raise NotImplementedError(f"code_for_op has no entry for {op.name}")
        return self.code_for_op[op]

    def alu(self, node: UOp, operands: list[str]) -> str:
        """An ALU node's expression: its entry's snippet, brought back into range when the
        language computes a narrow dtype in a wider one (a bitcast: `bitcast`)."""
        if is_bitcast(node):
            return self.bitcast_node(node, operands[0])
        if node.dtype.count > 1:
            return self.vector_alu(node.op, node.dtype, node.src, operands)
        expression = self.code(node.op)(self, operands, [s.dtype for s in node.src], node.dtype)
        if node.op in self.wrapping_ops and node.dtype in self.narrow_dtypes:
            return self.wrap_narrow(expression, node.dtype)
        return expression

    def bitcast_node(self, node: UOp, operand: str) -> str:
        """A bitcast node's expression; a vector's lane by lane, unless the language
        reinterprets a whole vector (`bitcasts_vectors`)."""
        source = node.src[0].dtype
        if node.dtype.count == 1 or self.bitcasts_vectors:
            return self.bitcast(operand, source, node.dtype)
        lanes = [self.bitcast(self.lane(operand, number), source.scalar, node.dtype.scalar)
                 for number in range(node.dtype.count)]
        return self.vector_literal(node.dtype, lanes)

    def bitcast(self, operand: str, source: DType, dtype: DType) -> str:
        """The bits of `operand` (a `source` value) read as `dtype`, of the same size: a
        float's bits become the signed integer of its size and back through `bits_functions`;
        between integers (and integer-held dtypes) a cast, which keeps the bits.
        float32 -> uint32 in C: `((unsigned int)(tt_float_to_bits(x)))`."""
        self.check_bitcast(source, dtype)
        signed = SIGNED_OF_SIZE[dtype.itemsize]
        bits, bits_dtype = operand, source
        if source in self.bits_functions:  # a float: first its bits, as the signed integer
            bits, bits_dtype = f"{self.bits_functions[source][1]}({operand})", signed
        if dtype in self.bits_functions:  # to a float: from the signed integer
            if bits_dtype != signed:
                bits = self.plain_cast(bits, signed)
            return f"{self.bits_functions[dtype][0]}({bits})"
        return bits if bits_dtype == dtype else self.plain_cast(bits, dtype)

    def check_bitcast(self, source: DType, dtype: DType) -> None:
        """A float the language has no `bits_functions` for is an error, never a conversion
        of its value (which an integer cast would be)."""
        for float_dtype in (source, dtype):
            if dtypes.is_float(float_dtype) and float_dtype not in self.bits_functions and \
                    float_dtype not in self.held_as_integers:
                raise NotImplementedError(f"{type(self).__name__} cannot bitcast {source.name} "
                                          f"to {dtype.name}: no bits_functions for "
                                          f"{float_dtype.name}")

    def plain_cast(self, operand: str, dtype: DType) -> str:
        """A conversion of an integer to another integer type: modulo 2^bits, which keeps the
        bits of a value of the same size."""
        return cast(self, [operand], [dtype], dtype)

    def vector_alu(self, op: Ops, dtype: DType, sources: tuple[UOp, ...],
                   operands: list[str]) -> str:
        """+, * and - work on whole vectors (a scalar operand counts for every lane); other ops
        are written once per lane and packed back into a vector."""
        code = self.code(op)
        lane_dtypes = [s.dtype.scalar for s in sources]
        if op in NATIVE_VECTOR_OPS:
            whole = [o if s.dtype.count > 1 else self.scalar_in_vector_op(o, dtype)
                     for o, s in zip(operands, sources)]
            return code(self, whole, lane_dtypes, dtype.scalar)
        lanes = []
        for number in range(dtype.count):
            lane_operands = [self.lane(o, number) if s.dtype.count > 1 else o
                             for o, s in zip(operands, sources)]
            lanes.append(code(self, lane_operands, lane_dtypes, dtype.scalar))
        return self.vector_literal(dtype, lanes)

    # ---- the walk over the program: one small function per op ----

    def new_writer(self, program: LinearProgram) -> KernelWriter:
        """The state of one render (GPU renderers add the kernel's launch)."""
        return KernelWriter(self, program)

    def spec(self, name: str, program: LinearProgram) -> ProgramSpec:
        """The rendered kernel with what a runtime needs to run it (lower.ProgramSpec)."""
        return spec_of(name, self.render(name, program), program)

    def render(self, name: str, program: LinearProgram) -> str:
        writer = self.new_writer(program)
        for u in program.uops:
            render_op = RENDER_FOR_OP.get(u.op, _render_alu if u.op in ALU else None)
            if render_op is None:
                raise NotImplementedError(f"{type(self).__name__} cannot render {u.op.name}")
            line = render_op(writer, u, [writer.names.get(s, "") for s in u.src])
            if line is not None:
                writer.emit(line)
        params = [self.param(g, g.arg[0] == 0) for g in program.globals]
        params += self.variable_params(program)
        vector_dtypes = sorted({u.dtype for u in program.uops if u.dtype.count > 1})
        declarations = ["  " + line for line in self.vector_declarations(vector_dtypes)]
        return self.render_kernel(writer, name, params, declarations + writer.body)


# ops that C and OpenCL apply to whole vectors; the others are written lane by lane
NATIVE_VECTOR_OPS = (Ops.ADD, Ops.MUL, Ops.NEG, Ops.RECIPROCAL, Ops.FDIV)


@dataclass
class KernelWriter:
    """What the walk over one program keeps: each value's name, the lines written so far and the
    current loop depth. One per render: nothing of one kernel is kept on the renderer."""

    renderer: CStyleRenderer
    program: LinearProgram
    names: dict[UOp, str] = field(default_factory=dict)
    body: list[str] = field(default_factory=list)
    depth: int = 1
    counters: Counter[str] = field(default_factory=Counter)
    uses: Counter[UOp] = field(default_factory=Counter)
    inline_depth: dict[UOp, int] = field(default_factory=dict)  # nesting of inline values

    def __post_init__(self) -> None:
        self.uses = Counter(s for u in self.program.uops for s in u.src)
        self._name_nested_repeats()

    def _name_nested_repeats(self) -> None:
        """An op whose code writes an operand more than once (C's float max writes `a` three
        times: `((a>b)|(a!=a))?a:b`) copies an inline operand's text as often. When that
        operand holds such an op itself, the copies multiply level by level: an unrolled max
        over 8 values rendered to 1.2 MB of C. So such an operand gets a name (it counts as
        used twice), and each level's text holds one level of copies."""
        repeating = self.renderer.repeats_operands
        holds_repeat: set[UOp] = set()
        for u in self.program.uops:
            repeats = u.op in repeating or (u.op is Ops.ACCUMULATE and u.arg in repeating)
            if repeats:
                for source in u.src:
                    if source in holds_repeat:
                        self.uses[source] += 1
            if u.op in ALU and (repeats or any(s in holds_repeat for s in u.src)):
                holds_repeat.add(u)

    def new_name(self, prefix: str) -> str:
        """val0, val1, ... acc0, ... alu0, ...: each prefix counts on its own."""
        self.counters[prefix] += 1
        return f"{prefix}{self.counters[prefix] - 1}"

    def emit(self, line: str) -> None:
        self.body.append("  " * self.depth + line)


RenderRule = Callable[[KernelWriter, UOp, list[str]], "str | None"]


def _render_define_global(writer: KernelWriter, u: UOp, operands: list[str]) -> None:
    writer.names[u] = f"data{u.arg[0]}"


def _render_const(writer: KernelWriter, u: UOp, operands: list[str]) -> None:
    writer.names[u] = writer.renderer.render_const(u.arg, u.dtype)


def _render_range(writer: KernelWriter, u: UOp, operands: list[str]) -> None:
    kind, number, size = u.arg
    writer.names[u] = f"{'gidx' if kind in ('g', 'w', 'c') else 'ridx'}{number}"
    pragma = writer.renderer.parallel_pragma()
    if kind == "g" and writer.program.options.parallel and pragma and writer.depth == 1:
        writer.emit(pragma)  # the outermost loop's iterations run on several cores
    accumulators = writer.program.simd_loops.get(u)
    if accumulators:
        simd = writer.renderer.simd_pragma([writer.names[acc] for acc in accumulators])
        if simd:
            writer.emit(simd)  # the compiler may split these sums across vector lanes
    bound = size if isinstance(size, int) else render_size(writer, size)
    writer.emit(writer.renderer.loop(writer, writer.names[u], bound))
    writer.depth += 1


def render_size(writer: KernelWriter, size: UOp) -> str:
    """A symbolic size (a loop's bound, `i` or `(i+1)`) as an expression of the language:
    its variables by name, its arithmetic by `code_for_op`."""
    text: dict[UOp, str] = {}
    for node in size.toposort:
        if node.op is Ops.DEFINE_VAR:
            text[node] = writer.renderer.variable(writer, node.arg[0])
        elif node.op is Ops.CONST:
            text[node] = writer.renderer.render_const(node.arg, node.dtype)
        else:
            text[node] = writer.renderer.alu(node, [text[s] for s in node.src])
    return text[size]


def _render_define_var(writer: KernelWriter, u: UOp, operands: list[str]) -> None:
    writer.names[u] = writer.renderer.variable(writer, u.arg[0])


def _render_end_range(writer: KernelWriter, u: UOp, operands: list[str]) -> str:
    writer.depth -= 1
    return "}"


def _render_load(writer: KernelWriter, u: UOp, operands: list[str]) -> str:
    renderer, parts = writer.renderer, load_parts(u)
    buffer, index = writer.names[parts.buffer], writer.names[parts.index]
    if u.dtype.count > 1:  # `count` consecutive elements from the index on, in one load
        value = renderer.load_vector(buffer, index, u.dtype)
    else:
        value = renderer.from_storage(renderer.load(buffer, index), u.dtype)
    writer.names[u] = writer.new_name("val")
    if parts.valid is not None:  # guarded: padding outside the buffer reads 0
        return renderer.guarded_load(writer.names[u], u.dtype, writer.names[parts.valid], value)
    return renderer.declare(writer.names[u], u.dtype, value)


def _render_define_acc(writer: KernelWriter, u: UOp, operands: list[str]) -> str:
    writer.names[u] = writer.new_name("acc")
    return writer.renderer.declare(writer.names[u], u.dtype, operands[0])


def _render_accumulate(writer: KernelWriter, u: UOp, operands: list[str]) -> str:
    acc, value = operands
    if u.arg is Ops.ADD and u.dtype == dtypes.bfloat16:  # through the renderer's conversions
        renderer = writer.renderer
        combined = renderer.code(Ops.ADD)(renderer, operands, [u.dtype, u.dtype], u.dtype)
    elif u.arg is Ops.ADD:
        combined = f"({acc}+{value})"
    elif u.dtype.count > 1:
        combined = writer.renderer.vector_alu(Ops.MAX, u.dtype, u.src, operands)
    else:
        renderer = writer.renderer
        combined = renderer.code(Ops.MAX)(renderer, operands, [u.dtype, u.dtype], u.dtype)
    return f"{acc} = {combined};"


def _render_reduce(writer: KernelWriter, u: UOp, operands: list[str]) -> None:
    # after its loop, a reduction's value is its accumulator
    writer.names[u] = writer.names[writer.program.accumulators[u]]


def _render_store(writer: KernelWriter, u: UOp, operands: list[str]) -> str:
    renderer, parts = writer.renderer, store_parts(u)
    buffer, index = writer.names[parts.buffer], writer.names[parts.index]
    value = writer.names[parts.value]
    if parts.value.dtype.count > 1:
        statement = renderer.store_vector(buffer, index, value, parts.value.dtype)
    else:
        statement = renderer.store(buffer, index, renderer.to_storage(value, u.src[0].dtype))
    if parts.gate is not None:  # only the threads where the gate holds write
        return renderer.gated_store(writer.names[parts.gate], statement)
    return statement


def _render_define_local(writer: KernelWriter, u: UOp, operands: list[str]) -> str | None:
    number, size = u.arg
    writer.names[u] = f"local{number}"
    return writer.renderer.define_local(writer, writer.names[u], u.dtype, size)


def _render_special(writer: KernelWriter, u: UOp, operands: list[str]) -> str:
    _, dimension, _ = u.arg
    writer.names[u] = f"lidx{dimension}"
    return writer.renderer.declare(writer.names[u], u.dtype, writer.renderer.local_id(dimension))


def _render_barrier(writer: KernelWriter, u: UOp, operands: list[str]) -> str:
    return writer.renderer.barrier()  # no value: the LOADs and STOREs after it list it


def _render_alu(writer: KernelWriter, u: UOp, operands: list[str]) -> str | None:
    expression = writer.renderer.alu(u, operands)
    depth = 1 + max((writer.inline_depth.get(s, 0) for s in u.src), default=0)
    if writer.uses[u] <= 1 and u.dtype.count == 1 and depth < MAX_INLINE_DEPTH:
        writer.names[u] = expression  # used once: written inline where it is used
        writer.inline_depth[u] = depth  # (vectors get a name: lanes index them)
        return None
    writer.names[u] = writer.new_name("alu")
    return writer.renderer.declare(writer.names[u], u.dtype, expression)


RENDER_FOR_OP: dict[Ops, RenderRule] = {
    Ops.DEFINE_GLOBAL: _render_define_global,
    Ops.DEFINE_VAR: _render_define_var,
    Ops.CONST: _render_const,
    Ops.RANGE: _render_range,
    Ops.END_RANGE: _render_end_range,
    Ops.LOAD: _render_load,
    Ops.DEFINE_ACC: _render_define_acc,
    Ops.ACCUMULATE: _render_accumulate,
    Ops.REDUCE: _render_reduce,
    Ops.STORE: _render_store,
    Ops.DEFINE_LOCAL: _render_define_local,
    Ops.SPECIAL: _render_special,
    Ops.BARRIER: _render_barrier,
}
