"""The staged family (families/staged*.py): a reference no single kernel takes, cut where its
reductions change layout, each stage lowered whole by the other families, one kernel file.

CPU: each test spec lowers to staged programs that the interpreter runs stage by stage against
the reference and autograd (float64); the cut's levels; the scalar's numbers written as
expressions of it; the composite source's shape. nvcc: the source compiles and exports only the
composite's entry points with C linkage. Not yet run on a GPU.
"""
from __future__ import annotations

import math
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



@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("op", STAGED)
def test_staged_kernels_verify_on_the_gpu(op):
    """The whole kernel file (its stages, the workspace layout, the host code that runs them)
    through the verifier, as `specgen generate` would ship it."""
    from builtin_support import verifies_on_the_gpu

    verifies_on_the_gpu(_spec(op))


def _stub_host_library(spec, folder: Path, workspace_of) -> tuple:
    """The composite's host code (staged_emit.DirectionDriver) built with g++ around stub stages
    that record the arguments they are called with: the workspace layout and the stage calls
    checked on the CPU, no GPU. Returns (the library, the programs)."""
    import ctypes
    import subprocess

    from specgen import abi
    from specgen.agents.builtin.families.staged_emit import HOST_HELPERS, DirectionDriver, stage_structs
    from specgen.toolchain.cuda import find_cuda_toolkit

    programs = lower_spec(spec)
    parts = [f'#include "{abi.header_filename(spec)}"', "#include <string.h>",
             'extern "C" { int order[16]; int calls = 0; }']
    drivers = []
    for program in programs.values():
        sources = []
        for k, stage in enumerate(program.stages):
            sub, struct = stage.spec, abi.struct_name(stage.spec, "forward")
            parts.append(stage_structs(sub))
            parts.append(
                f'extern "C" {{ unsigned char recorded_{sub.name}[sizeof({struct})]; }}\n'
                f"namespace stage_{sub.name} {{\n"
                f"size_t {sub.name}_forward_workspace(const {struct}* a) {{ return {workspace_of(sub.name)}; }}\n"
                f"cudaError_t {sub.name}_forward(const {struct}* a, cudaStream_t) {{\n"
                f"  memcpy(recorded_{sub.name}, a, sizeof *a); order[calls++] = {k}; return cudaSuccess; }}\n}}")
            sources.append(f"{sub.name}_forward_workspace")  # its size function, named as a source names it
        drivers.append(DirectionDriver(spec, program, sources).text())
    (folder / "host.cpp").write_text("\n\n".join([*parts, HOST_HELPERS, *drivers]) + "\n")
    abi.write_header(spec, folder)
    subprocess.run(["g++", "-std=c++17", "-shared", "-fPIC", "-I", str(folder), "-I",
                    str(find_cuda_toolkit().include_dir), str(folder / "host.cpp"), "-o", str(folder / "host.so")],
                   check=True)
    return ctypes.CDLL(str(folder / "host.so")), programs


@pytest.mark.nvcc
@pytest.mark.parametrize("op", ["router_balance", "loudness_normalize"])
def test_the_host_code_lays_out_the_workspace_and_calls_each_stage_with_its_fields(op, tmp_path):
    import ctypes

    from specgen import abi
    from specgen.inputs import make_inputs

    spec = _spec(op)
    workspace_of = {}
    library, programs = _stub_host_library(spec, tmp_path, lambda name: workspace_of.setdefault(
        name, 1000 + 72 * len(workspace_of)))  # not multiples of 256
    # sizes whose handed-over values span several 256-byte blocks (a layout off by a factor shows)
    dims = {s: 37 + 6 * i for i, s in enumerate(spec.signature.symbols())} | {"C": 2}
    dims = {s: v for s, v in dims.items() if s in spec.signature.symbols()}
    args = make_inputs(spec.signature, dims, "float32", seed=0)
    sig = spec.signature
    tensors = {p.name: args[p.name] for p in sig.inputs}
    tensors |= {o.name: torch.empty(o.type.shape(dims)) for o in sig.outputs}
    tensors |= {f"grad_{o.name}": torch.randn(o.type.shape(dims)) for o in sig.outputs if o.type.is_floating}
    tensors |= {f"grad_{p.name}": torch.empty(p.type.shape(dims)) for p in sig.inputs if p.type.differentiable}
    scalars = {p.name: 0.25 for p in sig.scalars}
    for direction, program in programs.items():
        struct = abi.pack_args(spec, direction, tensors, scalars, dims)
        size_function = getattr(library, abi.workspace_function(spec, direction))
        size_function.restype = ctypes.c_size_t
        need = size_function(ctypes.byref(struct))
        mids = {name: math.prod(t.shape(dims)) * 4 for name, t in program.mids.items()}
        mid_bytes = sum(-(-b // 256) * 256 for b in mids.values())
        assert need == mid_bytes + max(workspace_of[s.spec.name] for s in program.stages)
        buffer = ctypes.create_string_buffer(need + 256)
        base = -(-ctypes.addressof(buffer) // 256) * 256
        entry = getattr(library, abi.entry_point(spec, direction))
        struct.workspace, struct.workspace_bytes = base, need - 1  # one byte short: refused, no stage runs
        ctypes.c_int.in_dll(library, "calls").value = 0
        assert entry(ctypes.byref(struct), None) == 1 and ctypes.c_int.in_dll(library, "calls").value == 0
        struct.workspace_bytes = need
        assert entry(ctypes.byref(struct), None) == 0
        assert list((ctypes.c_int * 16).in_dll(library, "order"))[:len(program.stages)] == list(range(len(program.stages)))
        placed = {}
        for stage in program.stages:
            sub = stage.spec
            raw = (ctypes.c_ubyte * ctypes.sizeof(abi.ctypes_struct(sub))).in_dll(library, f"recorded_{sub.name}")
            got = abi.ctypes_struct(sub).from_buffer_copy(bytes(raw))
            assert got.workspace == base + mid_bytes and got.workspace_bytes == need - mid_bytes
            for f in abi.fields(sub, "forward"):
                value = getattr(got, f.name)
                if f.role == "dim":
                    assert value == dims[f.name]
                elif f.role == "scalar":
                    assert value == 0.25
                elif f.is_tensor and f.name in program.mids:
                    shape = program.mids[f.name].shape(dims)
                    assert value.data % 256 == 0 and base <= value.data <= base + mid_bytes - mids[f.name]
                    assert list(value.sizes[:value.ndim]) == list(shape) and value.dtype == 0
                    assert list(value.strides[:value.ndim]) == abi.canonical_strides(shape)
                    placed.setdefault(f.name, value.data)
                    assert placed[f.name] == value.data  # every stage finds a value where it was written
                elif f.is_tensor:
                    assert value.data == getattr(struct, f.name).data  # the composite's own tensor
        spans = sorted((placed[n], placed[n] + mids[n]) for n in placed)
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))  # no overlap


def test_the_search_for_a_cut_lowers_each_piece_once_and_at_most_max_trials(monkeypatch):
    """Where no piece lowers, the search still ends: each distinct piece is lowered once (a
    held-out backward tried 501 pieces, 573 s, before the memo and the bound)."""
    from specgen.agents.builtin.families import staged

    seen = []
    monkeypatch.setattr(staged._Planner, "_lowers", lambda self, piece: seen.append(
        (piece.graph.code, tuple(piece.inputs), tuple(piece.outputs))) or False)
    monkeypatch.setattr(staged, "MAX_TRIALS", 5)
    with pytest.raises(AgentRefused, match="cannot be cut into stages"):
        staged._Planner(_spec("loudness_normalize"), "forward").plan()
    assert 1 < len(seen) <= 5 and len(set(seen)) == len(seen)
