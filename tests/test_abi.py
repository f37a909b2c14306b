"""The kernel ABI: deterministic golden headers, and ctypes structs laid out exactly as C lays them out."""
from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest
import torch

from specgen import abi
from specgen.toolchain import find_cuda_toolkit
from specgen.spec import load_spec

from conftest import REPO, SPECS

GOLDEN = REPO / "tests" / "golden"


@pytest.mark.parametrize("op", ["rmsnorm", "add_rmsnorm", "cross_entropy", "rope"])
def test_header_matches_golden(op):
    spec = load_spec(SPECS / f"{op}.yaml")
    assert abi.header_text(spec) == (GOLDEN / f"{op}_abi.h").read_text(), (
        "the ABI header changed: if that is intended, bump ABI_VERSION when an existing field moves (fields "
        "appended at the end keep old kernels valid) and rewrite the golden file with "
        "`specgen header specs/OP.yaml -o tests/golden`")


def test_backward_struct_holds_inputs_outputs_and_gradients():
    spec = load_spec(SPECS / "add_rmsnorm.yaml")
    names = [(f.name, f.role) for f in abi.fields(spec, "backward")]
    assert names == [("x", "input"), ("residual", "input"), ("weight", "input"), ("eps", "scalar"),
                     ("N", "dim"), ("D", "dim"), ("out", "fwd_output"), ("residual_out", "fwd_output"),
                     ("saved_rstd", "saved_input"),  # the forward's saved reciprocal RMS
                     ("grad_out", "grad_output"), ("grad_residual_out", "grad_output"),
                     ("grad_x", "grad_input"), ("grad_residual", "grad_input"), ("grad_weight", "grad_input"),
                     ("workspace", "workspace"), ("workspace_bytes", "workspace")]
    # integer inputs (cross-entropy targets) get no gradient
    ce = load_spec(SPECS / "cross_entropy.yaml")
    assert abi.grad_input_names(ce) == ["grad_logits"]


def _c_layout(spec, direction, tmp_path):
    """offsetof/sizeof of every field, as the C compiler lays the struct out."""
    (tmp_path / abi.header_filename(spec)).write_text(abi.header_text(spec))
    struct = abi.struct_name(spec, direction)
    prints = [f'printf("sizeof %zu\\n", sizeof({struct}));']
    prints += [f'printf("{f.name} %zu\\n", offsetof({struct}, {f.name}));' for f in abi.fields(spec, direction)]
    (tmp_path / "probe.c").write_text(
        f'#include <stdio.h>\n#include <stddef.h>\n#include "{abi.header_filename(spec)}"\n'
        f"int main(void) {{ {' '.join(prints)} return 0; }}\n")
    include = str(find_cuda_toolkit().include_dir)
    subprocess.run(["cc", "-I", str(tmp_path), "-I", include, str(tmp_path / "probe.c"), "-o", str(tmp_path / "probe")],
                   check=True, capture_output=True)
    out = subprocess.run([str(tmp_path / "probe")], check=True, capture_output=True, text=True).stdout
    return dict(line.split() for line in out.splitlines())


@pytest.mark.nvcc  # needs the CUDA toolkit's headers
@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
@pytest.mark.parametrize("op, direction", [("add_rmsnorm", "forward"), ("add_rmsnorm", "backward"),
                                           ("cross_entropy", "forward"), ("swiglu", "backward")])
def test_ctypes_layout_matches_the_c_compiler(op, direction, tmp_path):
    spec = load_spec(SPECS / f"{op}.yaml")
    c = _c_layout(spec, direction, tmp_path)
    struct = abi.ctypes_struct(spec, direction)
    assert int(c.pop("sizeof")) == ctypes.sizeof(struct)
    for name, offset in c.items():
        assert getattr(struct, name).offset == int(offset), name


@pytest.mark.parametrize("op, direction", [("add_rmsnorm", "forward"), ("add_rmsnorm", "backward"),
                                           ("cross_entropy", "forward")])
def test_workspace_fields_come_last(op, direction):
    """Appended after every other field: a kernel compiled before they existed reads the same offsets."""
    spec = load_spec(SPECS / f"{op}.yaml")
    names = [f.name for f in abi.fields(spec, direction)]
    assert names[-2:] == ["workspace", "workspace_bytes"]
    struct = abi.ctypes_struct(spec, direction)
    last = getattr(struct, names[-3])
    assert struct.workspace.offset == last.offset + last.size
    assert struct.workspace_bytes.offset == struct.workspace.offset + ctypes.sizeof(ctypes.c_void_p)
    header = abi.header_text(spec)
    assert f"size_t {abi.workspace_function(spec, direction)}(const {abi.struct_name(spec, direction)}* a);" in header


def test_set_workspace_hands_over_pointer_and_size():
    spec = load_spec(SPECS / "rmsnorm.yaml")
    packed = abi.pack_args(spec, "forward", {"x": torch.randn(2, 4), "weight": torch.randn(4),
                                             "out": torch.empty(2, 4), "saved_rstd": torch.empty(2)}, {},
                           {"N": 2, "D": 4})
    assert (packed.workspace, packed.workspace_bytes) == (None, 0)
    scratch = torch.empty(1000, dtype=torch.uint8)
    abi.set_workspace(packed, scratch)
    assert (packed.workspace, packed.workspace_bytes) == (scratch.data_ptr(), 1000)
    abi.set_workspace(packed, None)
    assert (packed.workspace, packed.workspace_bytes) == (None, 0)


def test_names_workspace_function_needs_the_whole_name():
    spec = load_spec(SPECS / "rmsnorm.yaml")
    assert abi.names_workspace_function(spec, "size_t rmsnorm_forward_workspace(const rmsnorm_args* a)", "forward")
    assert not abi.names_workspace_function(spec, "size_t rmsnorm_forward_workspaces(void)", "forward")
    assert not abi.names_workspace_function(spec, "size_t rmsnorm_forward_workspace(void)", "backward")


def test_a_size_function_must_be_spelled_out_and_defined():
    """The package calls a size function only where the source names it (abi.names_workspace_function)."""
    spec = load_spec(SPECS / "rmsnorm.yaml")
    named = "extern \"C\" size_t rmsnorm_forward_workspace(const rmsnorm_args* a) { return 0; }"
    assert abi.workspace_function_problems(spec, named, {"rmsnorm_forward", "rmsnorm_forward_workspace"}) == []
    assert abi.workspace_function_problems(spec, "", {"rmsnorm_forward"}) == []
    (hidden,) = abi.workspace_function_problems(spec, "WS(rmsnorm)", {"rmsnorm_backward_workspace"})
    assert "rmsnorm_backward_workspace without spelling its name" in hidden
    (undefined,) = abi.workspace_function_problems(spec, named, {"rmsnorm_forward"})
    assert "names rmsnorm_forward_workspace but does not define it" in undefined


def test_pack_args_describes_the_tensors():
    spec = load_spec(SPECS / "rmsnorm.yaml")
    x = torch.randn(6, 10)[1:]  # an offset view
    w = torch.randn(10)
    out = torch.empty(5, 10, dtype=torch.bfloat16)
    rstd = torch.empty(5)  # the saved reciprocal RMS (specs/rmsnorm.yaml `saved:`)
    packed = abi.pack_args(spec, "forward", {"x": x, "weight": w, "out": out, "saved_rstd": rstd}, {"eps": 1e-3},
                           {"N": 5, "D": 10})
    assert packed.x.data == x.data_ptr() and packed.x.ndim == 2
    assert list(packed.x.sizes[:2]) == [5, 10] and list(packed.x.strides[:2]) == [10, 1]
    assert packed.out.dtype == abi.DTYPE_CODES["bfloat16"] and packed.eps == pytest.approx(1e-3)
    assert (packed.N, packed.D) == (5, 10) and packed.saved_rstd.data == rstd.data_ptr()
    with pytest.raises(KeyError, match="weight"):
        abi.pack_args(spec, "forward", {"x": x, "out": out, "saved_rstd": rstd}, {}, {"N": 5, "D": 10})
