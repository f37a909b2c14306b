"""Host-only "kernels" for the verifier's native-thread and host-state tests (nvcc, no GPU): the
CPU runner's tensors are host memory, so an entry point's host code is all that runs. A forward-only
`scale` spec, and a source's library built through the verifier's own static checks."""
from __future__ import annotations

from specgen.spec import load_spec

SCALE_SPEC = """\
name: scale
description: Multiply by alpha.
signature: "scale(x: Tensor[N, D], alpha: float = 2.0) -> Tensor[N, D]"
dtypes: [float32]
dims: {N: [1, 64], D: [1, 256]}
reference: |
  def reference(x, alpha=2.0):
      return x * alpha
"""


def scale_spec(tmp_path_factory, backward: bool = False):
    """The `scale` spec (with `backward: kernel` where asked), written where a module-scoped fixture
    keeps it."""
    path = tmp_path_factory.mktemp("spec") / "scale.yaml"
    path.write_text(SCALE_SPEC + ("backward: kernel\n" if backward else ""))
    return load_spec(path)


def compiled_library(spec, source: str, tmp_path):
    """`source` compiled and passed by the verifier's static checks (asserted): its library."""
    from specgen.verify import static_checks

    verdict, compiled = static_checks(spec, source, arch="sm_90", cache_dir=tmp_path)
    assert verdict is None, verdict.summary()
    return compiled.library
