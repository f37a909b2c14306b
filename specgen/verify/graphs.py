"""One call captured into a CUDA graph: shared by the candidate's process and the in-process
runner (CPU stand-ins aside). No checking code here: the candidate's process imports it."""
from __future__ import annotations

from typing import Callable


def capture_one_call(launch: Callable[[object], int]):
    """Capture `launch(stream)` on a fresh stream: (graph or None, the call's return code, the
    capture's error in one line or None). The graph is kept only when both are clean; an error
    from capture_begin itself (before the kernel runs) propagates."""
    import torch

    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    torch.cuda.synchronize()
    code, problem = 0, None
    with torch.cuda.stream(side):
        graph.capture_begin()
        try:
            code = launch(side)
        finally:
            try:
                graph.capture_end()
            except Exception as error:  # noqa: BLE001 - the kernel broke the capture
                lines = str(error).strip().splitlines()
                problem = lines[0] if lines else type(error).__name__
    return (graph if problem is None and not code else None), code, problem
