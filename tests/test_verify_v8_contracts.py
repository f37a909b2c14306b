"""Verifier version 8's answers that live outside the checks: the ABI's canonical strides and the
wheel's architectures limited to those the kernels were verified on (held-out attacks-v7)."""
import pytest
import torch

from specgen.abi import canonical_strides, tensor_arg
from specgen.errors import UsageError
from specgen.package.model import check_archs_verified, verified_archs


def test_a_size_one_dim_of_a_contiguous_view_gets_the_canonical_stride():
    batch = torch.zeros(1, 5, 8)
    last = batch[:, -1, :]  # torch calls it contiguous, with stride 40 on its size-1 dim
    assert last.is_contiguous() and last.stride() == (40, 1)
    arg = tensor_arg(last)
    assert [arg.strides[i] for i in range(arg.ndim)] == [8, 1]
    assert [arg.sizes[i] for i in range(arg.ndim)] == [1, 8]


@pytest.mark.parametrize("sizes, strides", [((3, 4, 5), [20, 5, 1]), ((0, 4), [4, 1]), ((7,), [1]),
                                            ((2, 1, 3), [3, 3, 1])])
def test_canonical_strides_are_torchs_for_a_fresh_tensor(sizes, strides):
    assert canonical_strides(sizes) == strides == list(torch.empty(sizes).stride())


def test_the_binding_hands_kernels_strides_from_the_sizes():
    from pathlib import Path

    text = (Path(__file__).parents[1] / "templates/package/torch-ext/torch_binding.cpp.j2").read_text()
    body = text[text.index("specgen_tensor to_arg("):]
    body = body[:body.index("\n}\n")]
    assert "t.stride(" not in body  # torch's stride of a size-1 dim must never reach a kernel


def test_archs_are_read_from_verification_records():
    assert verified_archs(["sm_90 (NVIDIA H200)", None, "sm_90a (x)"]) == {"90", "90a"}


def test_an_unverified_architecture_is_refused_with_the_way_out():
    with pytest.raises(UsageError) as error:
        check_archs_verified("8.0;9.0+PTX", ["sm_90 (NVIDIA H200)"], allowed=False)
    text = str(error.value)
    assert "8.0" in text and "sm_90" in text and "--allow-unverified-archs" in text


def test_verified_architectures_pass_and_the_flag_or_no_records_let_others_through():
    check_archs_verified("9.0+PTX", ["sm_90 (NVIDIA H200)"], allowed=False)
    check_archs_verified("9.0a", ["sm_90 (NVIDIA H200)"], allowed=False)
    check_archs_verified("8.0;9.0+PTX", ["sm_90 (NVIDIA H200)"], allowed=True)
    check_archs_verified("8.0;9.0+PTX", [None], allowed=False)  # --no-verify builds: nothing to hold to
