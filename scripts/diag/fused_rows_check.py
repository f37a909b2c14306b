"""GPU diagnostic (session 23): the axis family's fused variant against the default on tiny rows
(GroupNorm with one element a group: R == 1), every row's error against the float64 reference.
Prints a line per (variant, seed, offset): the rows whose output differs from the reference."""
import ctypes
import json
import sys

import torch

from specgen import abi
from specgen.agents.builtin.generator import build_source, compile_source
from specgen.agents.builtin.schedule import variants_named
from specgen.inputs import make_inputs
from specgen.spec import load_spec

# a spec with one output, and its dims (default: GroupNorm's one-element groups of session 23)
spec = load_spec(sys.argv[1] if len(sys.argv) > 1 else "tests/reduce_specs/groupnorm_affine_fwd.yaml")
dims = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {"B": 5, "G": 1, "L": 1}
for name in ("default", "axisfused"):
    source = build_source(spec, variants_named(name)[0]) if name != "default" else build_source(spec)
    lib = ctypes.CDLL(str(compile_source(spec, source).library))
    fn = getattr(lib, abi.entry_point(spec, "forward"))
    size = getattr(lib, abi.workspace_function(spec, "forward"))
    size.restype = ctypes.c_size_t
    for seed in range(6):
        for offset in (0, 4, 1):
            args = make_inputs(spec.signature, dims, "float32", seed=seed, device="cuda")
            moved = {}
            for k, t in args.items():  # the same values at `offset` elements into a larger buffer
                buf = torch.empty(t.numel() + offset, dtype=t.dtype, device="cuda")
                moved[k] = buf[offset:].view(t.shape).copy_(t)
            truth = spec.reference_fn()(**{k: v.double().cpu() for k, v in args.items()})
            out = torch.full(tuple(truth.shape), float("nan"), device="cuda")
            struct = abi.pack_args(spec, "forward", {**moved, "out": out}, {}, dims)
            ws = torch.empty(max(1, size(ctypes.byref(struct))), dtype=torch.uint8, device="cuda")
            abi.set_workspace(struct, ws)
            rc = fn(ctypes.byref(struct), None)
            torch.cuda.synchronize()
            err = (out.double().cpu() - truth).abs().flatten()
            bad = [(i, float(err[i])) for i in range(err.numel()) if err[i] > 1e-5 + 1e-5 * abs(float(truth.flatten()[i]))]
            print(f"{name:10s} seed {seed} offset {offset} rc {rc}: max err {float(err.max()):.3g}; bad rows {bad[:6]}")
