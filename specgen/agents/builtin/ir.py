"""The row-program IR: what one kernel direction computes, row by row.

The input is viewed as `rows` rows of a domain of `width` columns (the last dim, after
chunking). Every value has a level:

    const   a literal                       global  one value for the launch (scalars, dims, 0-d inputs)
    row     one value per row               elem    one value per (row, column)
    post    computed after the row pass from reductions over rows (col outputs, 0-d outputs)

Leaves are `load`s of ABI tensors (elem: row-mapped rows of a tensor at a column offset,
col: a [W] parameter broadcast over rows, row: one element per row, global: a 0-d tensor),
`scalar`s, `dim`s, `const`s and `iota` (the column index). `rowreduce` turns elem into
row (sum, max, min over the columns); `gather` picks an elem expression at a per-row
column; `colreduce` sums elem values over the rows of a group (weight grads: one group of
all rows; rope's cos grad: groups of H rows) and `globalreduce` sums row values over all
rows; both feed `post` values only, evaluated by a finalize kernel. A `pretotal` is a
`globalreduce` of row values known before the row pass (row loads only: a mask's count), one
global value that per-element outputs may read (pretotal.py; a prologue kernel sums it).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from .ops import BINARY, UNARY  # noqa: F401 - re-exported: the IR's op names

LEVELS = ("const", "global", "row", "elem", "post")
LEVEL_RANK = {name: i for i, name in enumerate(LEVELS)}

# the elementwise ops and their arities: ops.py's table (the emitter and the interpreter read it too)
COMPARE = {"eq", "ne", "lt", "le", "gt", "ge"}
REDUCE_KINDS = {"sum", "max", "min"}

_ids = itertools.count()


@dataclass(eq=False)
class Node:
    op: str
    args: tuple["Node", ...] = ()
    level: str = "elem"
    dtype: str = "float"  # float | int | bool
    attrs: dict = field(default_factory=dict)
    name: str = ""
    id: int = field(default_factory=lambda: next(_ids))

    def __repr__(self) -> str:
        inner = ", ".join(a.name or f"%{a.id}" for a in self.args)
        extra = ", ".join(f"{k}={v!r}" for k, v in self.attrs.items() if k not in ("offset",))
        return f"{self.name or '%' + str(self.id)} = {self.op}({inner}{'; ' + extra if extra else ''}) [{self.level} {self.dtype}]"


def walk(root: Node, follow=lambda n: n.args):
    """Every node reachable from `root` through `follow(node)` (its arguments by default), once
    each, in no promised order."""
    stack, seen = [root], set()
    while stack:
        n = stack.pop()
        if n.id in seen:
            continue
        seen.add(n.id)
        yield n
        stack.extend(follow(n))


def const(value, dtype: str | None = None) -> Node:
    if dtype is None:
        dtype = "bool" if isinstance(value, bool) else "int" if isinstance(value, int) else "float"
    return Node("const", level="const", dtype=dtype, attrs={"value": value})


def is_const(node: Node, value=None) -> bool:
    return node.op == "const" and (value is None or node.attrs["value"] == value)


def level_of(*nodes: Node) -> str:
    return max((n.level for n in nodes), key=LEVEL_RANK.__getitem__, default="const")


def reciprocal_is_normal(divisor: Node) -> bool:
    """Is 1/divisor a normal float whenever it is finite? True for softmax's sum of
    exp(a - rowmax(a)): the max's own term is exp(0) = 1 and each term is at most 1, so the sum
    lies in [1, width] (NaN or inf rows stay NaN either way). A per-row division by it needs no
    guard (emit.div_per_row): the guard's select cost softmax forward 1.3x in bf16 (H200)."""
    if divisor.op != "rowreduce" or divisor.attrs.get("kind") != "sum":
        return False
    term = divisor.args[0]
    if term.op != "exp" or term.args[0].op != "sub":
        return False
    a, shift = term.args[0].args
    return shift.op == "rowreduce" and shift.attrs.get("kind") == "max" and shift.args[0] is a


@dataclass
class Store:
    field: str  # the ABI tensor written
    value: Node
    kind: str  # elem | row | col | global (the axis family: part, piece)
    offset: Node | None = None  # column offset (elem and col stores: cat pieces)
    # a piece store (the axis family): kept values into piece k of n equal pieces along dim d of
    # the field (torch.cat of keepdim reductions along that dim): (d, k, n)
    piece: tuple | None = None


@dataclass
class Program:
    op: str
    direction: str
    row_dims: list  # signature Dims of the row space (leading dims of the primary tensor)
    width: Node  # global int: the domain width
    width_example: int
    stores: list[Store]
    group_div: list | None = None  # col reductions per group of rows: the Dims that make one group
    dims_example: dict = field(default_factory=dict)
    fold: int = 1  # trailing axes of the full-shape tensors that make the column axis (lower.trailing_fold)

    def pitch_dims(self, ttype) -> list:
        """The Dims whose product is one row's pitch in `ttype` (its last `fold` dims)."""
        return list(ttype.dims[-self.fold:])

    def nodes(self) -> list[Node]:
        """Every node reachable from the stores, in topological order."""
        seen: dict[int, Node] = {}
        order: list[Node] = []

        def visit(node: Node):
            stack = [(node, False)]
            while stack:
                n, done = stack.pop()
                if done:
                    if n.id not in seen:
                        seen[n.id] = n
                        order.append(n)
                    continue
                if n.id in seen:
                    continue
                stack.append((n, True))
                for a in reversed(n.args):
                    if a.id not in seen:
                        stack.append((a, False))
                for extra in ("offset",):
                    if isinstance(n.attrs.get(extra), Node):
                        stack.append((n.attrs[extra], False))

        for s in self.stores:
            visit(s.value)
            if s.offset is not None:
                visit(s.offset)
        visit(self.width)
        return order

    def describe(self) -> str:
        lines = [f"program {self.op} {self.direction}: rows = {' * '.join(map(str, self.row_dims))}, "
                 f"width = {self.width_example} (example)" + (f", the last {self.fold} axes folded" if self.fold > 1
                                                               else "")]
        lines += [f"  {n!r}" for n in self.nodes()]
        lines += [f"  store {s.field} <- {s.value.name or s.value.id} ({s.kind})" for s in self.stores]
        return "\n".join(lines)
