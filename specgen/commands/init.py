"""`specgen init NAME`: write a commented starter spec that passes `specgen check`."""
from __future__ import annotations


from ..errors import UsageError

STARTER = '''\
# A specgen kernel spec. `specgen check {path}` validates it; `specgen build {folder}/`
# turns every spec in the folder into a verified kernel and a wheel.
name: {name}

# What the op computes, in words: it goes into the generated docstring and LLM prompts.
description: >
  Scale by a learned per-column weight, then apply SiLU.

# The op's signature. Tensors carry symbolic shapes (N, D, 2*H, D/2, literal sizes);
# integer tensors carry a dtype and value range (`t: Tensor[N] int64 in [0, C)`);
# scalars are float, int or bool with optional defaults; several outputs go in
# parentheses: `-> (y: Tensor[N, D], s: Tensor[N])`.
signature: "{name}(x: Tensor[N, D], weight: Tensor[D], alpha: float = 1.0) -> Tensor[N, D]"

# The working dtype(s) of every floating tensor.
dtypes: [float32, float16, bfloat16]

# Inclusive size ranges for the property tests: every symbol of the signature.
dims: {{N: [1, 65536], D: [1, 8192]}}

# The truth: plain PyTorch, run on the CPU by `specgen check` and in float64 by the verifier.
reference: |
  import torch.nn.functional as F

  def reference(x, weight, alpha=1.0):
      return F.silu(x * weight * alpha)

# kernel: generate a backward kernel; reference: autograd through the reference; none.
backward: kernel
# Inputs no model differentiates (rope's cos/sin tables) can go without a gradient:
# no_grad: [weight]

# Per-dtype tolerances (defaults exist for every dtype; the verifier also allows 4x the
# reference's own rounding error in the working dtype).
tolerance: {{bfloat16: {{atol: 2e-2, rtol: 2e-2}}}}

# Shapes to time: large enough to fill the GPU (hundreds of MB moved), plus a small one.
benchmark:
  - {{N: 16384, D: 4096}}
  - {{N: 64, D: 4096}}

# Two runs give identical bits (default true); libraries a kernel may call (default none).
deterministic: true
libraries: []
'''


def register(subparsers) -> None:
    p = subparsers.add_parser("init", help="write a commented starter spec",
                              description="Write specs/NAME.yaml, a commented starter spec that passes `specgen check`.")
    p.add_argument("name", help="the op name (a Python identifier)")
    p.add_argument("--dir", default="specs", help="folder to write into (default: specs)")
    p.add_argument("--force", action="store_true", help="overwrite an existing spec of that name")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..fsutil import write_atomic

    from ..names import name_problem
    from . import folder_argument

    if problem := name_problem(args.name, "op"):
        raise UsageError(f"NAME {args.name!r}: {problem}")
    folder = folder_argument(args.dir, "--dir")
    path = folder / f"{args.name}.yaml"
    if path.is_dir():
        raise UsageError(f"{path} is a folder; choose another NAME or --dir")
    if path.exists() and not args.force:
        raise UsageError(f"{path} exists already; pass --force to overwrite it, or choose another NAME")
    write_atomic(path, STARTER.format(name=args.name, path=path, folder=folder))
    print(f"wrote {path}; next: specgen check {path}")
    return 0
