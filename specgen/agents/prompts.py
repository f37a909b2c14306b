"""Prompts for LLM agents, rendered from the Jinja2 templates in templates/prompts/.

A conversation is: the system prompt (the rules), the task (spec, ABI header, reference,
GPU, baseline), then for each attempt shown an assistant turn (its source) and a user turn
(the feedback: nvcc diagnostics, the counterexample, the timings). Long histories keep the
best verified attempt and the latest few, plus a one-line summary of every attempt.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import jinja2

from ..reference_import import reference_display
from .base import EAGER_NOISE_RATIO, Attempt, KernelTask

SHOWN_ATTEMPTS = 4  # attempts replayed in full; older ones appear in the summary only
RESPONSE_EXCERPT = 2000  # characters of a code-less answer echoed back


def _template_dir() -> Path:
    """templates/prompts: inside the installed package (a wheel maps templates/ to
    specgen/templates), else in the source checkout (an editable install)."""
    package = Path(__file__).resolve().parents[1]
    for folder in (package / "templates" / "prompts", package.parent / "templates" / "prompts"):
        if (folder / "system.j2").is_file():
            return folder
    raise FileNotFoundError(f"the prompt templates are missing from {package}; reinstall specgen")


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(_template_dir()),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=False,
                             autoescape=False)
    env.filters["timings"] = format_timings
    return env


def render(name: str, **values) -> str:
    return environment().get_template(name).render(**values).strip() + "\n"


# ------------------------------------------------------------------------------ timings

def _us(value) -> str:
    return f"{value:.1f} us" if value >= 10 else f"{value:.2f} us"


def format_timings(timings: dict | None) -> str:
    """One line: kernel time and its ratio to eager, torch.compile, the baseline, the roofline."""
    if not timings:
        return "not measured"
    parts = []
    prefix = ""
    if timings.get("dims"):
        shape = ", ".join(f"{k}={v}" for k, v in timings["dims"].items())
        prefix = f"[{shape}{', ' + timings['dtype'] if timings.get('dtype') else ''}] "
    kernel = timings.get("kernel_us")
    if kernel is not None:
        parts.append(f"kernel {_us(kernel)}")
    for key, label in (("eager_us", "eager PyTorch"), ("compile_us", "torch.compile"),
                       ("baseline_us", "baseline")):
        other = timings.get(key)
        if other is None:
            continue
        ratio = ""
        if kernel:
            if kernel <= other:
                ratio = f" (kernel {other / kernel:.2f}x faster)"
            elif other / kernel >= EAGER_NOISE_RATIO:
                ratio = f" (a tie within run-to-run noise: kernel {kernel / other:.2f}x slower)"
            else:
                ratio = f" (kernel {kernel / other:.2f}x SLOWER)"
        parts.append(f"{label} {_us(other)}{ratio}")
    fraction = timings.get("roofline_fraction")
    if fraction is not None:
        parts.append(f"{fraction * 100:.0f}% of the memory roofline")
    return prefix + "; ".join(parts)


# ------------------------------------------------------------------------------ prompts

def system_prompt(task: KernelTask) -> str:
    spec = task.spec
    return render("system.j2", header_name=task.header_name, entry_points=task.entry_points(),
                  libraries=list(getattr(spec, "libraries", []) or []),
                  deterministic=getattr(spec, "deterministic", True),
                  saved=[(v.field, str(v)) for v in getattr(spec, "saved_values", ())])


def task_prompt(task: KernelTask) -> str:
    spec = task.spec
    tolerances = [(dtype, spec.tolerance_for(dtype)) for dtype in spec.dtypes]
    return render("task.j2", spec=spec, signature=str(spec.signature), tolerances=tolerances,
                  reference=reference_display(spec),
                  header=task.header, header_name=task.header_name, gpu=task.gpu,
                  baseline=task.baseline, baseline_timings=task.baseline_timings)


def feedback_text(number: int, stage: str, ok: bool, **details) -> str:
    """The feedback for attempt `number` (1-based), from feedback.j2."""
    values = {"message": "", "diagnostics": "", "reason": "", "counterexample": None, "report": "",
              "timings": None, "per_shape": None, "slower_than_eager": False, "target": None}
    values.update(details)
    return render("feedback.j2", number=number, stage=stage, ok=ok, **values)


def summary_line(number: int, attempt: Attempt) -> str:
    if attempt.stage == "extract":
        what = "no usable code"
    elif attempt.stage == "compile":
        what = "compile error" if not attempt.ok else "compiled (not verified)"
    elif attempt.stage == "verify":
        what = "wrong result"
    elif attempt.stage == "measure" and not attempt.ok:
        what = "correct, measuring failed"
    else:
        what = "correct, " + format_timings(attempt.details.get("timings"))
    return f"#{number}: {what}"


def _excerpt(text: str, limit: int = RESPONSE_EXCERPT) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} characters left out ...]\n{text[-half:]}"


def _shown(history: list[Attempt]) -> list[int]:
    """Indices of the attempts replayed in full: the best correct one and the latest few."""
    shown = list(range(max(0, len(history) - SHOWN_ATTEMPTS), len(history)))
    correct = [i for i, a in enumerate(history) if a.stage == "done" and a.ok
               and not a.details.get("slower_than_eager")]
    if correct:
        best = min(correct, key=lambda i: history[i].details.get("score", float("inf")))
        if best not in shown:
            shown = [best] + shown[1:]
    return shown


def conversation(task: KernelTask, history: list[Attempt]) -> list[dict[str, str]]:
    """Chat messages ({"role", "content"}) for the next proposal, system prompt first."""
    messages = [{"role": "system", "content": system_prompt(task)},
                {"role": "user", "content": task_prompt(task)}]
    shown = _shown(history)
    for index in shown:
        attempt = history[index]
        if attempt.candidate is not None:
            answer = f"```cuda\n{attempt.candidate.source.rstrip()}\n```"
        else:
            answer = _excerpt(attempt.details.get("response") or "(empty answer)")
        messages.append({"role": "assistant", "content": answer})
        messages.append({"role": "user", "content": attempt.feedback})
    if len(history) > len(shown):
        summary = "\n".join(summary_line(i + 1, a) for i, a in enumerate(history))
        messages[-1]["content"] += f"\nAll attempts so far:\n{summary}\n"
    return messages
