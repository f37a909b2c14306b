"""C text shared by the emitters: type names, dim expressions, literals, naming scopes."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .cwriter import CWriter

C_TYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16", "float64": "double",
           "int64": "int64_t", "int32": "int32_t", "int16": "int16_t", "int8": "int8_t", "uint8": "uint8_t",
           "bool": "bool"}
DTYPE_ENUM = {"float32": "SPECGEN_FLOAT32", "float16": "SPECGEN_FLOAT16", "bfloat16": "SPECGEN_BFLOAT16",
              "float64": "SPECGEN_FLOAT64"}


def arange_value(node, coordinate: str) -> str:
    """An arange load's value (the axis family: its attrs' start and step) at a coordinate along
    its atom, in the node's type."""
    start, step = node.attrs["arange"]
    value = f"((int64_t){start} + (int64_t){step} * ({coordinate}))"
    return f"(acc_t){value}" if node.dtype == "float" else value


def piece_index(field: str, piece: tuple, row: str = "row") -> str:
    """Where kept element `row`'s value sits in `field`, a tensor of n size-1 pieces along dim d
    (a concatenation of keepdim reductions): the kept index with the other pieces stepped over
    (interp.piece_index on the CPU)."""
    d, k, n = piece
    return _other_pieces_stepped_over(row, f"A.{field}.strides[{d}]", str(k), n)


def rows_piece_index(piece: tuple, row_dims: list, row: str = "row") -> str:
    """The row of a tensor of n equal pieces along row dim d that row `row` of piece k is (a
    channel chunk of [B, n*C, T] read or written as rows [B, C]; interp.rows_piece_index)."""
    d, k, n = piece
    span = " * ".join(dim_expr(x) for x in row_dims[d:])
    return _other_pieces_stepped_over(row, f"({span})", f"(int64_t){k}", n)


def _other_pieces_stepped_over(index: str, span: str, k: str, n: int) -> str:
    """Index `index` of piece k (of n, each `span` long per index of the dims before them) in the
    whole tensor: the pieces before k, and the other n - 1 of every earlier block, stepped over."""
    return f"((int64_t)({index}) + ((int64_t)({index}) / {span}) * {n - 1} * {span} + {k} * {span})"


def entry_function(entry: str, args_t: str, kname: str, dispatch: str | None, dtypes) -> list[str]:
    """The extern "C" entry point `entry`: `<kname>_launch<T>` for the working dtype of the tensor
    field `dispatch` (float when the spec has no floating tensor to dispatch on)."""
    w = CWriter()
    w.line(f'extern "C" cudaError_t {entry}(const {args_t}* a, cudaStream_t stream)')
    with w.block():
        if dispatch is None:
            w.line(f"return {kname}_launch<float>(*a, stream);")
        else:
            with w.block(f"switch (a->{dispatch}.dtype)", comment="the spec's working dtype"):
                w.lines(f"case {DTYPE_ENUM[d]}: return {kname}_launch<{C_TYPES[d]}>(*a, stream);" for d in dtypes)
                w.line("default: return cudaErrorInvalidValue;")
    return w.to_lines()


def launch_need_param(has_workspace) -> str:
    """The launcher's extra parameter when it takes a workspace: given `need`, it only says how
    many bytes the call needs (the size function and the launch share one computation)."""
    return ", size_t* need = nullptr" if has_workspace else ""


def take_workspace(bytes_var: str) -> list[str]:
    """Statements of a launcher after `bytes_var` is known: answer a size query, else check the
    framework's workspace holds that much (a smaller one is the caller's error, not an overrun)."""
    return [f"if (need) {{ *need = {bytes_var}; return cudaSuccess; }}",
            f"if ((size_t)A.workspace_bytes < {bytes_var}) return cudaErrorInvalidValue;  // the ABI's workspace"]


def workspace_entry(kname: str, function: str, args_t: str, dispatch: str | None, dtypes) -> list[str]:
    """The extern "C" size function: the launcher of the working dtype, asked only for its bytes."""
    ask = "(void){kname}_launch<{t}>(*a, nullptr, &need);"
    w = CWriter()
    w.line(f'extern "C" size_t {function}(const {args_t}* a)')
    with w.block():
        w.line("size_t need = 0;")
        if dispatch is None:
            w.line(ask.format(kname=kname, t="float"))
        else:
            with w.block(f"switch (a->{dispatch}.dtype)", comment="the spec's working dtype"):
                w.lines(f"case {DTYPE_ENUM[d]}: {ask.format(kname=kname, t=C_TYPES[d])} break;" for d in dtypes)
                w.line("default: break;")
        w.line("return need;")
    return w.to_lines()


def dim_expr(d, prefix: str = "A.") -> str:
    if d.symbol is None:
        return f"(int64_t){d.add}"
    return f"((int64_t)({d.c_expr(prefix)}))"


def pitch_expr(program, ttype, prefix: str = "A.") -> str:
    """One row's pitch in a tensor of the program's rows: its last dim, or the product of the
    trailing dims the lowering folded into the column axis (Program.fold)."""
    dims = program.pitch_dims(ttype)
    if len(dims) == 1:
        return dim_expr(dims[0], prefix)
    return "(" + " * ".join(dim_expr(d, prefix) for d in dims) + ")"


def _float_literal(value: float) -> str:
    if math.isinf(value):
        return "(acc_t)INFINITY" if value > 0 else "(acc_t)(-INFINITY)"
    if math.isnan(value):
        return "(acc_t)NAN"
    return f"(acc_t){float(value)!r}"


@dataclass
class Ctx:
    """How to name values while emitting one scope."""

    names: dict[int, str] = field(default_factory=dict)  # node id -> C variable
    loads: dict[int, str] = field(default_factory=dict)  # elem load id -> expression for the current element
