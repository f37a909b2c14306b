"""Agents that write kernels (LLM providers, the built-in generator, replay) and the loop."""
from .base import (Agent, AgentExhausted, AgentRefused, Attempt, Candidate, GpuFacts, KernelTask,
                   NoCandidate, Usage)

__all__ = ["Agent", "AgentExhausted", "AgentRefused", "Attempt", "Candidate", "GpuFacts",
           "KernelTask", "NoCandidate", "Usage"]
