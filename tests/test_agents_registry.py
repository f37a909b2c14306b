"""Default models, the price table and the user's overrides (specgen/agents/registry.py)."""
import pytest

from specgen.agents.registry import AGENTS, Catalog, agent_class, load_catalog
from specgen.errors import UsageError


def test_defaults_and_prices():
    catalog = Catalog()
    assert catalog.default_model("openai") == "gpt-4o"
    assert catalog.default_model("anthropic").startswith("claude-sonnet")
    assert catalog.cost("gpt-4o", 1_000_000, 100_000) == pytest.approx(2.5 + 1.0)
    # A dated snapshot is priced like its family; an unknown model is free (a local server).
    assert catalog.cost("gpt-4o-2024-08-06", 1_000_000, 0) == pytest.approx(2.5)
    assert catalog.cost("gpt-4o-mini-2024-07-18", 1_000_000, 0) == pytest.approx(0.15)
    assert catalog.cost("my-local-model", 10**9, 10**9) == 0.0


def test_user_file_overrides_models_and_prices(tmp_path, monkeypatch):
    path = tmp_path / "models.toml"
    path.write_text('[defaults]\nopenai = "gpt-4.1"\n\n[models."my-model"]\n'
                    'input_per_mtok = 1.0\noutput_per_mtok = 2.0\nmax_output_tokens = 999\n')
    monkeypatch.setenv("SPECGEN_MODELS", str(path))
    catalog = load_catalog()
    assert catalog.default_model("openai") == "gpt-4.1"
    assert catalog.info("my-model").max_output_tokens == 999
    assert catalog.cost("my-model", 1_000_000, 1_000_000) == pytest.approx(3.0)


def test_xdg_config_home_is_read(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECGEN_MODELS", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    (tmp_path / "specgen").mkdir()
    (tmp_path / "specgen" / "models.toml").write_text('[defaults]\nanthropic = "claude-opus-4-1"\n')
    assert load_catalog().default_model("anthropic") == "claude-opus-4-1"


def test_bad_user_file_names_the_file(tmp_path, monkeypatch):
    path = tmp_path / "models.toml"
    path.write_text('[models."x"]\nprice = 3\n')
    monkeypatch.setenv("SPECGEN_MODELS", str(path))
    with pytest.raises(UsageError, match=r"models.toml.*input_per_mtok.*price"):
        load_catalog()


def test_providers_resolve_lazily_by_name():
    assert set(AGENTS) >= {"builtin", "openai", "anthropic", "openai-compatible", "replay"}
    assert agent_class("openai").name == "openai"
    assert agent_class("openai-compatible").name == "openai-compatible"
    with pytest.raises(UsageError, match="unknown agent"):
        agent_class("nope")
