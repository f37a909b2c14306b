"""One case made concrete on the GPU: the inputs, scalars, dims, and the float64 truth with the
tolerance it is held to, for the forward or the backward direction. `stage` then lays the
case out in the runner's arenas (inputs, outputs, guard bytes) for the candidate to run."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..checking import run_reference_checked
from ..inputs import ZERO_ROWS_EVERY, TORCH_DTYPES, as_tuple, expected_outputs, make_inputs, upcast, with_specials
from ..reference import reference_failure
from ..saved import evaluate_saved
from .layout import Layout, TensorRef
from .strategies import Case, input_offset



@dataclass
class OutputSlot:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass
class CaseData:
    case: Case
    direction: str
    inputs: dict[str, torch.Tensor]  # every read-only tensor field of the struct, by ABI name
    storages: dict[str, torch.Tensor]  # the memory behind each input view (after staging: its arena bytes)
    snapshots: dict[str, torch.Tensor]  # copies of those, for the mutation check (empty: not checked)
    scalars: dict
    dims: dict[str, int]
    outputs: list[OutputSlot]
    truth: dict[str, torch.Tensor]  # float64 (integer outputs: their own dtype)
    atol: dict[str, float] = field(default_factory=dict)  # per output, widened by the reference's error
    rtol: float = 0.0
    spec_atol: float = 0.0
    device: torch.device = torch.device("cuda")
    reference: dict[str, torch.Tensor] = field(default_factory=dict)  # the reference in the working dtype
    input_refs: dict[str, TensorRef] = field(default_factory=dict)  # after staging: where each input lives
    output_refs: dict[str, TensorRef] = field(default_factory=dict)  # after staging: where each output goes
    keep_tolerance: bool = False  # checked many times (a timed set): keep each output's element tolerance
    # (truth, reference) from any inputs: a case prepared with `later` derives them when its output
    # is checked, from the staged inputs, and drops them after (derive_truth); the CPU's second
    # truth and reference come from it too (alternative_truth, reference_elsewhere)
    derive: Callable[[dict], tuple[dict, dict]] | None = None
    later: bool = False
    tolerance: dict[str, torch.Tensor] = field(default_factory=dict)  # kept element tolerances, by output
    # the truth computed on the CPU where it differs from the device's (alternative_truth)
    alternative: dict[str, torch.Tensor] = field(default_factory=dict)
    # the output gradients hold NaN and infinities (output_gradient): where the truth is not
    # finite, any non-finite value is as good (which of NaN or inf an overflowed sum gives
    # depends on its order; AMP's scaler treats them alike)
    nonfinite_any: bool = False
    # the output gradients' loss scale (gradient_scale): errors are recorded in unscaled units
    scale: float = 1.0
    # a lean case (prepare): its truth stands for the reference too; this computes the reference in
    # the working dtype when a check fails (working_reference_for_lean)
    lean: bool = False

    def refs(self) -> dict[str, TensorRef]:
        return {**self.input_refs, **self.output_refs}


def stage(runner, data: CaseData | list[CaseData], *, snapshots: bool = True,
          output_copies: int = 1, workspaces: int = 1) -> list[dict[str, TensorRef]]:
    """Lay one case (or several input sets of one shape) out in the runner's arenas: inputs
    copied in (offset views, as each case says), outputs placed `output_copies` times, guard
    bytes around each, and `workspaces` workspaces when the kernel asks for one (calls that run
    at the same time need one each). Each case's inputs become views of the arena and its
    `output_refs` the first copy; returns the output refs of every copy."""
    sets = data if isinstance(data, list) else [data]
    layout = Layout()
    for item in sets:
        place_inputs(layout, item)
    copies = [{slot.name: layout.place("outputs", slot.shape, slot.dtype) for slot in sets[0].outputs}
              for _ in range(output_copies)]
    runner.ensure({arena: layout.needed(arena) for arena in ("inputs", "outputs")})
    runner.memory.layout = layout
    place_workspace(runner, sets, copies, layout, workspaces)
    runner.memory.arm_guards()
    for item in sets:
        bind_inputs(runner, item)
        item.output_refs = copies[0]
        item.snapshots = {name: t.clone() for name, t in item.storages.items()} if snapshots else {}
    return copies


def place_inputs(layout: Layout, item: CaseData) -> None:
    """`item`'s inputs placed in the inputs arena, each at its offset view (as the case says)."""
    item.input_refs = {name: layout.place("inputs", tuple(t.shape), t.dtype, input_offset(item.case.offset, i))
                       for i, (name, t) in enumerate(item.inputs.items())}


def bind_inputs(runner, item: CaseData, skip=()) -> None:
    """`item`'s input values copied to their places (but those in `skip`, which hold what an earlier
    call wrote there), then its `inputs` and `storages` views of the arena."""
    for name, ref in item.input_refs.items():
        if name not in skip:
            runner.tensor(ref).copy_(item.inputs[name])
    item.inputs = {name: runner.tensor(ref) for name, ref in item.input_refs.items()}
    item.storages = {name: runner.tensor(TensorRef(ref.arena, ref.offset, (ref.nbytes,), "uint8"))
                     for name, ref in item.input_refs.items()}


WORKSPACE_FLOOR = 64 << 20  # bytes of workspace believable for any call
WORKSPACE_FACTOR = 4  # ... and up to this many times the call's tensor bytes


def workspace_limit(tensor_bytes: int) -> int:
    return max(WORKSPACE_FACTOR * tensor_bytes, WORKSPACE_FLOOR)


def workspace_problem(sizes: list[int], tensor_bytes: int) -> str | None:
    """Why the size function's answers are not believable (None: they are). A size_t that is
    really a negative number or uninitialized reads as an enormous size."""
    worst, limit = max(sizes, default=0), workspace_limit(tensor_bytes)
    if worst <= limit:
        return None
    garbage = " (a negative number or garbage, read as size_t)" if worst >= 1 << 63 else ""
    return (f"asked for {worst} bytes of workspace{garbage}, more than the {limit} bytes believable for a call "
            f"whose tensors hold {tensor_bytes} bytes (the larger of {WORKSPACE_FACTOR}x that and "
            f"{WORKSPACE_FLOOR >> 20} MiB)")


def place_workspace(runner, sets: list[CaseData], copies: list[dict[str, TensorRef]], layout: Layout,
                    count: int = 1) -> None:
    """The workspace every call of the staged case gets: the most the kernel's size function asks
    for over the case's calls (it sees their addresses), in the workspace arena, guarded like an
    output (and `count - 1` spares of that size, for calls at the same time). Asked once the
    inputs and outputs are mapped where they will stay."""
    place_workspaces(runner, layout, asked_workspace(runner, *staged_calls(sets, copies)), count)


def staged_calls(sets: list[CaseData], copies: list[dict[str, TensorRef]]) -> tuple[list[dict], list[CaseData]]:
    """Every call a staging makes possible (each input set with each output copy), and the case of each."""
    pairs = [(item, refs) for item in sets for refs in copies]
    return ([{"direction": item.direction, "tensors": {**item.input_refs, **refs}, "scalars": item.scalars,
              "dims": item.dims} for item, refs in pairs], [item for item, _ in pairs])


def asked_workspace(runner, calls: list[dict], named: list[CaseData]) -> int:
    """The most the kernel's size function asks over `calls` (one request), each answer held to its
    own call's tensor bytes (workspace_problem): a bad-workspace verdict names named[i]'s case."""
    ask = getattr(runner, "workspace_sizes", None)
    sizes = ask(calls) if ask else []
    for size, call, item in zip(sizes, calls, named):
        if problem := workspace_problem([size], sum(ref.nbytes for ref in call["tensors"].values())):
            from .. import abi
            from .verdict import BAD_WORKSPACE, Failure

            raise Failure(BAD_WORKSPACE, f"{abi.workspace_function(runner.spec, item.direction)} {problem} on "
                                         f"{item.case.describe()}. Return the bytes one call needs (0 for none)")
    return max(sizes, default=0)


def place_workspaces(runner, layout: Layout, nbytes: int, count: int = 1) -> None:
    """`count` workspaces of `nbytes` in the workspace arena (the first the layout's own, the rest its
    spares, for calls at the same time); none for 0."""
    if nbytes:
        layout.workspace = layout.place("workspace", (nbytes,), torch.uint8)
        layout.spare_workspaces = [layout.place("workspace", (nbytes,), torch.uint8) for _ in range(count - 1)]
        runner.ensure({"workspace": layout.needed("workspace")})


def _tolerance(spec, dtype: str) -> tuple[float, float]:
    t = spec.tolerance_for(dtype)
    return t.atol, t.rtol


def prepare(spec, case: Case, direction: str, device="cuda", *, later: bool = False, lean: bool = False) -> CaseData:
    """One case made concrete. `later`: the float64 truth and the working-dtype reference are
    computed only when an output is checked (derive_truth), from the staged inputs: the timed
    phase holds six input sets of a benchmark shape at once, and at 6 GB per tensor their truths
    would not fit beside them. `lean` (the case past 2^31 elements, there to catch a wrong row, not
    a rounding): the truth in float32 for 16-bit inputs and no working-dtype reference (its
    tolerance is the spec's, unwidened), so the case fits the GPU beside its truth. Only for 16-bit
    inputs, whose tolerance dwarfs float32's rounding: a float32 case keeps its float64 truth and
    the widening its reference's error gives (a long float32 sum errs past a float32 atol)."""
    lean = lean and case.dtype in ("float16", "bfloat16")
    sig = spec.signature
    dims = case.dim_map
    device = torch.device(device)
    # Values are drawn where they are used, and stay there: drawn on the CPU, or drawn on the GPU
    # and given back through the CPU (make_inputs' default device), every case paid pageable copies
    # (80% of a verification's time on the H200 in a profile: 45 s at the 10 GB cases).
    host = make_inputs(sig, dims, case.dtype, seed=case.seed, distribution=case.distribution,
                       overrides=dict(case.overrides),
                       scalars=dict(case.scalars), draw_on=device, device=device)
    tensors = {k: v for k, v in host.items() if isinstance(v, torch.Tensor)}
    scalars = {k: v for k, v in host.items() if not isinstance(v, torch.Tensor)}
    spec_atol, rtol = _tolerance(spec, case.dtype)
    scale = 1.0
    if direction == "forward":
        read = dict(tensors)
        written = [OutputSlot(o.name, shape, tdtype) for o, (shape, tdtype)
                   in zip(sig.outputs, expected_outputs(sig, dims, case.dtype))]
        written += saved_slots(spec, dims, case.dtype)
        derive = _forward_truth(spec, list(tensors), scalars, dims, case.dtype, [o.name for o in sig.outputs],
                                lean=lean)
    else:
        read, written, derive, scale = _backward(spec, case, tensors, scalars, dims, device, lean=lean)
    truth, ref = ({}, {}) if later else derive(read)
    # a backward is linear in its output gradients: loss-scaled ones scale the truth and every
    # honest error alike, so the spec's absolute tolerance scales with them (relative ones hold)
    atol = {slot.name: spec_atol * scale for slot in written}
    data = CaseData(case, direction, dict(read), {}, {}, scalars, dims, written, truth, atol, rtol, spec_atol,
                    device, reference=ref, derive=derive, later=later)
    data.nonfinite_any = direction == "backward" and case.gradient_class == "specials"
    data.scale = scale
    data.lean = lean
    if not later:
        data.alternative = alternative_truth(derive, read, truth)
    return data


ALTERNATIVE_ELEMENTS = 1 << 18  # the CPU's second truth only for small cases: it is rarely needed


def alternative_truth(derive, read: dict, truth: dict, device_type: str | None = None) -> dict[str, torch.Tensor]:
    """The truth computed again on the CPU, for the outputs where it differs from the device's,
    when an input holds NaN or infinities (a small case on a GPU only). torch's CPU and CUDA
    kernels do not agree everywhere there: softshrink's CUDA backward passes the gradient at a
    NaN input, its CPU kernel and its decomposition (what torch.compile and the built-in generator
    follow) give 0. Where the two truths differ, either is an answer torch gives."""
    host, _ = derive_on_the_cpu(derive, read, ALTERNATIVE_ELEMENTS, device_type, when=lambda tensors: any(
        t.is_floating_point() and not bool(torch.isfinite(t).all()) for t in tensors))
    differs = {}
    for name, value in host.items():
        here = truth.get(name)
        if here is None or not value.is_floating_point():
            continue
        value = value.to(here.device)
        same = (value == here) | (torch.isnan(value) & torch.isnan(here))
        if not bool(same.all()):
            differs[name] = value
    return differs


SECOND_REFERENCE_ELEMENTS = 1 << 24  # the CPU's reference only where it costs seconds at most


def reference_elsewhere(data: CaseData, device_type: str | None = None) -> dict[str, torch.Tensor]:
    """The reference in the working dtype run again on the CPU, for a case on a GPU whose check
    failed (at most SECOND_REFERENCE_ELEMENTS input elements); {} otherwise. torch's CPU and
    CUDA kernels round differently (the CPU's logcumsumexp carries double), and where the
    working dtype's answer is noise (an exp of the difference of two numbers near 1e7, whose
    float32 ulp is 1) one of them may land near the truth by chance and the other not: the
    reference's own error at an element is then the larger of the two (docs/VERIFIER.md
    "Tolerance")."""
    if data.derive is None:
        return {}
    return derive_on_the_cpu(data.derive, data.inputs, SECOND_REFERENCE_ELEMENTS, device_type)[1]


def derive_on_the_cpu(derive, read: dict, most: int, device_type: str | None = None,
                      when: Callable[[list], bool] = lambda tensors: True) -> tuple[dict, dict]:
    """(truth, reference) of a case on a GPU derived again from its inputs copied to the CPU, when
    they hold at most `most` elements and `when(their tensors)`; ({}, {}) for a case already on
    the CPU (the same answer), a larger one, or a reference that runs on the GPU only (the GPU's
    answer alone). The cheap tests first: `when` may read every element."""
    tensors = [t for t in read.values() if isinstance(t, torch.Tensor)]
    if not tensors or (device_type or tensors[0].device.type) == "cpu" or sum(t.numel() for t in tensors) > most:
        return {}, {}
    if not when(tensors):
        return {}, {}
    try:
        return derive({k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in read.items()})
    except Exception:  # noqa: BLE001 - a reference that runs on the GPU only
        return {}, {}


def derive_truth(data: CaseData) -> None:
    """The truth and reference of a case prepared with later=True, from its (staged) inputs."""
    if not data.truth and data.later:
        data.truth, data.reference = data.derive(data.inputs)


def working_reference_for_lean(data: CaseData) -> dict[str, torch.Tensor]:
    """A lean case's reference in the working dtype, from its staged inputs ({} for other cases).
    Asked for only when a lean case's check fails: without it the case's tolerance has no widening,
    and a backward that reads a 16-bit forward output inherits that output's rounding (log_softmax's
    exp(out) x sum(grad) at 131072-wide float16 rows: 0.0018 off against atol 1e-3, an honest
    control on the H200, session 32), as the reference run in float16 does. Memory: about half the
    float32 truth's; running out is the case's `not run` (Session.past_int32)."""
    if not data.lean or data.derive is None:
        return {}
    if data.device.type == "cuda":
        torch.cuda.empty_cache()
    return data.derive(data.inputs, working_only=True)[1]


def drop_truth(data: CaseData) -> None:
    """Give back a derived truth (the next check derives it again)."""
    if data.later:
        data.truth, data.reference = {}, {}


def saved_slots(spec, dims: dict, dtype: str) -> list[OutputSlot]:
    """The forward's saved intermediates: checked as outputs are (docs/ARCHITECTURE.md "Saved intermediates")."""
    return [OutputSlot(v.field, v.type.shape(dims), TORCH_DTYPES[v.type.dtype_for(dtype)])
            for v in spec.saved_values]


def truth_dtype(dtype: str, lean: bool) -> str:
    """The dtype the truth is computed in: float64, or float32 for a lean case of 16-bit inputs
    (its rounding, 6e-8 relative, is far below any 16-bit tolerance)."""
    return "float32" if lean and dtype in ("float16", "bfloat16") else "float64"


def cast_floating(args: dict[str, object], dtype: str) -> dict[str, object]:
    if dtype == "float64":
        return upcast(args)
    return {k: v.to(TORCH_DTYPES[dtype]) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
            for k, v in args.items()}


def _forward_truth(spec, names: list[str], scalars: dict, dims: dict, dtype: str, outputs: list[str],
                   lean: bool = False):
    def evaluated(args: dict, in_dtype: str) -> dict:  # the reference's outputs and the saved values' definitions
        return {**dict(zip(outputs, run_reference_checked(spec, args, dims, in_dtype))),
                **evaluate_saved(spec, args, in_dtype)}

    def derive(inputs: dict, working_only: bool = False) -> tuple[dict, dict]:
        # by name: the staged views, not the drawn copies
        args = {**{name: inputs[name] for name in names}, **scalars}
        if working_only:  # a lean case's reference, asked for when its check failed
            return {}, evaluated(args, dtype)
        if lean:  # the truth alone, standing for the reference too (no widening)
            exact_dtype = truth_dtype(dtype, lean)
            truth = evaluated(cast_floating(args, exact_dtype), exact_dtype)
            return truth, truth
        reference = evaluated(args, dtype)  # the widening, then the truth in float64
        return evaluated(upcast(args), "float64"), reference
    return derive


# AMP's GradScaler starts at this scale: float16 gradients arrive multiplied by it (the "large"
# cases' output gradients, capped so that 16 sigma stay finite in the dtype)
LOSS_SCALE = 2.0 ** 16


def gradient_scale(dtypes: list[torch.dtype], distribution: str) -> float:
    """The one factor a backward case's output gradients are all drawn with (output_gradient):
    the loss scale in "large" cases, capped by the narrowest of their dtypes, else 1."""
    if distribution != "large" or not dtypes:
        return 1.0
    return min(LOSS_SCALE, *(torch.finfo(dtype).max / 16 for dtype in dtypes))




def output_gradient(shape, dtype: torch.dtype, distribution: str, gen: torch.Generator,
                    scale: float = 1.0, index: int = 0) -> torch.Tensor:
    """A backward case's output gradient (of the `index`-th floating output): N(0, 1) times `scale`
    (gradient_scale: loss-scaled in "large" cases, as AMP's are); in "specials" cases with NaN and
    +-inf among them (2% each), as an overflowed step's are (AMP's scaler looks for them to skip the
    step: a kernel must pass them on). "ones": exactly 1 everywhere, what `loss.backward()` hands a
    scalar loss without a scaler (every plain training step: a kernel may not special-case it).
    "zero-rows": whole rows (along the last dim) exactly zero, the same rows in every output's
    gradient (padded positions, loss-masked prompt tokens), and in the second output's gradient one
    more row in three (an output the loss does not use): a kernel must still write those rows.
    "zeros" (version 13): exactly 0 everywhere, a scalar loss's included, as `loss * 0` hands it (a
    rank or micro-batch with no valid tokens kept in the graph, a loss weight scheduled from 0): a
    fast path for it must still write every gradient (held-out attacks-v10's cross-entropy cleared
    half of each float32 row). "first-only" and "first-zero" (version 16, specs of two or more
    floating outputs): every output's gradient but the first exactly zero, or the first's alone
    exactly zero, the others N(0, 1): a model that discards one of a fused op's outputs
    (`hidden, _ = norm(hidden, residual)`) hands autograd's zeros for it, and a fast path that takes a
    zero gradient for "output unused" must still carry the gradient that reaches the same input
    through the other output (held-out attacks-v11's add + RMSNorm dropped the residual path)."""
    if (distribution == "first-only" and index > 0) or (distribution == "first-zero" and index == 0):
        return torch.zeros(shape, dtype=dtype, device=gen.device)
    if distribution == "ones":
        return torch.ones(shape, dtype=dtype, device=gen.device)
    if distribution == "zeros":
        return torch.zeros(shape, dtype=dtype, device=gen.device)
    g = torch.randn(shape, generator=gen, dtype=torch.float64, device=gen.device)
    if scale != 1.0:
        g = g * scale
    if distribution == "specials":
        g = with_specials(g, torch.rand(shape, generator=gen, dtype=torch.float64, device=gen.device))
    if distribution == "one-hot" and g.dim() >= 1 and g.numel():
        rows = g.view(-1, g.shape[-1])
        hot = torch.randint(0, rows.shape[1], (rows.shape[0], 1), generator=gen, device=gen.device)
        rows.copy_(torch.zeros_like(rows).scatter_(1, hot, rows.gather(1, hot)))
    if distribution == "zero-rows" and g.dim() >= 1 and g.numel():
        rows = g.view(-1, g.shape[-1]) if g.dim() > 1 else g.view(-1, 1)  # a per-row output: its elements
        rows[1::ZERO_ROWS_EVERY] = 0.0
        if index == 1:
            rows[2::ZERO_ROWS_EVERY] = 0.0
    return g.to(dtype)


def reference_gradients(spec, values: dict, wrt: list[str], output_gradient) -> list:
    """The reference's gradients of the inputs named in `wrt` at `values` (inputs and scalars),
    each floating output that needs a gradient given `output_gradient(output_param, output)`;
    None where an input is unused (the domain screen and the backward's truth both ask this)."""
    leaves = {k: (v.detach().clone().requires_grad_(True) if k in wrt else v) for k, v in values.items()}
    with torch.enable_grad():
        outs = as_tuple(spec.reference_fn()(**leaves))
        pairs = [(out, output_gradient(o, out)) for o, out in zip(spec.signature.outputs, outs)
                 if o.type.is_floating and isinstance(out, torch.Tensor) and out.requires_grad]
        if not pairs:
            return [None] * len(wrt)
        return list(torch.autograd.grad([p[0] for p in pairs], [leaves[k] for k in wrt],
                                        grad_outputs=[p[1] for p in pairs], allow_unused=True))


def _backward(spec, case: Case, tensors: dict, scalars: dict, dims: dict, device, lean: bool = False):
    """Backward: the kernel reads the inputs, the forward outputs and the output gradients and
    writes the input gradients; the truth is the reference's autograd in float64. Returns what
    the kernel reads, what it writes, derive(read) -> (truth, reference) and the output
    gradients' scale (gradient_scale)."""
    sig = spec.signature
    fwd = run_reference_checked(spec, {**tensors, **scalars}, dims, case.dtype)
    floating_out = [(o, t) for o, t in zip(sig.outputs, fwd) if o.type.is_floating]
    gen = torch.Generator(device=device).manual_seed(case.seed + 1)
    scale = gradient_scale([t.dtype for _, t in floating_out], case.gradient_class)
    grads = {f"grad_{o.name}": output_gradient(t.shape, t.dtype, case.gradient_class, gen, scale, index)
             for index, (o, t) in enumerate(floating_out)}
    read = dict(tensors)
    read.update({o.name: t for o, t in zip(sig.outputs, fwd)})
    # the definitions' values, not a forward kernel's: a backward is verified on its own
    read.update(evaluate_saved(spec, {**tensors, **scalars}, case.dtype))
    read.update(grads)
    wrt = [p.name for p in sig.inputs if p.type.differentiable]  # no_grad inputs: no gradient to check
    names = list(tensors)
    written = [OutputSlot(f"grad_{p.name}", tuple(tensors[p.name].shape), tensors[p.name].dtype)
               for p in sig.inputs if p.type.differentiable]

    def gradients(inputs: dict, grads: dict, grad_dtype) -> dict[str, torch.Tensor]:
        try:
            got = reference_gradients(spec, {**inputs, **scalars}, wrt,
                                      lambda o, out: grads[f"grad_{o.name}"].to(grad_dtype(out)))
        except Exception as error:  # the user's reference
            raise reference_failure(spec, error, "while differentiating the reference (backward: kernel)") from None
        return {f"grad_{k}": (g if g is not None else torch.zeros_like(inputs[k])).detach()
                for k, g in zip(wrt, got)}

    grad_names = list(grads)

    def derive(staged: dict, working_only: bool = False) -> tuple[dict, dict]:
        inputs = {name: staged[name] for name in names}
        given = {name: staged[name] for name in grad_names}
        if working_only:  # a lean case's reference, asked for when its check failed
            return {}, gradients(inputs, given, lambda out: out.dtype)
        exact_dtype = truth_dtype(case.dtype, lean)
        wide = TORCH_DTYPES[exact_dtype]
        exact = gradients(cast_floating(inputs, exact_dtype), given, lambda out: wide if out.is_floating_point() else out.dtype)
        if lean:  # the truth stands for the reference (no widening): see prepare
            return exact, exact
        working = gradients(inputs, given, lambda out: out.dtype)
        return exact, working

    return read, written, derive, scale
