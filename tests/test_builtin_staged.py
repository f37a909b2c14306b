"""The staged family (families/staged*.py): a reference no single kernel takes, cut where its
reductions change layout, each stage lowered whole by the other families, one kernel file.

CPU: each test spec lowers to staged programs that the interpreter runs stage by stage against
the reference and autograd (float64); the cut's levels; the scalar's numbers written as
expressions of it; the composite source's shape. nvcc: the source compiles and exports only the
composite's entry points with C linkage. Not yet run on a GPU.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from specgen.agents.base import AgentRefused
from specgen.agents.builtin.cpu_check import check_backward, check_forward
from specgen.agents.builtin.families import family_of
from specgen.agents.builtin.families.staged import StagedProgram
from specgen.agents.builtin.families.staged_cut import cuts, layout_key, levels
from specgen.agents.builtin.families.staged_spec import form_node, with_scalar_inputs
from specgen.agents.builtin.generator import build_source, lower_spec
from specgen.agents.builtin.scalar_constants import FORMS, SCALES
from specgen.agents.builtin.trace import trace
from specgen.spec import load_spec

SPECS = Path(__file__).resolve().parent / "staged_specs"
ROOT = Path(__file__).resolve().parents[1]
STAGED = ["router_balance", "loudness_normalize", "pairwise_rank_decay"]
SIZES = [{"G": 3, "T": 7, "E": 5, "B": 3, "C": 2, "D": 9}, {"G": 1, "T": 2, "E": 1, "B": 1, "C": 1, "D": 1}]


def _spec(op):
    return load_spec(SPECS / f"{op}.yaml")


def _dims(spec, sizes):
    return {k: min(max(v, spec.dims[k][0]), spec.dims[k][1]) for k, v in sizes.items() if k in spec.dims}


@pytest.mark.parametrize("op", STAGED)
def test_a_reference_no_family_takes_whole_is_staged_and_matches(op):
    spec = _spec(op)
    programs = lower_spec(spec)
    assert all(isinstance(p, StagedProgram) for p in programs.values())
    assert max(len(p.stages) for p in programs.values()) >= 2
    for sizes in SIZES:
        check_forward(spec, _dims(spec, sizes))
        check_backward(spec, _dims(spec, sizes))
    if spec.signature.scalars:  # the scalar reaches every stage as a field, not its traced value
        check_forward(spec, _dims(spec, SIZES[0]), scalar_point=0.9)
        check_backward(spec, _dims(spec, SIZES[0]), scalar_point=0.9)


def test_the_stages_hand_over_float32_values_of_the_signature_dims():
    program = lower_spec(_spec("router_balance"))["forward"]
    assert [str(t) for t in program.mids.values()] == ["Tensor[G, T] float32"] * 2
    first, second = program.stages
    assert first.inputs == ["logits"] and second.outputs == ["out"]
    assert set(second.inputs) == {"logits", "dispatch", *program.mids}


def test_a_reference_one_kernel_takes_is_not_staged():
    programs = lower_spec(load_spec(ROOT / "specs" / "softmax.yaml"))
    assert family_of(programs) is None


def test_a_staging_that_fails_keeps_the_first_refusal(tmp_path):
    path = tmp_path / "sorted_gap.yaml"
    path.write_text(
        'name: sorted_gap\ndescription: the largest gap between sorted values of a row.\n'
        'signature: "sorted_gap(x: Tensor[N, D]) -> Tensor[N]"\ndtypes: [float32]\ndims: {N: [1, 64], D: [2, 64]}\n'
        'reference: |\n  import torch\n\n  def reference(x):\n      s = torch.sort(x, dim=-1).values\n'
        '      return (s[:, 1:] - s[:, :-1]).amax(-1)\nbackward: none\n')
    with pytest.raises(AgentRefused) as info:
        lower_spec(load_spec(path))
    assert "sorted_gap.yaml:" in str(info.value) and "LLM agent" in str(info.value)
    assert "stages" not in str(info.value)


def test_a_reduction_joins_the_later_pass_of_its_layout():
    """The one-hot's mean over T reads no reduction (level 1 by itself) but shares the
    probabilities' mean's layout, and nothing it feeds is earlier: it moves to level 2."""
    traced = trace(_spec("router_balance"), "forward")
    graph, _ = with_scalar_inputs(traced)
    level = levels(graph.graph)
    by_key = {}
    for node in graph.graph.nodes:
        key = layout_key(node)
        if key is not None:
            by_key.setdefault((key[2], level[node]), []).append(node.name)
    axes_levels = sorted((axes, lv, len(names)) for (axes, lv), names in by_key.items())
    assert axes_levels == [((0, 1), 3, 1), ((1,), 2, 2), ((2,), 1, 2)]
    assert cuts(graph.graph)[0] and all(level[n] == 1 for n in cuts(graph.graph)[0])


@pytest.mark.parametrize("form", sorted(FORMS))
def test_each_number_of_a_scalar_is_written_as_its_expression(form):
    for scale in SCALES:
        graph = torch.fx.Graph()
        scalar = graph.placeholder("s")
        graph.output(form_node(graph, scalar, form, scale))
        module = torch.fx.GraphModule(torch.nn.Module(), graph)
        for value in (0.37, 1.9e-4):
            try:
                want = scale * FORMS[form][0](value)
            except (ValueError, ZeroDivisionError):
                continue
            assert module(value) == want, (form, scale, value)


def test_the_scalar_is_an_input_of_the_stage_graph():
    traced = trace(_spec("loudness_normalize"), "forward")
    graph, names = with_scalar_inputs(traced)
    assert "eps" in names.values()
    numbers = [a for n in graph.graph.nodes for a in n.args if isinstance(a, float)]
    assert not [x for x in numbers if x in traced.scalar_forms]  # no traced sentinel left


def test_the_composite_source_runs_its_stages_from_namespaces():
    spec = _spec("router_balance")
    source = build_source(spec)
    stages = [s.spec.name for p in lower_spec(spec).values() for s in p.stages]
    for name in stages:
        assert f"namespace stage_{name} {{" in source
    # only the composite's entry points and size functions keep C linkage
    linked = re.findall(r'extern "C" \w+ (\w+)\(', source)
    assert sorted(linked) == sorted(f"router_balance_{d}{w}" for d in ("forward", "backward")
                                    for w in ("", "_workspace"))
    macros = 0
    for name in stages:  # a stage's macros end with it (the next stage defines its own)
        block, after = source.split(f"namespace stage_{name} {{", 1)[1].split(f"}}  // namespace stage_{name}\n", 1)
        defined = set(re.findall(r"^\s*#\s*define\s+(\w+)", block, re.M))
        assert defined <= set(re.findall(r"^#undef (\w+)", after, re.M))
        macros += len(defined)
    assert macros  # the row kernels' launch macros


@pytest.mark.nvcc
def test_the_composite_source_compiles_and_exports_only_its_entry_points():
    from specgen.agents.builtin.generator import compile_source
    from specgen.toolchain.symbols import defined_symbols

    spec = _spec("loudness_normalize")
    compiled = compile_source(spec, build_source(spec), arch="sm_90")
    assert not compiled.diagnostics, compiled.diagnostics
    exported = {s for s in defined_symbols(compiled.library) if s.startswith("loudness_normalize")}
    assert exported == {f"loudness_normalize_{d}{w}" for d in ("forward", "backward") for w in ("", "_workspace")}

