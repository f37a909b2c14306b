"""One case made concrete on the GPU: input views (possibly offset), scalars, dims, and the
float64 truth with the tolerance it is held to, for the forward or the backward direction."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..checking import run_reference_checked
from ..inputs import as_tuple, expected_outputs, make_inputs, upcast
from ..reference import reference_failure
from .compare import effective_atol, reference_error
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
    storages: dict[str, torch.Tensor]  # the buffer behind each input view (offset padding included)
    snapshots: dict[str, torch.Tensor]  # copies of those buffers, for the mutation check
    scalars: dict
    dims: dict[str, int]
    outputs: list[OutputSlot]
    truth: dict[str, torch.Tensor]  # float64 (integer outputs: their own dtype)
    atol: dict[str, float] = field(default_factory=dict)  # per output, widened by the reference's error
    rtol: float = 0.0
    spec_atol: float = 0.0
    device: torch.device = torch.device("cuda")
    reference: dict[str, torch.Tensor] = field(default_factory=dict)  # the reference in the working dtype

    def refill_inputs_from(self, other: "CaseData") -> None:
        """Copy another case's input values into this case's buffers (same pointers, new values)
        and take over its truth: what a kernel caching by pointer gets wrong."""
        for name, view in self.inputs.items():
            view.copy_(other.inputs[name])
        self.snapshots = {name: s.clone() for name, s in self.storages.items()}
        self.truth = other.truth
        self.atol, self.reference = other.atol, other.reference


def place(tensor: torch.Tensor, offset: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """A contiguous view of `tensor` on `device` starting `offset` elements into its buffer."""
    storage = torch.empty(tensor.numel() + offset, dtype=tensor.dtype, device=device)
    view = storage[offset:offset + tensor.numel()].view(tensor.shape)
    view.copy_(tensor)
    return view, storage


def _tolerance(spec, dtype: str) -> tuple[float, float]:
    t = spec.tolerance_for(dtype)
    return t.atol, t.rtol


def prepare(spec, case: Case, direction: str, device="cuda") -> CaseData:
    sig = spec.signature
    dims = case.dim_map
    host = make_inputs(sig, dims, case.dtype, seed=case.seed, distribution=case.distribution)
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
    atol = {name: effective_atol(spec_atol, reference_error(ref[name], truth[name])) for name in truth}
    views, storages = {}, {}
    for name, tensor in read.items():
        views[name], storages[name] = place(tensor, case.offset, device)
    return CaseData(case, direction, views, storages, {k: s.clone() for k, s in storages.items()}, scalars, dims,
                    written, truth, atol, rtol, spec_atol, torch.device(device), reference=ref)


def _backward(spec, case: Case, tensors: dict, scalars: dict, dims: dict, device):
    """Backward: the kernel reads the inputs, the forward outputs and the output gradients and
    writes the input gradients; the truth is the reference's autograd in float64."""
    sig = spec.signature
    fwd = run_reference_checked(spec, {**tensors, **scalars}, dims, case.dtype)
    floating_out = [(o, t) for o, t in zip(sig.outputs, fwd) if o.type.is_floating]
    gen = torch.Generator().manual_seed(case.seed + 1)
    grads = {f"grad_{o.name}": torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.dtype).to(device)
             for o, t in floating_out}
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
