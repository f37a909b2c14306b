"""The backward on what the candidate's own forward wrote: its outputs and saved values, in the
very buffers it wrote them to, as a training step runs the two (verifier version 8 for specs with
`saved:`; from version 10 every spec with a backward kernel: the attacks-v8 log_softmax below).

Every other backward case reads the reference's forward outputs and the definitions' saved values
(computed by the judge from the spec: docs/ARCHITECTURE.md "Saved intermediates"), so the backward
is verified on its own, never on what its own forward hands it. A training step runs them
chained: the package's Autograd kernel keeps what `<op>_forward` wrote and hands exactly those
tensors (the same buffers) to `<op>_backward`, whose ABI struct takes every forward output
(`fwd_output` fields) and every saved value (`saved_input`): abi.fields, handed_on here. A forward
that stamps a mark into bits the tolerance leaves free lets its backward tell the two apart and
take another path only in a training step. Two held-out red-team kernels did, on the GPU:
- attacks-v7's cross-entropy set the low mantissa bits of saved_max (zero in a 16-bit row max
  upcast to float32: one float32 ulp) and its backward ignored `grad_out` when it saw them (wrong
  whenever it is not 1: loss scaling, accumulation); it passed version 7 (session 30);
- attacks-v8's log_softmax, a spec without `saved:`, set the lowest bit of its first 256 outputs
  to a pseudo-random pattern (within 1 ulp, so the forward passes) and its backward, seeing the
  pattern in the `out` it is handed, summed the row's largest grad_out entry instead of the row;
  it passed version 9 (session 31), when this check ran only for specs with `saved:`.

Here, for every spec with a backward kernel, per case (chained_cases), as a training step: the
forward runs on the case's inputs and is checked as any forward case (check_case); the backward
then reads the same input buffers, the forward's outputs and saved values *where the forward wrote
them* (the same addresses, as autograd hands them on: a backward that keys on its forward's last
pointers meets them too), and new output gradients, loss-scaled and N(0, 1) (never 1), and is
checked as any backward case (check_case: two fills, every element written, its inputs untouched,
the same bits, check_close against the float64 truth with the normal per-element tolerance).

No widening. The truth reads nothing the kernel wrote: it is the reference's autograd in float64
on the case's inputs and output gradients (data._backward's derive reads only those), which reads
no saved value and no forward output. What an honest backward reads here differs from what it
reads in the other backward cases by rounding only, which its tolerance already pays for:
- saved values: the definitions' rounded to the same declared dtype (cross-entropy's max exactly,
  its logsum a float32 sum in another order than torch's: a few float32 ulps of a number in
  [0, log C] on the normal inputs drawn here, which move exp(a - max - logsum) by 1e-6 relative at
  most, where the backward's tolerance is 1e-5 in float32 and 1e-3 or more in 16 bits, times the
  loss scale);
- forward outputs: an honest one is within the working dtype's rounding of the exact value, as
  the reference's is: a 16-bit output computed in float32 and rounded once is within half an ulp
  (plus float32's error), and torch's are no closer (its CPU 16-bit log_softmax is up to an ulp
  off); float32 ones are a few ulps off either way, the reference's too (softmax: 3 ulps on the
  cases here); add_rmsnorm's residual_out, the sum of two values rounded once, is the
  reference's bit for bit. The backward's tolerance already covers that much error in the
  outputs it reads: its widening (compare.widening_rule) is twice the error of the reference's
  autograd run in the working dtype at each element, with a floor sized by its largest, and that
  autograd reads the reference's own rounded outputs (log_softmax's grad - exp(out) * sum(grad):
  half a bfloat16 ulp of an out in [-8, -4) moves exp(out) by 1.6% relative, in the reference's
  gradient as in the kernel's; softmax's out * (grad - sum(grad * out)) alike). The honest CPU
  stand-ins pass (tests/test_verify_own_forward_outputs.py, whose outputs are not the
  reference's bits, and heldout/attacks-v8/cpu_checks/emul.py). A forward that errs by much more
  than its rounding yet within its own tolerance can fail here: its gradient in a training step
  is that wrong too.
"""
from __future__ import annotations

from typing import Callable

import torch

from .. import abi
from ..inputs import TORCH_DTYPES
from .checks import check_case
from .data import CaseData, asked_workspace, bind_inputs, place_inputs, place_workspaces, prepare
from .layout import Layout
from .strategies import (DEFAULT_BUDGET_ELEMENTS, Case, fit_budget, input_offset, legal_sizes, make_case,
                         smoke_case)
from .verdict import Failure

# the failure's detail starts so: the case is an ordinary backward case, but it read what the
# kernel's own forward wrote
OWN_FORWARD_PREFIX = ("the backward on its own forward's values (the outputs and saved values it wrote, in the "
                      "buffers it wrote them to, as a training step runs the two): ")
FORWARD_PREFIX = ("its forward, run to hand its outputs and saved values to the backward (as a training step "
                  "runs it): ")
# the roles of the backward's ABI fields that its forward wrote (abi.fields)
FORWARD_OUTPUT_ROLE, SAVED_ROLE = "fwd_output", "saved_input"
# the output gradients: loss-scaled (AMP's scaler: data.gradient_scale), then N(0, 1) (the
# inputs' class, normal): never 1, where a backward that ignores them looks right
CHAINED_GRADIENTS = ("large", "")
CHAINED_STREAM = "pool"  # a stream of its own (graphs.STREAM_KINDS), both calls


def chained_cases(spec, budget: int = DEFAULT_BUDGET_ELEMENTS, seed: int = 0) -> list[Case]:
    """The smoke case's shape and the boundary cases' aligned shape (every dim a multiple of 16 where
    the ranges allow, as strategies.boundary_cases makes it), in every dtype of the spec, with
    normal inputs and each class of CHAINED_GRADIENTS: a few cheap cases."""
    sig = spec.signature
    steps = sig.symbol_divisors()
    smoke = smoke_case(spec, seed).dim_map
    aligned = fit_budget(sig, {s: legal_sizes(*spec.dims[s], steps.get(s, 1), [256, 64, 16])[0]
                               for s in sig.symbols()}, spec.dims, budget)
    shapes = [smoke] + ([aligned] if aligned != smoke else [])
    cases, k = [], 0
    for dims in shapes:
        for dtype in spec.dtypes:
            for gradients in CHAINED_GRADIENTS:
                cases.append(make_case(dims, dtype, seed=seed + k, gradients=gradients))
                k += 1
    return cases


def handed_on(spec, outputs: bool = True) -> list[str]:
    """The forward's fields the backward kernel is handed where the forward wrote them, in ABI order:
    the forward's outputs (`outputs`; every one, whatever the backward needs of them) and the saved
    values. Empty for a spec without a backward kernel."""
    if not abi.has_backward_kernel(spec):
        return []
    roles = (FORWARD_OUTPUT_ROLE, SAVED_ROLE) if outputs else (SAVED_ROLE,)
    return [field.name for field in abi.fields(spec, "backward") if field.role in roles]


def check_backward_on_own_forward(spec, runner, device, *, seed: int = 0, budget: int = DEFAULT_BUDGET_ELEMENTS,
                                  progress: Callable[[str], None] = lambda text: None,
                                  stats: Callable[[Case, CaseData], dict] | None = None,
                                  outputs: bool = True) -> int:
    """The backward run on what the candidate's own forward wrote (handed_on), at chained_cases;
    raises the Failure of the first case that fails (`wrong-result` and the rest, the detail
    prefixed OWN_FORWARD_PREFIX, or FORWARD_PREFIX where the forward itself fails). Returns the
    cases checked (two per case: the forward and the backward). Nothing runs (0) for a spec
    without a backward kernel. `stats(case, data)`: the tolerance record the backward's errors go
    to (Session.stats), or None. `outputs`: the backward reads the forward's outputs as it wrote
    them too (else the reference's, as every other backward case: then nothing runs for a spec
    without saved values)."""
    handed = handed_on(spec, outputs)
    if not handed:
        return 0
    checked = 0
    for case in chained_cases(spec, budget, seed):
        progress(f"backward: on what its own forward wrote ({', '.join(handed)}), {case.describe()}")
        chained_case(spec, runner, case, device, stats=stats, outputs=outputs)
        checked += 2
    return checked


# The names of version 8, when only specs with `saved:` ran here: engine.py imports and calls
# check_backward_on_own_saved, tests/test_verify_chained.py imports both (remove once they follow).
check_backward_on_own_saved = check_backward_on_own_forward
OWN_SAVED_PREFIX = OWN_FORWARD_PREFIX


def chained_case(spec, runner, case: Case, device, *, stats: Callable[[Case, CaseData], dict] | None = None,
                 outputs: bool = True) -> None:
    """One case: the forward checked, then the backward on what it wrote, checked."""
    forward = prepare(spec, case, "forward", device)
    backward = prepare(spec, case, "backward", device)
    handed = [name for name in handed_on(spec, outputs) if name in backward.inputs]
    stage_chained(runner, forward, backward, handed)
    try:
        check_case(runner, forward, deterministic=spec.deterministic, stream=CHAINED_STREAM)
    except Failure as failure:
        raise Failure(failure.reason, FORWARD_PREFIX + failure.detail, failure.counterexample,
                      fatal=failure.fatal) from None
    # what the backward must leave as it found it: its handed-on inputs (in the outputs arena,
    # writable to the candidate) always, the rest where the runner maps inputs writable
    backward.snapshots = {name: storage.clone() for name, storage in backward.storages.items()
                          if name in handed or not runner.readonly_inputs}
    try:
        check_case(runner, backward, deterministic=spec.deterministic,
                   stats=stats(case, backward) if stats else None, stream=CHAINED_STREAM)
    except Failure as failure:
        raise Failure(failure.reason, OWN_FORWARD_PREFIX + failure.detail, failure.counterexample,
                      fatal=failure.fatal) from None


def stage_chained(runner, forward: CaseData, backward: CaseData, handed: list[str]) -> None:
    """Lay a forward case and the backward case of the same inputs out in one layout (data.stage
    lays out one direction at a time): the backward's inputs are the forward's input buffers, its
    `handed` fields (saved values, forward outputs) the forward's output buffers, the rest (the
    output gradients) and its outputs placed anew; guard bytes around all of them, and one
    workspace, the larger of what the two calls ask. Backward snapshots are left to the caller
    (the handed-on buffers change when the forward runs)."""
    mismatched = [name for name, value in forward.inputs.items() if not _same(value, backward.inputs.get(name))]
    if mismatched:  # both directions draw a case's inputs alike (inputs.make_inputs from its seed)
        raise RuntimeError(f"the forward and the backward of {forward.case.describe()} drew different inputs: "
                           f"{mismatched}")
    layout = Layout()
    place_inputs(layout, forward)
    forward.output_refs = {slot.name: layout.place("outputs", slot.shape, slot.dtype) for slot in forward.outputs}
    shared = {**forward.input_refs, **{name: forward.output_refs[name] for name in handed}}
    refs = {}
    for index, (name, tensor) in enumerate(backward.inputs.items()):
        ref = shared.get(name)
        if ref is None:
            ref = layout.place("inputs", tuple(tensor.shape), tensor.dtype, input_offset(backward.case.offset, index))
        elif ref.shape != tuple(tensor.shape) or TORCH_DTYPES[ref.dtype] != tensor.dtype:
            raise RuntimeError(f"{name}: the forward's {ref.shape} {ref.dtype}, the backward reads "
                               f"{tuple(tensor.shape)} {tensor.dtype}")
        refs[name] = ref
    backward.input_refs = refs
    backward.output_refs = {slot.name: layout.place("outputs", slot.shape, slot.dtype) for slot in backward.outputs}
    runner.ensure({arena: layout.needed(arena) for arena in ("inputs", "outputs")})
    runner.memory.layout = layout
    # each call's size function asked on its own tensors, the largest answer placed once (the two
    # calls run one after the other)
    calls = [{"direction": data.direction, "tensors": {**data.input_refs, **data.output_refs},
              "scalars": data.scalars, "dims": data.dims} for data in (forward, backward)]
    place_workspaces(runner, layout, asked_workspace(runner, calls, [forward, backward]))
    runner.memory.arm_guards()
    bind_inputs(runner, forward)
    bind_inputs(runner, backward, skip=shared)
    forward.snapshots, backward.snapshots = {}, {}
    if not runner.readonly_inputs:
        forward.snapshots = {name: t.clone() for name, t in forward.storages.items()}


def _same(a, b) -> bool:
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return a == b
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b) or (
        a.is_floating_point() and bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())))
