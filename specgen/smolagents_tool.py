"""A tool for agent frameworks: check, verify or time a kernel an agent wrote, against a spec.

`kernel_feedback(spec, kernel, action)` does the work and returns plain data (no framework
needed); `specgen_tool()` wraps it as a `smolagents.Tool` (the optional extra:
pip install 'specgen[smolagents]'), so any smolagents agent can call specgen on its own
kernels and read back the verdict, the compiler's diagnostics, the counterexample and the
timings.

    from smolagents import CodeAgent
    from specgen.smolagents_tool import specgen_tool
    agent = CodeAgent(tools=[specgen_tool()], model=...)

Actions: `check` (the spec passes `specgen check` and the kernel compiles), `verify` (also
the GPU verifier: every dtype, shapes from Hypothesis, anti-cheat checks) and `bench` (also
the timings against eager PyTorch and torch.compile). Verification and timing need a GPU:
without one the answer says so (exit_code 3) after the compile step.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from .errors import EXIT_ENVIRONMENT, EXIT_OK, EXIT_REJECTED, EnvironmentMissing, SpecgenError

ACTIONS = ("check", "verify", "bench")
TOOL_NAME = "specgen_kernel"
TOOL_DESCRIPTION = (
    "Check, verify or benchmark a CUDA kernel against a specgen spec. `spec`: the spec's YAML text or the path of "
    "a spec file. `kernel`: the complete .cu source (or its path), defining extern \"C\" <op>_forward (and "
    "<op>_backward when the spec has backward: kernel) against the ABI header <op>_abi.h. `action`: 'check' (the "
    "spec runs and the kernel compiles), 'verify' (also correct on the GPU for every dtype and many shapes) or "
    "'bench' (also timed against eager PyTorch and torch.compile). Returns a dict: ok, stage, reason, diagnostics, "
    "counterexample, timings, exit_code (0 ok, 1 rejected, 2 bad spec or input, 3 no nvcc/GPU).")


def _text_or_file(value: str, suffixes: tuple[str, ...]) -> tuple[str, Path | None]:
    if "\n" not in value and len(value) < 4096:
        path = Path(value.strip())
        if path.suffix in suffixes and path.is_file():
            return path.read_text(encoding="utf-8"), path
    return value, None


def _load(spec: str, folder: Path):
    """(spec, check result) from a path or YAML text; the text is checked in `folder`."""
    import yaml

    from .checking import check_spec

    text, path = _text_or_file(spec, (".yaml", ".yml"))
    if path is None:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError:
            data = None
        name = data.get("name") if isinstance(data, dict) and isinstance(data.get("name"), str) else "spec"
        path = folder / f"{name if name.isidentifier() else 'spec'}.yaml"
        path.write_text(text, encoding="utf-8")
    result = check_spec(path)
    if not result.ok:
        raise result.error
    return result.spec


def kernel_feedback(spec: str, kernel: str, action: str = "verify", *, arch: str | None = None) -> dict[str, Any]:
    """What specgen says about `kernel` for `spec` (see the module doc); never raises for the
    agent's mistakes: they come back as data with an exit code."""
    answer: dict[str, Any] = {"action": action, "op": None, "ok": False, "stage": "spec", "reason": None,
                              "diagnostics": None, "counterexample": None, "timings": None, "exit_code": EXIT_OK}
    if action not in ACTIONS:
        return {**answer, "reason": f"unknown action {action!r}; use one of {', '.join(ACTIONS)}", "exit_code": 2}
    from .agents.base import Candidate, KernelTask
    from .agents.evaluate import KernelEvaluator

    with tempfile.TemporaryDirectory(prefix="specgen-tool-") as folder:
        try:
            loaded = _load(spec, Path(folder))
            answer["op"] = loaded.name
            answer["stage"] = "compile"
            source, _ = _text_or_file(kernel, (".cu", ".cuh"))
            task = KernelTask.for_spec(loaded)
            evaluator = KernelEvaluator(task, arch=arch)
            candidate = Candidate(source, "tool")
            compiled = evaluator.compile(candidate)
            answer["diagnostics"] = compiled.diagnostics or None
            if not compiled.ok:
                return {**answer, "reason": "the kernel does not compile", "exit_code": EXIT_REJECTED}
            if action == "check":
                return {**answer, "ok": True, "reason": "the spec checks and the kernel compiles"}
            answer["stage"] = "verify"
            if not evaluator.can_verify:
                raise EnvironmentMissing(f"{action} needs a CUDA GPU and none is visible here; the kernel compiles")
            verdict = evaluator.verify(candidate, compiled.library)
            answer.update(reason=verdict.reason, counterexample=verdict.counterexample)
            if not verdict.passed:
                return {**answer, "exit_code": EXIT_REJECTED}
            if action == "verify":
                return {**answer, "ok": True}
            answer["stage"] = "bench"
            timings = evaluator.measure(candidate, compiled.library)
            timings.pop("benchmark", None)
            return {**answer, "ok": True, "timings": json.loads(json.dumps(timings, default=str))}
        except SpecgenError as error:
            return {**answer, "reason": str(error), "exit_code": error.exit_code}


def specgen_tool(*, arch: str | None = None):
    """The smolagents Tool (needs the `smolagents` extra)."""
    try:
        from smolagents import Tool
    except ModuleNotFoundError:
        raise EnvironmentMissing("the smolagents tool needs smolagents: pip install 'specgen[smolagents]'") from None

    class SpecgenKernelTool(Tool):
        name = TOOL_NAME
        description = TOOL_DESCRIPTION
        inputs = {
            "spec": {"type": "string", "description": "the spec's YAML text, or the path of a spec file"},
            "kernel": {"type": "string", "description": "the complete .cu source, or the path of a .cu file"},
            "action": {"type": "string", "nullable": True,
                       "description": "check | verify | bench (default verify)"},
        }
        output_type = "object"

        def forward(self, spec: str, kernel: str, action: str | None = None):
            return kernel_feedback(spec, kernel, action or "verify", arch=arch)

    return SpecgenKernelTool()


__all__ = ["ACTIONS", "EXIT_ENVIRONMENT", "kernel_feedback", "specgen_tool"]
