"""Anthropic Claude models (`--agent anthropic`, key in ANTHROPIC_API_KEY)."""
from __future__ import annotations

from typing import Any

from .llm import LLMAgent, Reply


class AnthropicAgent(LLMAgent):
    name = "anthropic"
    sdk_module = "anthropic"
    extra = "anthropic"
    api_key_env = "ANTHROPIC_API_KEY"

    def _make_client(self) -> Any:
        return self.sdk.Anthropic(api_key=self.api_key, base_url=self.options.base_url,
                                  timeout=self.options.timeout_s, max_retries=0)

    def _send(self, messages: list[dict[str, str]]) -> Reply:
        # The Messages API takes the system prompt apart from the turns.
        system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
        turns = [m for m in messages if m["role"] != "system"]
        extra: dict[str, Any] = {}
        if self.options.temperature is not None:
            extra["temperature"] = self.options.temperature
        response = self.client.messages.create(model=self.model, system=system, messages=turns,
                                               max_tokens=self.max_output_tokens, **extra)
        text = "".join(getattr(block, "text", "") for block in response.content
                       if getattr(block, "type", "") == "text")
        usage = response.usage
        return Reply(text=text, input_tokens=getattr(usage, "input_tokens", 0) or 0,
                     output_tokens=getattr(usage, "output_tokens", 0) or 0,
                     truncated=response.stop_reason == "max_tokens", model=response.model)
