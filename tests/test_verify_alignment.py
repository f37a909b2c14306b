"""Input views of every alignment a vectorized kernel may mishandle: the verifier's offsets make
pointers aligned to exactly 2, 4, 8 and 16 bytes (for 2- and 4-byte elements), and the inputs
of one case differ in alignment (a kernel that checks one pointer and vector-loads another)."""
import torch

from specgen.verify.layout import Layout
from specgen.verify.strategies import ELEMENT_OFFSETS, input_offset


def alignment(address: int) -> int:
    """The largest power of two (up to 16) dividing the address."""
    return next(a for a in (16, 8, 4, 2, 1) if address % a == 0)


def test_the_offsets_reach_every_alignment_class_a_vector_load_cares_about():
    for dtype, classes in ((torch.float16, {2, 4, 8, 16}), (torch.bfloat16, {2, 4, 8, 16}),
                           (torch.float32, {4, 8, 16})):
        seen = set()
        for offset in ELEMENT_OFFSETS:
            layout = Layout()
            seen.add(alignment(layout.place("inputs", (64,), dtype, offset).offset))
        assert seen == classes, (dtype, seen)


def test_inputs_of_one_case_start_at_different_alignments_unless_the_case_is_aligned():
    assert [input_offset(0, i) for i in range(3)] == [0, 0, 0]
    layout = Layout()
    refs = [layout.place("inputs", (8, 64), torch.float32, input_offset(2, i)) for i in range(3)]
    assert len({alignment(r.offset) for r in refs}) >= 2  # 8-byte, 4-byte, 16-byte


def test_every_value_class_meets_an_aligned_shape_from_aligned_pointers():
    """A sniff of the input values in a kernel's vector path (e.g. float32 inputs upcast from
    bfloat16) is only reached at sizes and pointers that take that path."""
    from conftest import SPECS
    from specgen.spec import load_spec
    from specgen.verify.strategies import VALUE_CLASSES, boundary_cases

    spec = load_spec(SPECS / "gelu_tanh.yaml")
    cases = boundary_cases(spec)
    for distribution in VALUE_CLASSES:
        for dtype in spec.dtypes:
            assert any(c.distribution == distribution and c.dtype == dtype and c.offset == 0
                       and all(size % 16 == 0 for _, size in c.dims) for c in cases), (distribution, dtype)
