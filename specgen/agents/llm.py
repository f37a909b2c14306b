"""What every LLM provider shares: prompt, call with retries, token cost, code extraction.

A provider subclass only says how to build its SDK client and how to send a conversation
(`_send(messages) -> Reply`). The SDKs' own retries are switched off (max_retries=0) so one
policy applies everywhere and is tested: exponential backoff on 429, 5xx, timeouts,
dropped connections and malformed answers, honouring the server's retry-after.
"""
from __future__ import annotations

import email.utils
import importlib
import os
import random
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import EnvironmentMissing, UsageError
from .base import Agent, Candidate, KernelTask, NoCandidate, Usage, Attempt
from .extract import ExtractionError, extract_source
from .prompts import conversation
from .registry import AgentOptions, Catalog

MAX_RETRY_AFTER_S = 120.0  # a server asking for longer is treated as unavailable


class ProviderError(EnvironmentMissing):
    """The model server gave no usable answer after the retries (exit 3)."""


@dataclass
class Reply:
    text: str
    input_tokens: int
    output_tokens: int
    truncated: bool  # the answer hit the output token limit
    model: str | None = None


def import_sdk(module: str, extra: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError:
        raise EnvironmentMissing(
            f"the {module} Python SDK is not installed; install it with "
            f"pip install 'specgen[{extra}]'") from None


def api_key_from_env(variable: str, agent: str) -> str:
    key = os.environ.get(variable, "").strip()
    if not key:
        raise EnvironmentMissing(
            f"--agent {agent} needs an API key in the environment variable {variable}; "
            f"export {variable}=... (or pick another variable with --api-key-env)")
    return key


def _retry_after(error: Exception) -> float | None:
    """Seconds the server asked us to wait (retry-after-ms, retry-after seconds or date)."""
    response = getattr(error, "response", None)
    headers = getattr(response, "headers", None) or {}
    try:
        if headers.get("retry-after-ms"):
            return float(headers["retry-after-ms"]) / 1000
        value = headers.get("retry-after")
        if not value:
            return None
        try:
            return float(value)
        except ValueError:
            when = email.utils.parsedate_to_datetime(value)
            return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError):
        return None


class LLMAgent(Agent):
    """An agent backed by a chat model. Subclasses: OpenAIAgent, AnthropicAgent, ..."""

    name = "llm"
    sdk_module = ""  # "openai" | "anthropic"
    extra = ""  # the pip extra that installs the SDK
    api_key_env = ""  # default environment variable holding the key ("": no key by default)

    def __init__(self, options: AgentOptions, *, sleep: Callable[[float], None] = time.sleep):
        self.options = options
        self.catalog: Catalog = options.catalog
        self.model = options.model or self.catalog.default_model(self.name)
        if not self.model:
            raise UsageError(f"--agent {self.name} needs --model NAME")
        self.sdk = import_sdk(self.sdk_module, self.extra)
        variable = options.api_key_env or self.api_key_env
        self.api_key = api_key_from_env(variable, self.name) if variable else None
        self.max_output_tokens = self.catalog.info(self.model).max_output_tokens
        self._sleep = sleep
        self.client = self._make_client()

    @classmethod
    def from_options(cls, options: AgentOptions) -> "LLMAgent":
        return cls(options)

    # -- provider specifics
    def _make_client(self) -> Any:
        raise NotImplementedError

    def _send(self, messages: list[dict[str, str]]) -> Reply:
        raise NotImplementedError

    # -- the shared path
    def propose(self, task: KernelTask, history: list[Attempt]) -> Candidate:
        messages = conversation(task, history)
        reply, retries = self._send_with_retries(messages)
        model = reply.model or self.model
        usage = Usage(reply.input_tokens, reply.output_tokens,
                      self.catalog.cost(self.model, reply.input_tokens, reply.output_tokens))
        log = {"messages": messages, "response": reply.text, "truncated": reply.truncated,
               "retries": retries, "served_model": model}
        try:
            source = extract_source(reply.text, task.entry_points(), truncated=reply.truncated)
        except ExtractionError as error:
            raise NoCandidate(str(error), usage=usage, model=self.model, log=log) from None
        return Candidate(source=source, agent=self.name, model=self.model, usage=usage, log=log)

    def send(self, messages: list[dict[str, str]]) -> Reply:
        """One chat answer for `messages`, with the retry policy: for callers other than
        `propose`, such as `specgen draft`."""
        return self._send_with_retries(messages)[0]

    def cost(self, reply: Reply) -> Usage:
        return Usage(reply.input_tokens, reply.output_tokens,
                     self.catalog.cost(self.model, reply.input_tokens, reply.output_tokens))

    def _classify(self, error: Exception) -> str:
        """'retry', 'auth', 'request' or 'other' for an exception raised by the SDK."""
        sdk = self.sdk
        if isinstance(error, (sdk.APITimeoutError, sdk.APIConnectionError)):
            return "retry"
        if isinstance(error, sdk.APIStatusError):
            status = error.status_code
            if status == 429 or status == 408 or status >= 500 or status == 529:
                return "retry"
            if status in (401, 403):
                return "auth"
            return "request"
        if isinstance(error, (ValueError, sdk.APIResponseValidationError)):
            return "retry"  # malformed JSON or an answer missing fields
        return "other"

    def _where(self) -> str:
        return self.options.base_url or f"the {self.name} API"

    def _send_with_retries(self, messages: list[dict[str, str]]) -> tuple[Reply, int]:
        retries = self.options.max_retries
        delay = self.options.backoff_s
        for attempt in range(retries + 1):
            try:
                return self._send(messages), attempt
            except Exception as error:  # noqa: BLE001 - classified below, unknown ones re-raised
                kind = self._classify(error)
                summary = f"{type(error).__name__}: {error}"
                if kind == "auth":
                    raise EnvironmentMissing(
                        f"{self._where()} rejected the API key ({summary}); check "
                        f"{self.options.api_key_env or self.api_key_env}") from None
                if kind == "request":
                    raise UsageError(f"{self._where()} refused the request for model "
                                     f"{self.model!r} ({summary}); check --model") from None
                if kind == "other":
                    raise
                if attempt == retries:
                    raise ProviderError(
                        f"{self._where()} gave no usable answer after {retries + 1} tries "
                        f"(last: {summary}); try again later, or raise --timeout "
                        f"(now {self.options.timeout_s:g} s)") from None
                wait = _retry_after(error)
                if wait is None:
                    wait = delay * (1 + random.random() * 0.25)  # jitter spreads parallel samples
                elif wait > MAX_RETRY_AFTER_S:
                    raise ProviderError(f"{self._where()} asks to retry after {wait:.0f} s "
                                        f"({summary}); try again later") from None
                self._sleep(wait)
                delay *= 2
        raise AssertionError("unreachable")  # pragma: no cover
