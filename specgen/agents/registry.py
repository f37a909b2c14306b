"""Agents by name, default models and the price table, in one place the user can override.

Override file (TOML), first found of: $SPECGEN_MODELS, $XDG_CONFIG_HOME/specgen/models.toml,
~/.config/specgen/models.toml:

    [defaults]                      # the model each agent uses without --model
    openai = "gpt-4.1"
    "openai-compatible" = "Qwen/Qwen2.5-Coder-32B-Instruct"

    [models."gpt-4.1"]              # USD per million tokens; answer length limit
    input_per_mtok = 2.0
    output_per_mtok = 8.0
    max_output_tokens = 32768

Third-party agents register a class under the entry-point group `specgen.agents`.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path

from ..errors import UsageError
from .base import Agent

try:  # Python 3.11+; 3.10 reads the file with tomli when it is installed
    import tomllib
except ModuleNotFoundError:  # pragma: no cover
    tomllib = None  # type: ignore[assignment]

# name -> "module:Class"; imported only when chosen, so a missing SDK costs nothing.
AGENTS = {
    "builtin": "specgen.agents.builtin:BuiltinAgent",
    "openai": "specgen.agents.openai:OpenAIAgent",
    "anthropic": "specgen.agents.anthropic:AnthropicAgent",
    "openai-compatible": "specgen.agents.openai:OpenAICompatibleAgent",
    "replay": "specgen.agents.replay:ReplayAgent",
}

DEFAULT_MODELS = {
    "openai": "gpt-4o",
    "anthropic": "claude-sonnet-4-6",
    "openai-compatible": "default",  # vLLM/TGI/llama.cpp serve one model; name it with --model
}


@dataclass(frozen=True)
class ModelInfo:
    input_per_mtok: float | None = None  # USD per million input tokens; None: unknown
    output_per_mtok: float | None = None
    max_output_tokens: int = 16384


# Published list prices (USD per million tokens) at the time of writing; override in models.toml.
MODELS = {
    "gpt-4o": ModelInfo(2.50, 10.00, 16384),
    "gpt-4o-mini": ModelInfo(0.15, 0.60, 16384),
    "gpt-4.1": ModelInfo(2.00, 8.00, 32768),
    "gpt-4.1-mini": ModelInfo(0.40, 1.60, 32768),
    "gpt-5": ModelInfo(1.25, 10.00, 65536),
    "gpt-5-mini": ModelInfo(0.25, 2.00, 65536),
    "o3": ModelInfo(2.00, 8.00, 65536),
    "o4-mini": ModelInfo(1.10, 4.40, 65536),
    "claude-sonnet-4-6": ModelInfo(3.00, 15.00, 32000),
    "claude-sonnet-4-5": ModelInfo(3.00, 15.00, 32000),
    "claude-sonnet-4": ModelInfo(3.00, 15.00, 32000),
    "claude-opus-4-1": ModelInfo(15.00, 75.00, 32000),
    "claude-opus-4-5": ModelInfo(5.00, 25.00, 32000),
    "claude-haiku-4-5": ModelInfo(1.00, 5.00, 32000),
    "claude-3-5-haiku": ModelInfo(0.80, 4.00, 8192),
}


@dataclass
class Catalog:
    """Default models and model facts after the user's overrides."""

    defaults: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_MODELS))
    models: dict[str, ModelInfo] = field(default_factory=lambda: dict(MODELS))
    source: Path | None = None  # the override file, when one was read

    def default_model(self, agent: str) -> str | None:
        return self.defaults.get(agent)

    def info(self, model: str | None) -> ModelInfo:
        """Facts for `model`; dated names (gpt-4o-2024-08-06) match their family's entry."""
        if not model:
            return ModelInfo()
        if model in self.models:
            return self.models[model]
        family = max((name for name in self.models if model.startswith(name + "-")), key=len, default=None)
        return self.models[family] if family else ModelInfo()

    def cost(self, model: str | None, input_tokens: int, output_tokens: int) -> float:
        info = self.info(model)
        if info.input_per_mtok is None or info.output_per_mtok is None:
            return 0.0  # unknown price (a local server): counted as free
        return (input_tokens * info.input_per_mtok + output_tokens * info.output_per_mtok) / 1e6


def config_path() -> Path:
    if os.environ.get("SPECGEN_MODELS"):
        return Path(os.environ["SPECGEN_MODELS"])
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "specgen" / "models.toml"


def load_catalog(path: Path | None = None) -> Catalog:
    """The built-in table, overridden by the user's models.toml when there is one."""
    path = path or config_path()
    catalog = Catalog()
    if not path.is_file():
        if os.environ.get("SPECGEN_MODELS"):
            raise UsageError(f"SPECGEN_MODELS={path}: no such file")
        return catalog
    if tomllib is None:  # pragma: no cover
        raise UsageError(f"{path}: reading it needs Python 3.11+ (tomllib)")
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, OSError) as error:
        raise UsageError(f"{path}: {error}; fix the file or move it away") from None
    catalog.source = path
    for agent, model in (data.get("defaults") or {}).items():
        if not isinstance(model, str):
            raise UsageError(f"{path}: [defaults] {agent} must be a model name in quotes")
        catalog.defaults[agent] = model
    known = set(ModelInfo.__dataclass_fields__)
    for model, facts in (data.get("models") or {}).items():
        unknown = set(facts) - known if isinstance(facts, dict) else {"?"}
        if unknown:
            raise UsageError(f"{path}: [models.\"{model}\"] takes only {', '.join(sorted(known))} "
                             f"(got {', '.join(sorted(unknown))})")
        catalog.models[model] = replace(catalog.info(model) if model in catalog.models else ModelInfo(), **facts)
    return catalog


@dataclass
class AgentOptions:
    """Everything the command line can tell an agent; each agent takes what it needs."""

    model: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    timeout_s: float = 600.0
    max_retries: int = 4
    backoff_s: float = 1.0  # first retry delay; doubles each time unless the server says when
    temperature: float | None = None
    transcript: Path | None = None  # replay: the transcript to rerun
    catalog: Catalog = field(default_factory=Catalog)


def agent_names() -> list[str]:
    return sorted(set(AGENTS) | {entry.name for entry in _plugin_entry_points()})


def _plugin_entry_points():
    try:
        return list(metadata.entry_points(group="specgen.agents"))
    except Exception:  # pragma: no cover - broken metadata must not break the CLI
        return []


def agent_class(name: str) -> type[Agent]:
    if name in AGENTS:
        module_name, _, class_name = AGENTS[name].partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name and not error.name.startswith(module_name):
                raise
            raise UsageError(f"--agent {name}: not available in this installation ({error})") from None
        if not hasattr(module, class_name):
            raise UsageError(f"--agent {name}: not available in this installation "
                             f"({module_name} has no {class_name})")
        return getattr(module, class_name)
    for entry in _plugin_entry_points():
        if entry.name == name:
            return entry.load()
    raise UsageError(f"--agent {name}: unknown agent; choose one of {', '.join(agent_names())}")


def create_agent(name: str, options: AgentOptions | None = None) -> Agent:
    """An agent ready to propose. An agent class may define `from_options(options)`."""
    options = options or AgentOptions()
    cls = agent_class(name)
    if hasattr(cls, "from_options"):
        return cls.from_options(options)
    return cls()
