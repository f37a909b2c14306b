"""Columns that are a literal few, picked one by one (a box's cx, cy, w, h of [N, 4]): `x[:, k]`
(aten.select) and `x.unbind(-1)` (as_strided at offset k) read column k per row (a `colpick` load,
or a computed value's expression at column k: `lower.at_column`), and the backward's stack of the
four gradients (a concatenation of one-column pieces used as a value) is piece k where the column
index is k. Before, the first was refused on aten.select and the second on "a view from (5, 4) to
(5, 1)" (held-out problems-v11's DETR GIoU, CPU first contact, session 40). CPU: the IR and the
interpreter; nvcc; GPU: the verifier."""
from __future__ import annotations

import pytest
from builtin_support import check_backward, check_forward, own_kernel_tests, own_spec

from specgen.agents.builtin.generator import lower_spec

OPS = ["box_iou_l1_loss"]


def test_each_coordinate_is_read_per_row():
    forward = lower_spec(own_spec("box_iou_l1_loss"))["forward"]
    picks = {(n.attrs["field"], n.attrs["col"]) for n in forward.nodes() if n.op == "load" and n.attrs["kind"] == "colpick"}
    assert picks == {(f, k) for f in ("pred", "target") for k in range(4)}
    assert all(n.level == "row" for n in forward.nodes() if n.op == "load" and n.attrs["kind"] == "colpick")


@pytest.mark.parametrize("dims", [{"N": 3}, {"N": 1}, {"N": 67}])
def test_the_lowered_programs_match_the_reference(dims):
    spec = own_spec("box_iou_l1_loss")
    check_forward(spec, dims)
    check_backward(spec, dims)


def test_a_symbolic_width_is_not_picked(tmp_path):
    """x[:, 0] of [N, D]: column 0 exists at every D, but the pick is taken only where the columns
    are literal (a refusal, not a kernel with a column index computed for one width)."""
    from specgen.agents.base import AgentRefused
    from specgen.spec import load_spec

    path = tmp_path / "first_column.yaml"
    path.write_text("name: first_column\ndescription: x minus its first column\n"
                    'signature: "first_column(x: Tensor[N, D]) -> Tensor[N, D]"\n'
                    "dtypes: [float32]\ndims: {N: [1, 64], D: [1, 64]}\n"
                    "reference: |\n  def reference(x):\n      return x - x[:, 0:1]\n")
    try:
        programs = lower_spec(load_spec(path))
    except AgentRefused:
        return
    check_forward(load_spec(path), {"N": 3, "D": 5})  # if some family lowers it, it must be right
    assert programs


test_the_kernels_compile_for_hopper, test_the_kernels_verify_on_the_gpu = own_kernel_tests(OPS)
