"""The runtime helpers' shared-memory opt-in (prelude.PRELUDE), on the CPU by its text.

CUDA refuses a kernel's maximum dynamic shared memory when its sum with the kernel's static
shared memory passes the device's opt-in limit. Session 34's opt-in set the device limit itself,
so every row kernel (static reduction scratch, red_smem) would have failed each launch past 48 KB
of dynamic shared memory (csmem's column partials at D = 16384: 64 KB); found in session 35's
review before it reached a GPU.
"""
from __future__ import annotations

import re

import pytest
from conftest import SPECS

from specgen.agents.builtin import build_source
from specgen.agents.builtin.prelude import PRELUDE
from specgen.agents.builtin.schedule import variant_named
from specgen.spec import load_spec


def _body(name: str) -> str:
    text = PRELUDE[PRELUDE.index(name):]
    return text[:text.index("\n}\n")]


def test_the_opt_in_leaves_room_for_the_kernels_static_shared_memory():
    limit = _body("inline size_t dyn_smem_limit()")
    assert "cudaFuncGetAttributes(&fa, Kernel)" in limit
    assert "smem_optin() - fa.sharedSizeBytes" in limit
    opt_in = _body("inline cudaError_t opt_in_smem(size_t smem)")
    assert "const size_t most = dyn_smem_limit<Kernel>();" in opt_in
    set_to = re.search(r"cudaFuncAttributeMaxDynamicSharedMemorySize, \(int\)(\w+)\)", opt_in).group(1)
    assert set_to == "most"  # never the device's whole limit
    assert "return smem < done ? cudaSuccess : cudaErrorInvalidValue;" in opt_in  # past the limit: refused
    # a staged cluster launch opts in the same way before cudaLaunchKernelEx
    cluster = _body("inline cudaError_t launch_clusters_dyn(")
    assert cluster.index("opt_in_smem<Kernel>(smem)") < cluster.index("launch_clusters(Kernel,")


def test_the_limit_and_the_opt_in_are_asked_once_a_device():
    """The hosts' gates ask the limit at every call (csmem's csm_ok: every rmsnorm call) and a
    launch opts in at every call: each a driver call per op call before session 36's review.
    Both keep a per-device value, published in one atomic store (no half-written entry)."""
    for name in ("inline size_t dyn_smem_limit()", "inline cudaError_t opt_in_smem(size_t smem)"):
        body = _body(name)
        assert re.search(r"static std::atomic<size_t> \w+\[kMaxDevices\];", body), name
        assert "const int device = current_device();" in body, name
        assert body.count(".store(") == 1 and body.count(".load(") == 1, name
    assert "cudaFuncSetAttribute" in _body("inline cudaError_t opt_in_smem(size_t smem)")
    # the launches of row kernels call the cached helpers, templated on the kernel itself
    backward = build_source(load_spec(SPECS / "rmsnorm.yaml"), variant_named("csmem")).split(
        "// ======================= backward")[1]
    assert "sg::launch_dyn<rmsnorm_bwd_rows<T, V, P, I, ((P) > 32 ? (P) : 128)>>(grid, block," in backward
    assert "sg::blocks_per_sm_dyn<rmsnorm_bwd_rows<T, V, P, I, ((P) > 32 ? (P) : 128)>>(block," in backward


def test_the_hosts_shared_memory_gates_ask_the_kernels_own_limit():
    backward = build_source(load_spec(SPECS / "rmsnorm.yaml"), variant_named("csmem")).split(
        "// ======================= backward")[1]
    assert "const bool csm_ok = csm_bytes <= sg::dyn_smem_limit<rmsnorm_bwd_rows<T, VEC, 64, ITEMS_MAX, 64>>();" \
        in backward
    staged = build_source(load_spec(SPECS / "softmax.yaml"), variant_named("loopstage"))
    assert "stage_bytes <= sg::dyn_smem_limit<softmax_fwd_rows<T, VEC, 4096, 0, 512>>()" in staged
    assert "sg::smem_optin()" not in staged.split("// ---- end of helpers ----")[1]  # no gate on the raw limit


def test_an_optional_helper_block_defines_nothing_the_helpers_define():
    """A kernel carries PRELUDE and the optional blocks it calls into: a function in both is a
    redefinition nvcc refuses (a copy of launch_cluster in PRELUDE_CLUSTER_N failed every
    few-row loss kernel's compile, found reading session 35's change)."""
    from specgen.agents.builtin import prelude

    def defined(text: str) -> set[str]:
        return set(re.findall(r"^inline [\w:<>*, ]+? (\w+)\(", text, re.M))

    base = defined(PRELUDE)
    assert {"launch_clusters", "launch_cluster", "opt_in_smem", "dyn_smem_limit", "launch_clusters_dyn"} <= base
    for name in dir(prelude):
        if name.startswith("PRELUDE_"):
            assert not defined(getattr(prelude, name)) & base, name


@pytest.mark.nvcc
def test_a_few_row_loss_kernel_with_its_own_cluster_launch_compiles():
    from specgen.agents.builtin.generator import compile_source

    spec = load_spec(SPECS / "cross_entropy.yaml")
    source = build_source(spec, variant_named("fewtwo"))
    assert "sg::launch_cluster_n(" in source and "sg::launch_cluster<" in source
    compile_source(spec, source, arch="sm_90")


@pytest.mark.nvcc
def test_the_kernels_launching_through_the_cached_helpers_compile():
    """launch_dyn / blocks_per_sm_dyn / dyn_smem_limit templated on the kernel (csmem), and the
    staged cluster's launch_clusters_dyn: nvcc takes a kernel instantiation as the template argument."""
    from specgen.agents.builtin.generator import compile_source

    rmsnorm = load_spec(SPECS / "rmsnorm.yaml")
    source = build_source(rmsnorm, variant_named("csmem"))
    assert "sg::launch_dyn<" in source and "sg::blocks_per_sm_dyn<" in source
    compile_source(rmsnorm, source, arch="sm_90")
    softmax = load_spec(SPECS / "softmax.yaml")
    staged = build_source(softmax, variant_named("loopstage"))
    assert "sg::launch_clusters_dyn<" in staged
    compile_source(softmax, staged, arch="sm_90")
