"""The agent interface: what an agent is given (KernelTask) and what it returns (Candidate).

Every kernel source in specgen comes from an Agent: an LLM provider, the built-in offline
generator, or a replayed transcript. The loop (agents/loop.py) calls `propose` once per
attempt with the history of earlier attempts, so an agent can refine its last answer.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import Rejected

if TYPE_CHECKING:  # spec.py is another module; only its type is needed here
    from ..spec import KernelSpec

# The stages an attempt can stop at; "done" means it compiled, verified and was measured.
STAGES = ("extract", "compile", "verify", "measure", "done")


# Run-to-run timing noise: a kernel whose eager/kernel time ratio is at least this is "not
# slower" than eager PyTorch (579 us vs 577 us is a tie, not a loss).
EAGER_NOISE_RATIO = 0.97


@dataclass
class GpuFacts:
    """What a kernel author needs to know about the target GPU."""

    name: str
    arch: str  # e.g. "sm_90"
    sms: int
    shared_mem_per_block: int  # bytes (opt-in maximum)
    l2_bytes: int
    copy_bandwidth_gbs: float | None = None  # measured device-to-device copy, GB/s


@dataclass
class KernelTask:
    """One spec to implement: the spec, its ABI header and what is known about the target."""

    spec: "KernelSpec"
    header: str  # the text of <op>_abi.h
    header_name: str  # "<op>_abi.h", the name the kernel #includes
    gpu: GpuFacts | None = None
    baseline: "Candidate | None" = None  # e.g. the built-in generator's kernel
    baseline_timings: dict | None = None

    @classmethod
    def for_spec(cls, spec, gpu: GpuFacts | None = None, baseline: "Candidate | None" = None) -> "KernelTask":
        """The task of `spec`, its ABI header written from the spec."""
        from .. import abi

        return cls(spec=spec, header=abi.header_text(spec), header_name=abi.header_filename(spec), gpu=gpu,
                   baseline=baseline)

    def entry_points(self) -> list[str]:
        """The C functions a kernel file for this task must define (ABI: one per direction)."""
        names = [f"{self.spec.name}_forward"]
        if self.spec.backward == "kernel":
            names.append(f"{self.spec.name}_backward")
        return names


@dataclass
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(self.input_tokens + other.input_tokens,
                     self.output_tokens + other.output_tokens,
                     self.cost_usd + other.cost_usd)


@dataclass
class Candidate:
    """One proposed kernel: the complete .cu source and who wrote it."""

    source: str
    agent: str
    model: str | None = None
    usage: Usage = field(default_factory=Usage)
    notes: str = ""  # free text from the agent (e.g. the model's prose, a schedule name)
    log: dict[str, Any] = field(default_factory=dict)  # for the transcript: prompt, raw answer


@dataclass
class Attempt:
    """What happened to one candidate; `feedback` is the text the next prompt carries."""

    candidate: Candidate | None  # None when no code could be extracted from the answer
    stage: str  # one of STAGES: where it stopped (or "done")
    ok: bool
    feedback: str
    details: dict[str, Any] = field(default_factory=dict)  # timings, verdict fields, ...


class AgentRefused(Rejected):
    """An agent cannot handle this op (e.g. outside the built-in generator's families)."""


class NoCandidate(Exception):
    """The agent answered but gave no usable source (no code, truncated, several files).

    The loop records a failed "extract" attempt whose feedback (`str(self)`) goes back to
    the agent; `usage` still counts against the budget.
    """

    def __init__(self, feedback: str, *, usage: Usage | None = None, model: str | None = None,
                 log: dict[str, Any] | None = None):
        super().__init__(feedback)
        self.feedback = feedback
        self.usage = usage or Usage()
        self.model = model
        self.log = log or {}


class AgentExhausted(Exception):
    """The agent has nothing more to propose (e.g. a replayed transcript ran out)."""


class Agent(ABC):
    """Proposes kernel sources. Implementations: providers, builtin, replay."""

    name: str = "agent"
    model: str | None = None

    @abstractmethod
    def propose(self, task: KernelTask, history: list[Attempt]) -> Candidate:
        """Return the next candidate for `task`, given every earlier attempt (oldest first).

        Raise AgentRefused when the op is outside what this agent can do, and
        EnvironmentMissing when an SDK, key or server is missing.
        """
