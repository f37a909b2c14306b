"""Where a traced graph that no single kernel takes can be cut into stages.

Each family lowers one layout per program: rows and their columns (the row family), or a block
of reduced axes (axis_reduce). A reference that reduces over one axis and then over another
(Switch Transformers' balance loss: a softmax over the experts E of [G, T, E], then the mean
over the tokens T of its probabilities, then a mean over every (G, E)) is refused by each. Its
graph is cut here into stages, each a graph of its own that a family can lower whole; a stage
hands its values to the next through memory (staged.py makes each a spec, staged_emit.py the
one kernel file that runs them in order).

Levels. Every reduction and scan has a *layout key*: its kind, the shape it reads and the axes
it reduces or scans. Its level is 1 when it reads no other reduction; else its ancestors' top
level, when every ancestor at that level has its key (softmax's sum over E after its max over
E: one row pass), or one more. A reduction at level L whose key also appears at a later level
L', and whose dependent reductions are all past L', is moved to L' (it is computed with the
reductions it shares a pass with: the balance loss's token counts per expert join the
probabilities' mean over T).

A cut at level d hands over the reductions of level <= d that anything past d reads (directly or
through pointwise ops and views, which the next stage recomputes from them): the first stage
computes those, the second takes them as inputs and computes the rest.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.fx import Graph, GraphModule, Node

REDUCE_OPS = {"sum", "amax", "amin", "prod", "var", "argmax", "argmin", "max", "min"}
SCAN_OPS = {"cumsum", "cumprod", "logcumsumexp", "cummax", "cummin"}


def op_name(node: Node) -> str | None:
    """The op's short name (`sum` for prims.sum.default), or None for non-op nodes."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return None
    return node.target.overloadpacket.__name__


def hints(value) -> tuple:
    shape = getattr(value, "shape", None)
    if shape is None:
        return ()
    return tuple(int(s.node.hint) if isinstance(s, torch.SymInt) else int(s) for s in shape)


def layout_key(node: Node) -> tuple | None:
    """(kind, the shape read, the axes) of a reduction or scan; None for every other node."""
    name = op_name(node)
    if name not in REDUCE_OPS and name not in SCAN_OPS:
        return None
    source = node.args[0] if node.args else None
    if not isinstance(source, Node):
        return None
    shape = hints(source.meta.get("val"))
    axes = node.args[1] if len(node.args) > 1 else node.kwargs.get("dims", node.kwargs.get("dim"))
    if axes is None:
        axes = tuple(range(len(shape)))
    elif isinstance(axes, int):
        axes = (axes,)
    axes = tuple(sorted(a % len(shape) if shape else a for a in axes))
    return ("scan" if name in SCAN_OPS else "reduce", shape, axes)


def levels(graph: Graph) -> dict[Node, int]:
    """The level of every node: a reduction's or scan's as the module says, any other node's the
    highest level it reads (0: it reads none)."""
    level: dict[Node, int] = {}
    top_keys: dict[Node, set] = {}  # the layout keys at a node's level among what it reads
    for node in graph.nodes:
        inputs = [a for a in node.all_input_nodes if a in level]
        reads = max((level[a] for a in inputs), default=0)
        keys = set().union(*[top_keys[a] for a in inputs if level[a] == reads]) if reads else set()
        key = layout_key(node)
        if key is None:
            level[node], top_keys[node] = reads, keys
            continue
        level[node] = 1 if reads == 0 else reads if keys == {key} else reads + 1
        top_keys[node] = {key}
    _join_later_passes(graph, level)
    return level


def _join_later_passes(graph: Graph, level: dict[Node, int]) -> None:
    """Move a reduction to the latest level where its key appears, when nothing that depends on
    it is that early (the module's docstring)."""
    keys = {n: key for n in graph.nodes if (key := layout_key(n)) is not None}
    for node in reversed(list(keys)):
        later = [level[m] for m in keys if keys[m] == keys[node] and level[m] > level[node]]
        if not later:
            continue
        floor = min((level[m] for m in _dependent_layout(node)), default=None)
        fits = [lv for lv in later if floor is None or lv < floor]
        if fits:
            level[node] = max(fits)
            _relevel_pointwise(graph, level)


def _dependent_layout(node: Node) -> list[Node]:
    """The reductions and scans that read `node`, directly or through other nodes."""
    found, stack, seen = [], list(node.users), set()
    while stack:
        user = stack.pop()
        if user in seen:
            continue
        seen.add(user)
        if layout_key(user) is not None:
            found.append(user)
        stack.extend(user.users)
    return found


def _relevel_pointwise(graph: Graph, level: dict[Node, int]) -> None:
    for node in graph.nodes:
        if layout_key(node) is None:
            level[node] = max((level[a] for a in node.all_input_nodes if a in level), default=0)


def handed_over(graph: Graph, level: dict[Node, int], depth: int) -> list[Node]:
    """The values of level 1..depth that a node past `depth`, or the graph's output, reads: each
    such value itself when it is no larger than the reductions it is computed from (a per-
    iteration loss scaled by its weight), else those reductions (softmax's statistics, not its
    probabilities: the next stage recomputes them from the statistics and the input)."""
    frontier: list[Node] = []
    for node in graph.nodes:
        if node.op != "output" and level.get(node, 0) <= depth:
            continue
        for arg in node.all_input_nodes:
            if 0 < level.get(arg, 0) <= depth and arg not in frontier:
                frontier.append(arg)
    found: list[Node] = []
    for value in frontier:
        sources = _nearest_layout(value, level)
        val = value.meta.get("val")
        if _numel(value) <= max(map(_numel, sources), default=0) and getattr(val, "dtype", torch.int64).is_floating_point:
            sources = [value]  # (a mask or an index is recomputed from its float sources)
        found += [n for n in sources if n not in found]
    return found


def cuts(graph: Graph) -> list[list[Node]]:
    """The values to hand over, one list per way to cut, in the order tried: at each level
    (handed_over); then the reductions of one level themselves (a column sum that a per-element
    gradient reads: the next stage is pointwise); where reductions of several layouts at one level
    are independent (a row dot product beside a norm over everything, both read by one pointwise
    gradient), those of one layout at a time."""
    level = levels(graph)
    top = max(level.values(), default=0)
    found = [handed_over(graph, level, depth) for depth in range(1, top)]
    for lv in range(1, top + 1):
        groups: dict[tuple, list[Node]] = {}
        for node in graph.nodes:
            if level.get(node) == lv and layout_key(node) is not None:
                groups.setdefault(layout_key(node), []).append(node)
        found.append([n for group in groups.values() for n in group])
        if len(groups) > 1:
            found += list(groups.values())
    unique = []
    for cut in found:
        if cut and cut not in unique:
            unique.append(cut)
    return unique


def _numel(node: Node) -> int:
    size = 1
    for s in hints(node.meta.get("val")):
        size *= s
    return size


def _nearest_layout(node: Node, level: dict[Node, int]) -> list[Node]:
    """The reductions and scans `node` reads through pointwise ops and views (itself if it is one)."""
    found, stack, seen = [], [node], set()
    while stack:
        n = stack.pop()
        if n in seen or level.get(n, 0) == 0:
            continue
        seen.add(n)
        if layout_key(n) is not None:
            found.append(n)
            continue
        stack.extend(n.all_input_nodes)
    return found


@dataclass
class Piece:
    """A graph of one stage: placeholders named by the values they take (`inputs`, in order), and
    the values it returns (`outputs`, in order)."""

    graph: GraphModule
    inputs: list[str]
    outputs: list[str]


def extract(gm: GraphModule, names: dict[Node, str], outputs: list[Node], out_names: list[str],
            leaves: set[Node]) -> Piece:
    """The part of `gm` that computes `outputs` from its placeholders and the `leaves` (nodes
    taken as inputs: a former stage's results). `names` names every placeholder and leaf."""
    needed, stack = set(), list(outputs)
    while stack:
        n = stack.pop()
        if n in needed:
            continue
        needed.add(n)
        if n.op != "placeholder" and n not in leaves:
            stack.extend(n.all_input_nodes)
    graph, env, inputs = Graph(), {}, {}
    order = [n for n in gm.graph.nodes if n in needed]
    for n in [n for n in order if n.op == "placeholder"] + [n for n in order if n in leaves and n.op != "placeholder"]:
        env[n] = graph.placeholder(names[n])
        env[n].meta = dict(n.meta)
        inputs[env[n]] = names[n]
    for n in order:
        if n not in env:
            env[n] = graph.node_copy(n, lambda a: env[a])
    graph.output(tuple(env[o] for o in outputs))
    dropped = _size_only_inputs_dropped(graph)
    return Piece(GraphModule(gm, graph), [name for n, name in inputs.items() if n not in dropped], list(out_names))


def _size_only_inputs_dropped(graph: Graph) -> set[str]:
    """Placeholders read only for their sizes, where another placeholder has those sizes, are
    dropped (their sizes read from it): a stage whose last use of [I, B, 2, H, W] is its first
    size must not take it as its primary input, its rows. Returns the dropped nodes."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    sized = {}
    for node in placeholders:
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor) and not _size_only(node):
            for i, size in enumerate(value.shape):
                sized.setdefault(_expr(size), (node, i))
    dropped: set[Node] = set()
    for node in placeholders:
        if not node.users or not _size_only(node):
            continue
        uses = list(node.users)
        if any(_expr(node.meta["val"].shape[u.args[1]]) not in sized for u in uses):
            continue
        for use in uses:
            use.args = sized[_expr(node.meta["val"].shape[use.args[1]])]
        dropped.add(node)
        graph.erase_node(node)
    return dropped


def _size_only(node: Node) -> bool:
    return bool(node.users) and all(u.op == "call_function" and u.target is torch.ops.aten.sym_size.int
                                    for u in node.users)


def _expr(size):
    return size.node.expr if isinstance(size, torch.SymInt) else int(size)
