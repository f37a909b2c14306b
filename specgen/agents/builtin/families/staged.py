"""Family: a reference no single kernel takes, run as stages, each one family's kernel.

Tried last (generator.lower_spec), after the row lowering, the other families and the row
lowering's retries have refused: the direction's traced graph is cut where its reductions change
layout (staged_cut.py), each piece becomes a forward-only spec of its own (staged_spec.py) that
the other families lower whole, and one kernel file runs the stages in order on the call's
stream, the values handed between them in the workspace (staged_emit.py). A direction that one
kernel takes is one stage. A piece no family lowers is cut again, up to MAX_STAGES stages; past
that, or where a cut's value has a shape the signature cannot name, the refusal stands.

    Switch Transformers' balance loss, forward: softmax statistics over E of [G, T, E] (rows),
    then the means over T of the probabilities and of the one-hot (a middle axis), then the
    sum over every (G, E) of their product (all axes to a scalar).

The stages' programs are the other families' own, so the CPU interpreter runs a staged program
stage by stage (`StagedProgram.run`); the verifier checks the whole kernel file like any other.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from ...base import AgentRefused
from ..trace import size_symbols, trace
from .staged_cut import Piece, cuts, extract, hints, layout_key
from .staged_spec import field_types, mid_type, stage_spec, with_scalar_inputs

MAX_STAGES = 4  # per direction: each stage is at least one more launch and a pass over its inputs
# pieces lowered to find the cut, per direction: each is a trace and a lowering (0.1-1 s). Held-out
# refusals tried up to 501 pieces (573 s, a backward) before this bound and the memo; every staging
# found so far (tests, read held-out problems) needed at most 9.
MAX_TRIALS = 32


@dataclass
class Stage:
    spec: object  # a forward-only KernelSpec (staged_spec.stage_spec)
    inputs: list[str]  # the composite's fields and handed-over values it reads (its own names)
    outputs: list[str]  # what it writes


@dataclass
class StagedProgram:
    op: str
    direction: str
    stages: list[Stage]
    mids: dict[str, object] = field(default_factory=dict)  # handed-over value -> TensorType, in order

    def programs(self) -> list:
        from ..generator import lower_spec

        return [lower_spec(stage.spec)["forward"] for stage in self.stages]

    def describe(self) -> str:
        lines = [f"staged program {self.op} {self.direction}: {len(self.stages)} stages, handing over "
                 + (", ".join(f"{n}: {t}" for n, t in self.mids.items()) or "nothing")]
        for stage, program in zip(self.stages, self.programs()):
            lines.append(f"  stage {stage.spec.name}: {', '.join(stage.inputs)} -> {', '.join(stage.outputs)}")
            lines += ["    " + line for line in program.describe().splitlines()]
        return "\n".join(lines)

    def run(self, tensors: dict, scalars: dict, dims: dict, outputs: dict) -> None:
        """The CPU interpreter: each stage's program in turn (float64 handed-over values)."""
        from ..cpu_check import run_lowered

        values = dict(tensors)
        for name, ttype in self.mids.items():
            values[name] = torch.full(ttype.shape(dims), float("nan"), dtype=torch.float64)
        for stage, program in zip(self.stages, self.programs()):
            sig = stage.spec.signature
            written = {o.name: outputs[o.name] if o.name in outputs else values[o.name] for o in sig.outputs}
            run_lowered(program, {p.name: values[p.name] for p in sig.inputs},
                        {p.name: scalars[p.name] for p in sig.scalars}, dims, written)


def lower_staged(spec) -> dict:
    """{direction: StagedProgram}, or AgentRefused."""
    if spec.saved_values:
        raise AgentRefused(f"{spec.path}: staged lowering does not take saved intermediates")
    if "float64" in spec.dtypes:
        raise AgentRefused(f"{spec.path}: staged lowering hands values over in float32; float64 is a dtype here")
    directions = ["forward"] + (["backward"] if spec.backward == "kernel" else [])
    return {direction: _Planner(spec, direction).plan() for direction in directions}


class _Planner:
    def __init__(self, spec, direction: str):
        self.spec, self.direction = spec, direction
        self.traced = trace(spec, direction)
        self.symbols, _ = size_symbols(self.traced)
        self.types = field_types(spec, direction)
        self.mid_of: dict[str, str] = {}  # a handed-over node's name -> its mid name
        self.tried: dict[tuple, bool] = {}  # a piece (its code, inputs, outputs) -> whether it lowers

    def plan(self) -> StagedProgram:
        gm, names = with_scalar_inputs(self.traced)
        if any(n.op == "get_attr" for n in gm.graph.nodes):
            raise AgentRefused(f"{self.spec.path}: staged lowering does not take tensors built while tracing")
        outputs = list(self.traced.outputs)
        if None in outputs:
            raise AgentRefused(f"{self.spec.path}: staged lowering needs every graph output to be a kernel output")
        whole = Piece(gm, [names[n] for n in gm.graph.nodes if n.op == "placeholder"], outputs)
        pieces = self.partition(whole, MAX_STAGES)
        if pieces is None:
            raise AgentRefused(f"{self.spec.path}: the {self.direction} cannot be cut into stages the builtin "
                               f"generator's families lower")
        stages = [self.stage(piece, k) for k, piece in enumerate(pieces)]
        mids = {name: self.types[name] for name in dict.fromkeys(n for s in stages for n in s.outputs)
                if name.startswith("mid")}
        return StagedProgram(self.spec.op, self.direction, stages, mids)

    def stage(self, piece: Piece, k: int) -> Stage:
        name = f"{self.spec.op}_{self.direction[0]}{k}"
        spec = stage_spec(self.spec, name, piece, self.types, f"stage {k} of the {self.direction}")
        _lower_whole(spec)
        return Stage(spec, list(piece.inputs), list(piece.outputs))

    def lowers(self, piece: Piece) -> bool:
        key = (piece.graph.code, tuple(piece.inputs), tuple(piece.outputs))
        if key not in self.tried:
            self.tried[key] = len(self.tried) < MAX_TRIALS and self._lowers(piece)
        return self.tried[key]

    def _lowers(self, piece: Piece) -> bool:
        spec = stage_spec(self.spec, f"{self.spec.op}_{self.direction[0]}_trial", piece, self.types, "a trial stage")
        try:
            _lower_whole(spec)
            return True
        except Exception:  # noqa: BLE001 - a refusal, or a graph a family did not foresee: not this cut
            if os.environ.get("SPECGEN_DEBUG_STAGED"):
                raise
            return False

    def partition(self, piece: Piece, budget: int) -> list[Piece] | None:
        """Pieces that each lower whole and compute `piece` in order (at most `budget`), or None."""
        if budget < 1:
            return None
        if self.lowers(piece):
            return [piece]
        if budget < 2:
            return None
        graph = piece.graph.graph
        for cut in cuts(graph):
            mids = self.name_mids(cut)
            if not cut or mids is None:
                continue
            names = self.node_names(piece) | dict(zip(cut, mids))
            later = extract(piece.graph, names, self.output_nodes(piece), piece.outputs, set(cut))
            for first in self.first_pieces(piece, names, cut, mids, budget - 1):
                rest = self.partition(later, budget - len(first))
                if rest is not None:
                    return first + rest
        return self.by_output_shape(piece, budget)

    def by_output_shape(self, piece: Piece, budget: int) -> list[Piece] | None:
        """The outputs of each shape computed apart (a normalized signal beside its [B, 1] scale:
        no one kernel writes both), each from the piece's inputs."""
        outputs = self.output_nodes(piece)
        groups: dict[tuple, list[int]] = {}
        for i, node in enumerate(outputs):
            groups.setdefault(tuple(hints(node.meta.get("val"))), []).append(i)
        if len(groups) < 2:
            return None
        names, pieces = self.node_names(piece), []
        for indices in groups.values():
            part = self.partition(extract(piece.graph, names, [outputs[i] for i in indices],
                                          [piece.outputs[i] for i in indices], set()), budget - len(pieces))
            if part is None:
                return None
            pieces += part
        return pieces

    def first_pieces(self, piece: Piece, names: dict, cut: list, mids: list[str], budget: int):
        """Ways to compute the handed-over values: one piece, or one per layout key."""
        whole = self.partition(extract(piece.graph, names, cut, mids, set()), budget)
        if whole is not None:
            yield whole
        groups: dict[tuple, list[int]] = {}
        for i, node in enumerate(cut):
            groups.setdefault(layout_key(node), []).append(i)
        if len(groups) < 2:
            return
        pieces = []
        for indices in groups.values():
            part = self.partition(extract(piece.graph, names, [cut[i] for i in indices], [mids[i] for i in indices],
                                          set()), budget - len(pieces))
            if part is None:
                return
            pieces += part
        yield pieces

    def name_mids(self, cut: list) -> list[str] | None:
        names = []
        for node in cut:
            if node.name not in self.mid_of:
                ttype = mid_type(node, self.symbols)
                if ttype is None:
                    return None
                name = f"mid{len(self.mid_of)}"
                self.mid_of[node.name], self.types[name] = name, ttype
            names.append(self.mid_of[node.name])
        return names

    @staticmethod
    def node_names(piece: Piece) -> dict:
        placeholders = [n for n in piece.graph.graph.nodes if n.op == "placeholder"]
        return dict(zip(placeholders, piece.inputs))

    @staticmethod
    def output_nodes(piece: Piece) -> list:
        output = next(n for n in piece.graph.graph.nodes if n.op == "output")
        return list(output.args[0])


def _lower_whole(spec) -> dict:
    from ..generator import lower_whole

    return lower_whole(spec)
