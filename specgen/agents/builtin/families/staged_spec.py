"""A stage of a staged lowering as a spec of its own: its signature, dims and reference.

A stage (staged_cut.Piece) is a piece of the traced graph. Written as a forward-only spec whose
reference runs that piece, it goes through the same trace -> lower -> emit path as any spec, so
every family lowers it unchanged. Its tensors keep the composite's names and types; the values
handed between stages (`mid0`, `mid1`, ...) are float32 of their traced symbolic shape (the
composite computes in float32 whatever its storage dtype, so nothing is rounded to bfloat16
between stages). A float scalar reaches the graph as its trace sentinel and the numbers computed
from it (scalar_constants.FORMS); those become expressions of the scalar again here, so a stage
reads the scalar, never its traced value.
"""
from __future__ import annotations

import math
import operator

import sympy
import torch
from torch.fx import GraphModule, Node

from ....signature import Dim, TensorType, format_scalar
from ....spec import KernelSpec
from ..scalar_constants import FORMS, match
from .staged_cut import Piece

# the Python of each IR op of FORMS (applied in order to the scalar)
_FORM_STEPS = {
    "neg": lambda g, x: g.call_function(operator.neg, (x,)),
    "reciprocal": lambda g, x: g.call_function(operator.truediv, (1.0, x)),
    "square": lambda g, x: g.call_function(operator.mul, (x, x)),
    "sqrt": lambda g, x: g.call_function(math.sqrt, (x,)),
    "rsqrt": lambda g, x: g.call_function(operator.truediv, (1.0, g.call_function(math.sqrt, (x,)))),
    "log": lambda g, x: g.call_function(math.log, (x,)),
    "log1p": lambda g, x: g.call_function(math.log1p, (x,)),
    "one_minus": lambda g, x: g.call_function(operator.sub, (1.0, x)),
    "one_plus": lambda g, x: g.call_function(operator.add, (1.0, x)),
    "minus_one": lambda g, x: g.call_function(operator.sub, (x, 1.0)),
}
REFERENCE_HEADER = ("import math\nimport operator\n\nimport torch\nfrom math import inf, nan  # noqa: F401\n"
                    "from torch import device  # noqa: F401\n")


def with_scalar_inputs(traced) -> tuple[GraphModule, dict[Node, str]]:
    """A copy of the traced graph where each float scalar is a placeholder and each number the
    trace computed from one is that expression of it, and whose sizes come from its inputs
    (_numels_as_products, _sizes_from_inputs); and the name of every placeholder."""
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(traced.graph.graph, {}))
    gm = GraphModule(traced.graph, graph)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    names = dict(zip(placeholders, traced.inputs))
    scalars = [p.name for p in traced.spec.signature.scalars if p.type.kind == "float"]
    first_op = next(n for n in gm.graph.nodes if n.op != "placeholder")
    expressions: dict[tuple, Node] = {}
    with gm.graph.inserting_before(first_op):
        inputs = {}
        for name in scalars:
            inputs[name] = gm.graph.placeholder(f"scalar_{name}")
            names[inputs[name]] = name

    def expression(hit) -> Node:
        if hit not in expressions:
            form, field, scale = hit
            with gm.graph.inserting_before(first_op):
                expressions[hit] = form_node(gm.graph, inputs[field], form, scale)
        return expressions[hit]

    def replace(arg):
        if isinstance(arg, float) and traced.scalar_forms:
            hit = match(arg, traced.scalar_forms)
            if hit is not None and hit[1] in inputs:
                return expression(hit)
        return arg

    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node not in expressions.values():
            node.args = torch.fx.node.map_aggregate(node.args, replace)
            node.kwargs = torch.fx.node.map_aggregate(node.kwargs, replace)
    _numels_as_products(gm.graph)
    _sizes_from_inputs(gm.graph)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm, names


def _numels_as_products(graph: torch.fx.Graph) -> None:
    """x.numel() as the product of x's sizes: a mean's backward over [G, E] divides by G * E, which
    the lowerings name only through each size (dims that are not neighbours in the primary input
    have no one name)."""
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.sym_numel.default:
            continue
        tensor = node.args[0]
        rank = len(tensor.meta["val"].shape)
        with graph.inserting_before(node):
            product = None
            for i in range(rank):
                size = graph.call_function(torch.ops.aten.sym_size.int, (tensor, i))
                product = size if product is None else graph.call_function(operator.mul, (product, size))
        if product is not None:
            node.replace_all_uses_with(product)
            graph.erase_node(node)


def form_node(graph: torch.fx.Graph, scalar: Node, form: str, scale: float) -> Node:
    """`scale` times the FORMS `form` of the scalar, as graph nodes (Python arithmetic the stage's
    reference text spells out, computed in the same order as the form's own function)."""
    value = scalar
    for step in FORMS[form][1]:
        value = _FORM_STEPS[step](graph, value)
    return graph.call_function(operator.mul, (scale, value)) if scale != 1.0 else value


def field_types(spec, direction: str) -> dict[str, TensorType]:
    """The type of each tensor field a direction's graph reads or writes, as the kernel sees it."""
    sig = spec.signature.rows()
    types = {p.name: p.type for p in sig.inputs}
    if direction == "backward":
        types |= {o.name: o.type for o in sig.outputs}
        types |= {f"grad_{o.name}": o.type for o in sig.outputs if o.type.is_floating}
        types |= {f"grad_{p.name}": p.type for p in sig.inputs if p.type.is_floating}
    else:
        types |= {o.name: o.type for o in sig.outputs}
    return {name: TensorType(t.dims, t.dtype, t.value_range) for name, t in types.items()}


def mid_type(node: Node, symbols: dict) -> TensorType | None:
    """A handed-over value's type: float32 of its traced shape in the signature's dims (None when
    a size is no dim or literal of the signature, or the value is not floating)."""
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor) or not value.dtype.is_floating_point:
        return None
    dims = []
    for size in value.shape:
        expr = size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(int(size))
        if isinstance(expr, sympy.Integer):
            dims.append(Dim.literal(int(expr)))
        elif isinstance(expr, sympy.Symbol) and expr in symbols:
            dims.append(symbols[expr])
        else:
            return None
    return TensorType(tuple(dims), "float32")


def stage_spec(composite, name: str, piece: Piece, types: dict[str, TensorType], role: str) -> KernelSpec:
    """The forward-only spec that runs `piece`: its tensors named and typed as `types` says, the
    composite's float scalars, dims ranges and benchmark rows (on its own dims)."""
    scalars = {p.name: p for p in composite.signature.scalars}
    tensors = [n for n in piece.inputs if n not in scalars]
    used_scalars = [scalars[n] for n in piece.inputs if n in scalars]
    params = [f"{n}: {types[n]}" for n in tensors] + [str(p) for p in used_scalars]
    outputs = [f"{n}: {types[n]}" for n in piece.outputs]
    signature = f"{name}({', '.join(params)}) -> ({', '.join(outputs)})"
    symbols = list(dict.fromkeys(s for n in tensors + piece.outputs for s in types[n].symbols()))
    code = piece.graph.code.replace("def forward(self, ", "def _graph(", 1).replace("def forward(self)", "def _graph()", 1)
    arguments = ", ".join(piece.inputs)
    defaults = ", ".join([*tensors, *[f"{p.name}={format_scalar(p.default)}" for p in used_scalars]])
    reference = (f"{REFERENCE_HEADER}{code}\n\ndef reference({defaults}):\n"
                 f"    return _graph({arguments})\n")
    benchmark = list({tuple(sorted((s, row[s]) for s in symbols if s in row)): None
                      for row in composite.benchmark}.keys())
    return KernelSpec.model_validate({
        "name": name,
        "description": f"{role} of {composite.name} (the builtin generator's staged lowering)",
        "signature": signature, "dtypes": list(composite.dtypes),
        "dims": {s: composite.dims[s] for s in symbols if s in composite.dims},
        "reference": reference, "backward": "none",
        "benchmark": [dict(row) for row in benchmark if row],
        "path": composite.path, "reference_line": 1,
    })


def _sizes_from_inputs(graph: torch.fx.Graph) -> None:
    """A size read from a computed value read from an input of the same size instead: a size is
    no reason to compute the value (the backward's x.numel() of a recomputed [G, E] product
    would make a stage sweep [G, T, E] for it)."""
    sizes = {}
    for node in graph.nodes:
        value = node.meta.get("val")
        if node.op == "placeholder" and isinstance(value, torch.Tensor):
            for i, size in enumerate(value.shape):
                if isinstance(size, torch.SymInt):
                    sizes.setdefault(size.node.expr, (node, i))
    for node in graph.nodes:
        if node.op != "call_function" or node.target is not torch.ops.aten.sym_size.int:
            continue
        tensor, i = node.args
        if tensor.op == "placeholder":
            continue
        size = tensor.meta["val"].shape[i]
        found = sizes.get(size.node.expr) if isinstance(size, torch.SymInt) else None
        if found is not None:
            node.args = found
