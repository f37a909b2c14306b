"""One case made concrete on the GPU: the inputs, scalars, dims, and the float64 truth with the
tolerance it is held to, for the forward or the backward direction. `stage` then lays the
case out in the runner's arenas (inputs, outputs, guard bytes) for the candidate to run."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..checking import run_reference_checked
from ..inputs import as_tuple, expected_outputs, make_inputs, upcast
from ..reference import reference_failure
from .layout import Layout, TensorRef
from .strategies import Case



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
    tolerance: dict[str, torch.Tensor] = field(default_factory=dict)  # kept element tolerances, by output

    def refs(self) -> dict[str, TensorRef]:
        return {**self.input_refs, **self.output_refs}


def stage(runner, data: CaseData | list[CaseData], *, snapshots: bool = True,
          output_copies: int = 1) -> list[dict[str, TensorRef]]:
    """Lay one case (or several input sets of one shape) out in the runner's arenas: inputs
    copied in (offset views, as each case says), outputs placed `output_copies` times, guard
    bytes around each. Each case's inputs become views of the arena and its `output_refs` the
    first copy; returns the output refs of every copy."""
    sets = data if isinstance(data, list) else [data]
    layout = Layout()
    for item in sets:
        item.input_refs = {name: layout.place("inputs", tuple(t.shape), t.dtype, item.case.offset)
                           for name, t in item.inputs.items()}
    copies = [{slot.name: layout.place("outputs", slot.shape, slot.dtype) for slot in sets[0].outputs}
              for _ in range(output_copies)]
    runner.ensure({arena: layout.needed(arena) for arena in ("inputs", "outputs")})
    runner.memory.layout = layout
    runner.memory.arm_guards()
    for item in sets:
        for name, ref in item.input_refs.items():
            runner.tensor(ref).copy_(item.inputs[name])
        item.output_refs = copies[0]
        item.inputs = {name: runner.tensor(ref) for name, ref in item.input_refs.items()}
        item.storages = {name: runner.tensor(TensorRef(ref.arena, ref.offset, (ref.nbytes,), "uint8"))
                         for name, ref in item.input_refs.items()}
        item.snapshots = {name: t.clone() for name, t in item.storages.items()} if snapshots else {}
    return copies


def _tolerance(spec, dtype: str) -> tuple[float, float]:
    t = spec.tolerance_for(dtype)
    return t.atol, t.rtol


def prepare(spec, case: Case, direction: str, device="cuda") -> CaseData:
    sig = spec.signature
    dims = case.dim_map
    device = torch.device(device)
    # Values are drawn where they are used: drawn on the CPU, every case paid float64 draws and
    # pageable copies on the host (half of a verification's time on the H200 in a profile).
    host = make_inputs(sig, dims, case.dtype, seed=case.seed, distribution=case.distribution,
                       scalars=dict(case.scalars), draw_on=device)
    tensors = {k: v.to(device) for k, v in host.items() if isinstance(v, torch.Tensor)}
    scalars = {k: v for k, v in host.items() if not isinstance(v, torch.Tensor)}
    spec_atol, rtol = _tolerance(spec, case.dtype)
    if direction == "forward":
        working = run_reference_checked(spec, {**tensors, **scalars}, dims, case.dtype)
        exact = run_reference_checked(spec, upcast({**tensors, **scalars}), dims, "float64")
        read = dict(tensors)
        written = [OutputSlot(o.name, shape, tdtype) for o, (shape, tdtype)
                   in zip(sig.outputs, expected_outputs(sig, dims, case.dtype))]
        truth = {slot.name: t for slot, t in zip(written, exact)}
        ref = {slot.name: w for slot, w in zip(written, working)}
    else:
        read, written, truth, ref = _backward(spec, case, tensors, scalars, dims, device)
    atol = {name: spec_atol for name in truth}
    return CaseData(case, direction, dict(read), {}, {}, scalars, dims, written, truth, atol, rtol, spec_atol,
                    device, reference=ref)


def _backward(spec, case: Case, tensors: dict, scalars: dict, dims: dict, device):
    """Backward: the kernel reads the inputs, the forward outputs and the output gradients and
    writes the input gradients; the truth is the reference's autograd in float64."""
    sig = spec.signature
    fwd = run_reference_checked(spec, {**tensors, **scalars}, dims, case.dtype)
    floating_out = [(o, t) for o, t in zip(sig.outputs, fwd) if o.type.is_floating]
    gen = torch.Generator(device=device).manual_seed(case.seed + 1)
    grads = {f"grad_{o.name}": torch.randn(t.shape, generator=gen, dtype=torch.float64, device=gen.device)
             .to(t.dtype) for o, t in floating_out}
    read = dict(tensors)
    read.update({o.name: t for o, t in zip(sig.outputs, fwd)})
    read.update(grads)
    wrt = [p.name for p in sig.inputs if p.type.is_floating]

    def gradients(inputs: dict, grad_dtype) -> dict[str, torch.Tensor]:
        leaves = {k: (v.detach().clone().requires_grad_(True) if k in wrt else v) for k, v in inputs.items()}
        try:
            with torch.enable_grad():
                outs = as_tuple(spec.reference_fn()(**leaves, **scalars))
                pairs = [(out, grads[f"grad_{o.name}"].to(grad_dtype(out)))
                         for o, out in zip(sig.outputs, outs) if o.type.is_floating and out.requires_grad]
                if not pairs:
                    got = [None] * len(wrt)
                else:
                    got = torch.autograd.grad([p[0] for p in pairs], [leaves[k] for k in wrt],
                                              grad_outputs=[p[1] for p in pairs], allow_unused=True)
        except Exception as error:  # the user's reference
            raise reference_failure(spec, error, "while differentiating the reference (backward: kernel)") from None
        return {f"grad_{k}": (g if g is not None else torch.zeros_like(leaves[k])).detach()
                for k, g in zip(wrt, got)}

    exact = gradients(upcast(tensors), lambda out: torch.float64 if out.is_floating_point() else out.dtype)
    working = gradients(tensors, lambda out: out.dtype)
    written = [OutputSlot(f"grad_{p.name}", tuple(tensors[p.name].shape), tensors[p.name].dtype)
               for p in sig.inputs if p.type.is_floating]
    return read, written, exact, working
