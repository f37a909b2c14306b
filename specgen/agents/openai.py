"""OpenAI chat models, and any server speaking the OpenAI chat-completions format.

`--agent openai` (default gpt-4o, key in OPENAI_API_KEY) and `--agent openai-compatible
--base-url URL` for vLLM, TGI, llama.cpp or Hugging Face endpoints (key optional, from
--api-key-env when given).
"""
from __future__ import annotations

from typing import Any

from ..errors import UsageError
from .llm import LLMAgent, Reply
from .registry import AgentOptions


class OpenAIAgent(LLMAgent):
    name = "openai"
    sdk_module = "openai"
    extra = "openai"
    api_key_env = "OPENAI_API_KEY"
    # OpenAI's own API takes max_completion_tokens; older compatible servers only max_tokens.
    token_limit_field = "max_completion_tokens"

    def _make_client(self) -> Any:
        return self.sdk.OpenAI(api_key=self.api_key or "not-needed", base_url=self.options.base_url,
                               timeout=self.options.timeout_s, max_retries=0)

    def _send(self, messages: list[dict[str, str]]) -> Reply:
        extra: dict[str, Any] = {self.token_limit_field: self.max_output_tokens}
        if self.options.temperature is not None:
            extra["temperature"] = self.options.temperature
        response = self.client.chat.completions.create(model=self.model, messages=messages, **extra)
        if not response.choices:
            raise ValueError("the answer has no choices")
        choice = response.choices[0]
        usage = response.usage
        return Reply(text=choice.message.content or "",
                     input_tokens=getattr(usage, "prompt_tokens", 0) or 0,
                     output_tokens=getattr(usage, "completion_tokens", 0) or 0,
                     truncated=choice.finish_reason == "length", model=response.model)


class OpenAICompatibleAgent(OpenAIAgent):
    name = "openai-compatible"
    # No default key variable: only an explicit --api-key-env sends a key, so a local
    # server never receives the user's OpenAI key by accident.
    api_key_env = ""
    token_limit_field = "max_tokens"

    def __init__(self, options: AgentOptions, **kwargs):
        if not options.base_url:
            raise UsageError("--agent openai-compatible needs --base-url URL "
                             "(e.g. http://localhost:8000/v1 for vLLM)")
        super().__init__(options, **kwargs)
