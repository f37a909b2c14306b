"""The row-program IR's invariants, checked after lowering and after every pass (generator.py):
a pass that breaks one is a generator bug, stopped here with the pass and the node named, before
any C is written for it. The rules are ir.py's docstring made executable."""
from __future__ import annotations

from . import pretotal
from .ir import LEVEL_RANK, LEVELS, REDUCE_KINDS, Node, Program, level_of
from .ops import OPS

LEAVES = {"load", "scalar", "dim", "stride", "const", "iota", "rowiota"}
ARITY = {**{name: op.arity for name, op in OPS.items()}, "scan": 1, "gather": 2, "rowreduce": 1, "colreduce": 1,
         "globalreduce": 1, "pretotal": 1}
# reductions and the gather: (the level of their first argument, their own level)
CHANGES_LEVEL = {"rowreduce": ("elem", "row"), "gather": ("elem", "row"), "colreduce": ("elem", "post"),
                 "globalreduce": ("row", "post"), "pretotal": ("row", "global")}
STORE_LIMIT = {"elem": "elem", "row": "row", "col": "post", "global": "post"}  # the highest level a store takes
DTYPES = {"float", "int", "bool"}


class IRError(AssertionError):
    """A row program that breaks an invariant of the IR (a bug of the generator, not of the spec)."""


def validate(program: Program, after: str) -> Program:
    """`program`, unchanged, when every invariant holds; IRError naming `after` (the pass) else."""
    def fail(what: str, node: Node | None = None) -> None:
        where = f" at {node!r}" if node is not None else ""
        raise IRError(f"the {program.op} {program.direction} program after {after}: {what}{where}")

    for node in program.nodes():
        if node.level not in LEVELS or node.dtype not in DTYPES:
            fail(f"level {node.level!r} / dtype {node.dtype!r} unknown", node)
        if node.op in LEAVES:
            if node.args:
                fail(f"a {node.op} takes no arguments", node)
            continue
        arity = ARITY.get(node.op)
        if arity is None:
            fail(f"unknown op {node.op!r}", node)
        if len(node.args) != arity:
            fail(f"{node.op} takes {arity} argument(s), not {len(node.args)}", node)
        if node.op in CHANGES_LEVEL:
            source, own = CHANGES_LEVEL[node.op]
            exact = node.op != "gather"  # a reduction takes values of exactly its source level
            arg = node.args[0].level
            if (arg != source if exact else LEVEL_RANK[arg] > LEVEL_RANK[source]) or node.level != own:
                fail(f"{node.op} goes from {source} values to a {own} value", node)
            if node.op == "gather" and LEVEL_RANK[node.args[1].level] > LEVEL_RANK["row"]:
                fail("a gather's column index is one value per row", node)
            if node.op == "pretotal" and pretotal.knowable_beforehand(node.args[0]) is not None:
                fail("a sum over rows computed before the row pass reads the row pass", node)
            if node.op == "rowreduce" and node.attrs.get("kind") not in REDUCE_KINDS:
                fail(f"rowreduce kind {node.attrs.get('kind')!r}", node)
        elif node.level != level_of(*node.args):
            fail(f"level {node.level}, but its arguments' highest is {level_of(*node.args)}", node)
    for store in program.stores:
        limit = STORE_LIMIT.get(store.kind)
        if limit is None:
            fail(f"store kind {store.kind!r} of {store.field}")
        if LEVEL_RANK[store.value.level] > LEVEL_RANK[limit]:
            fail(f"a {store.kind} store of {store.field} from a {store.value.level} value", store.value)
        if store.value.level == "post" and store.kind not in ("col", "global"):
            fail(f"a post value stored as {store.kind} ({store.field})", store.value)
    if LEVEL_RANK[program.width.level] > LEVEL_RANK["global"] or program.width.dtype != "int":
        fail("the width is one int for the launch", program.width)
    return program


def run_passes(program: Program, passes) -> Program:
    """Apply `passes` in order, validating the lowering's program and each pass's result."""
    validate(program, "lowering")
    for p in passes:
        name = getattr(p, "__name__", None) or getattr(getattr(p, "func", None), "__name__", repr(p))  # partials
        program = validate(p(program), name)
    return program
