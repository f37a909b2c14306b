"""The builtin agent: readable source implementing the ABI, refusals, the no-GPU flow."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from specgen import abi, lock
from specgen.agents.base import AgentExhausted, AgentRefused, KernelTask
from specgen.agents.builtin import BuiltinAgent, build_source, generate_builtin
from specgen.spec import load_spec

SPECS = Path(__file__).resolve().parent.parent / "specs"
REDUCE_SPECS = Path(__file__).resolve().parent / "reduce_specs"


def _task(spec) -> KernelTask:
    return KernelTask(spec, abi.header_text(spec), abi.header_filename(spec))


def test_source_defines_both_entry_points_and_dispatches_dtypes():
    spec = load_spec(SPECS / "layernorm_gelu.yaml")
    source = build_source(spec)
    assert f'#include "{abi.header_filename(spec)}"' in source
    for direction in ("forward", "backward"):
        assert f'extern "C" cudaError_t {abi.entry_point(spec, direction)}(' in source
    for code in ("SPECGEN_FLOAT32", "SPECGEN_FLOAT16", "SPECGEN_BFLOAT16"):
        assert f"case {code}" in source
    assert "finalize_cols" in source  # weight/bias grads: the deterministic two-stage reduction
    assert "atomicAdd" not in source
    assert "// Schedule:" in source  # the schedule choice is commented


def test_cross_entropy_loss_is_a_two_stage_global_reduction():
    source = build_source(load_spec(SPECS / "cross_entropy.yaml"))
    assert "cross_entropy_fwd_finalize_global" in source and "atomicAdd" not in source


@pytest.mark.parametrize("path, direction", [(SPECS / "cross_entropy.yaml", "forward"),  # global partials
                                             (SPECS / "rmsnorm.yaml", "backward"),  # column partials
                                             (REDUCE_SPECS / "amax_dim1.yaml", "forward")])  # an axis reduction
def test_partials_come_from_the_frameworks_workspace(path, direction):
    """No allocation in a call: the size function asks the launcher itself for its bytes (one
    computation, so the two cannot drift) and the launcher takes the ABI's workspace."""
    spec = load_spec(path)
    source = build_source(spec)
    assert "cudaMallocAsync" not in source and "cudaFreeAsync" not in source
    function = abi.workspace_function(spec, direction)
    assert f'extern "C" size_t {function}(const {abi.struct_name(spec, direction)}* a)' in source
    size_fn = source[source.index(f"size_t {function}("):]
    size_fn = size_fn[:size_fn.index("\n}\n")]
    assert "_launch<float>(*a, nullptr, &need);" in size_fn
    assert source.count("if (need) { *need = ") == source.count('extern "C" size_t ')
    assert "A.workspace_bytes <" in source and "A.workspace" in source


def test_a_kernel_without_partials_defines_no_size_function():
    spec = load_spec(SPECS / "softmax.yaml")
    source = build_source(spec)
    assert "_workspace(" not in source and "size_t* need" not in source


def test_agent_proposes_once_then_is_exhausted():
    spec = load_spec(SPECS / "softmax.yaml")
    agent = BuiltinAgent()
    candidate = agent.propose(_task(spec), [])
    assert candidate.agent == "builtin" and "softmax_forward" in candidate.source
    with pytest.raises(AgentExhausted):
        agent.propose(_task(spec), [object()])


def test_agent_refuses_matmul_by_op_and_line():
    spec = load_spec(SPECS / "linear_bias_relu.yaml")
    with pytest.raises(AgentRefused, match=r"linear_bias_relu.yaml:13.*LLM agent"):
        BuiltinAgent().propose(_task(spec), [])


@pytest.mark.nvcc
@pytest.mark.slow
def test_generate_without_gpu_compiles_and_locks_without_records(tmp_path):
    shutil.copy(SPECS / "gelu_tanh.yaml", tmp_path / "gelu_tanh.yaml")
    spec = load_spec(tmp_path / "gelu_tanh.yaml")
    result = generate_builtin(spec, gpu=False)
    assert result.library.exists()
    assert result.kernel_path == tmp_path / "kernels" / "gelu_tanh.cu"
    entry = lock.Lock.load(tmp_path).entry("gelu_tanh")
    assert entry.agent == "builtin" and entry.records == []
    assert lock.status(spec).state == lock.FRESH


def test_generated_source_is_the_same_in_any_process_state():
    """Kernels are committed: generating another op first must not change a kernel's text."""
    from specgen.agents.builtin.generator import build_source
    from specgen.spec import load_spec

    rmsnorm = load_spec(SPECS / "rmsnorm.yaml")
    first = build_source(rmsnorm)
    build_source(load_spec(SPECS / "softmax.yaml"))  # advances any process-wide counters
    assert build_source(rmsnorm) == first
