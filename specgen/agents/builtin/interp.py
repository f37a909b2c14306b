"""A small torch interpreter of the row-program IR, for checking a lowering on the CPU.

It evaluates each node with whole-tensor torch ops in float64, with the same semantics the
CUDA emitter gives the node, so a lowering bug shows up as a mismatch against the
reference here rather than on the GPU. `acc=torch.float32` evaluates in the kernels' float32
accumulator instead: underflow, overflow and rounding where the emitted math has them, a
per-row divisor as emit.div_per_row has it (x * (1/d) where 1/d is a normal float, else x / d).
"""
from __future__ import annotations

import math

import torch

from .ir import Node, Program, reciprocal_is_normal
from .ops import BINARY, OPS, UNARY

# one meaning with the emitter: ops.py's table
_UNARY = {name: OPS[name].torch for name in UNARY}
_BINARY = {name: OPS[name].torch for name in BINARY if OPS[name].torch is not None}


def resolve_dim(dim, dims: dict[str, int]) -> int:
    return dim.resolve(dims)


def run_program(program: Program, tensors: dict[str, torch.Tensor], scalars: dict[str, float],
                dims: dict[str, int], outputs: dict[str, torch.Tensor], acc: torch.dtype = torch.float64,
                family_ops: dict | None = None) -> None:
    """Write every store of `program` into `outputs` (preallocated, by ABI field); float
    values computed in `acc` (float64, or float32 as the kernels' accumulator). `family_ops`:
    {op: fn(node, args)} for a family's own ops (the axis family's partreduce)."""
    rows = math.prod(d.resolve(dims) for d in program.row_dims)
    memo: dict[int, torch.Tensor] = {}

    def as_tensor(x, dtype):
        if isinstance(x, torch.Tensor):
            return x
        return torch.tensor(x, dtype=dtype)

    def ev(node: Node) -> torch.Tensor:
        if node.id in memo:
            return memo[node.id]
        out = _eval(node)
        if node.dtype == "float" and out.dtype != acc:
            out = out.to(acc)
        elif node.dtype == "int" and out.dtype not in (torch.int64,):
            out = out.long() if not out.is_floating_point() else out.trunc().long()
        elif node.dtype == "bool" and out.dtype != torch.bool:
            out = out != 0
        memo[node.id] = out
        return out


    def row_index(div) -> torch.Tensor:
        span = math.prod(d.resolve(dims) for d in div)
        return torch.arange(rows) // max(span, 1)

    def _eval(node: Node) -> torch.Tensor:
        op, a = node.op, node.attrs
        if op == "const":
            return torch.tensor(a["value"], dtype={"float": acc, "int": torch.int64,
                                                   "bool": torch.bool}[node.dtype])
        if op == "scalar":
            return torch.tensor(float(scalars[a["field"]]), dtype=acc)
        if op == "dim":
            return torch.tensor(a["dim"].resolve(dims), dtype=torch.int64)
        if op == "stride":
            raise AssertionError("strides are only used by input slices")
        if op == "iota":
            return torch.arange(width).unsqueeze(0)
        if op == "rowiota":  # rows as [R, 1], as a row load
            span = math.prod(d.resolve(dims) for d in program.row_dims[a["axis"] + 1:])
            return ((torch.arange(rows) // span) % program.row_dims[a["axis"]].resolve(dims)).unsqueeze(1)
        if op == "load":
            t = tensors[a["field"]]
            t = t.to(acc) if t.is_floating_point() else t.long() if t.dtype != torch.bool else t
            if a["kind"] == "global":
                return t.reshape(())
            if a["kind"] == "bcast":  # spans the dims marked present of the [rows..., W] shape
                full = [d.resolve(dims) for d in program.row_dims] + [width]
                view = [n if p else 1 for n, p in zip(full, a["present"])]
                return t.reshape(view).expand(full).reshape(rows, width)
            if a["kind"] == "row" and a.get("rows_piece"):  # a per-row piece at its rows of the field
                return t.reshape(-1)[rows_piece_index(program, rows, dims, a["rows_piece"])].unsqueeze(1)
            if a["kind"] == "row":
                return t.reshape(-1)[row_index(a["row_div"])].unsqueeze(1)  # rows as [R, 1]
            if a["kind"] == "colpick":  # column k of each row
                return t.reshape(-1, math.prod(t.shape[-program.fold:]))[row_index(a["row_div"]), a["col"]].unsqueeze(1)
            if a["kind"] == "piece":  # the axis family: position k of n along a dim of the whole tensor
                return t.reshape(-1)[piece_index(rows, t.shape, a["piece"])].unsqueeze(1)
            offset = int(ev(a["offset"])) if a.get("offset") is not None else 0
            flat = t.reshape(-1, math.prod(t.shape[-program.fold:]))[:, offset:offset + width]
            if a["kind"] == "col":
                return flat.reshape(1, width)
            if a.get("rows_piece"):  # piece k of n along a row dim (a channel chunk)
                return flat[rows_piece_index(program, rows, dims, a["rows_piece"])]
            return flat[row_index(a["row_div"])]
        args = [ev(x) for x in node.args]
        if op in _UNARY:
            return _UNARY[op](args[0].to(acc) if op not in ("not", "neg", "abs") else args[0])
        if op == "div":
            x, y = args
            if node.dtype == "int":
                return torch.div(x, y, rounding_mode="trunc")
            x, y = x.to(acc), y.to(acc)
            if acc != torch.float64 and node.level == "elem" and node.args[1].level in ("const", "global", "row"):
                r = 1 / y  # emit.div_per_row
                if reciprocal_is_normal(node.args[1]):
                    return x * r
                normal = (r.abs() >= torch.finfo(torch.float32).tiny) & (r.abs() <= torch.finfo(torch.float32).max)
                return torch.where(normal, x * r, x / y)
            return x / y
        if op in _BINARY:
            return _BINARY[op](*args)
        if op == "where":
            return torch.where(*args)
        if op == "cast":
            return args[0]
        if op == "rowreduce":
            x = args[0].expand(rows, width)
            return {"sum": lambda v: v.sum(-1, keepdim=True), "max": lambda v: v.amax(-1, keepdim=True),
                    "min": lambda v: v.amin(-1, keepdim=True),
                    # arg-reductions (the axis family): torch's own ties (first index) and NaN (max)
                    "argmax": lambda v: v.argmax(-1, keepdim=True), "argmin": lambda v: v.argmin(-1, keepdim=True),
                    "prod": lambda v: v.prod(-1, keepdim=True),
                    }[a["kind"]](x)
        if op == "gather":
            x = args[0].expand(rows, width)
            idx = args[1].expand(rows, 1).long().clamp(0, width - 1)  # emit: an edge column outside [0, W)
            return x.gather(1, idx)
        if op == "colreduce":
            x = args[0].expand(rows, width)
            return x.reshape(rows // group, group, width).sum(1)
        if op == "scan":  # families/scan.py
            from .families.scan import interp_scan

            return interp_scan(node, args[0], rows, width, dims)
        if op == "globalreduce":
            return args[0].expand(rows, 1).sum()
        if op == "pretotal":  # the prologue kernel sums in double, read back in the math type
            return args[0].expand(rows, 1).double().sum().to(acc if node.dtype == "float" else torch.float64)
        if family_ops and op in family_ops:
            return family_ops[op](node, args)
        raise AssertionError(f"interp: unknown op {op}")

    width = int(ev(program.width))
    group = math.prod(d.resolve(dims) for d in (program.group_div or []))
    for store in program.stores:
        value = ev(store.value)
        out = outputs[store.field]
        offset = int(ev(store.offset)) if store.offset is not None else 0
        if store.kind == "global":
            out.reshape(()).copy_(value.reshape(()))
        elif store.kind == "part":  # the axis family's per-parameter totals, at every element they cover
            out.copy_(torch.broadcast_to(value, out.shape))
        elif store.kind in ("row", "piece") and store.piece is not None:  # one value per row, into its piece:
            # a per-row piece along a row dim (row family), or of size-1 pieces of the whole tensor (axis family)
            index = rows_piece_index(program, rows, dims, store.piece) if store.kind == "row" \
                else piece_index(rows, out.shape, store.piece)
            out.view(-1)[index] = value.expand(rows, 1).reshape(-1).to(out.dtype)
        elif store.kind == "row":
            out.reshape(rows, 1).copy_(value.expand(rows, 1))
        elif store.kind == "elem" and store.piece is not None:  # piece k of n along a row dim
            index = rows_piece_index(program, rows, dims, store.piece)
            out.view(-1, math.prod(out.shape[-program.fold:]))[index, offset:offset + width] = \
                value.expand(rows, width).to(out.dtype)
        elif store.kind == "elem":
            view = out.view(rows, -1)[:, offset:offset + width]
            view.copy_(value.expand(rows, width))
        else:  # col
            view = out.view(-1, math.prod(out.shape[-program.fold:]))[:, offset:offset + width]
            view.copy_(value.expand(view.shape))


def rows_piece_index(program: Program, rows: int, dims: dict, piece) -> torch.Tensor:
    """The row of a tensor of n equal pieces along row dim d that row r of piece k is (a channel
    chunk of [B, n*C, T] read or written as rows [B, C]): ctext.rows_piece_index in C."""
    d, k, n = piece
    return _other_pieces_stepped_over(rows, math.prod(x.resolve(dims) for x in program.row_dims[d:]), k, n)


def piece_index(rows: int, shape, piece) -> torch.Tensor:
    """Where each kept element's value sits in a tensor of n size-1 pieces along dim d (a
    concatenation of keepdim reductions): the kept index with the other pieces stepped over
    (axis_emit's piece_index in C)."""
    d, k, n = piece
    return _other_pieces_stepped_over(rows, math.prod(shape[d + 1:]), k, n)


def _other_pieces_stepped_over(rows: int, span: int, k: int, n: int) -> torch.Tensor:
    """Index r (of `rows`) of piece k of n, each `span` long per index of the dims before them, in
    the whole tensor (ctext._other_pieces_stepped_over in C)."""
    r = torch.arange(rows)
    return r + (r // span) * (n - 1) * span + k * span
