"""The model runtime's settings (LLM_RUNTIME_*, DEFAULT_MODEL_NAME, ENABLE_JSON_MODE) are
checked whether LLM_RUNTIME_URL is set or not; DEFAULT_MODEL_NAME follows the model-name rule
ORCH_DEFAULT_MODEL does; the spec's OPENROUTER_API_KEY is the runtime key's other name; the
rate limits' docs say 0 switches them off."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common.setting_names import NAMES
from services.common.settings import Env, SettingsError
from services.llm.config import LlmSettings
from services.model_runtime.config import runtime_settings
from services.retrieval.config import llm_assist_settings
from services.toolsproxy.config import RATE_LIMITS
from tests.unit.test_settings import _config_docs

RUNTIME = {"LLM_RUNTIME_URL": "http://127.0.0.1:9/v1", "DEFAULT_MODEL_NAME": "m"}


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("LLM_RUNTIME_TEMPERATURE", "abc"),
        ("LLM_RUNTIME_TEMPERATURE", "9"),
        ("LLM_RUNTIME_TIMEOUT_S", "-5"),
        ("ENABLE_JSON_MODE", "maybe"),
        ("LLM_RUNTIME_JSON_SCHEMA", "maybe"),
        ("LLM_RUNTIME_STREAM_USAGE", "maybe"),
        ("LLM_RUNTIME_API_KEY_FILE", "/nope/key"),
        ("DEFAULT_MODEL_NAME", "a b"),
    ],
)
def test_a_bad_runtime_setting_is_refused_with_or_without_a_runtime_url(name, value) -> None:
    for base in ({}, RUNTIME):
        with pytest.raises(SettingsError, match=rf"^{name}"):
            LlmSettings.from_env(Env({**base, name: value}))


def test_without_a_url_good_runtime_settings_still_mean_the_extractive_responder() -> None:
    environ = {
        "LLM_RUNTIME_TEMPERATURE": "0",
        "ENABLE_JSON_MODE": "true",
        "DEFAULT_MODEL_NAME": "m",
    }
    assert runtime_settings(Env(environ)) is None
    assert LlmSettings.from_env(Env(environ)).runtime is None


@pytest.mark.parametrize("model", ["a b", "tab\there", "x" * 300])
def test_default_model_name_follows_the_model_name_rule(model: str) -> None:
    with pytest.raises(SettingsError, match=r"^DEFAULT_MODEL_NAME must be 1-"):
        runtime_settings(Env({**RUNTIME, "DEFAULT_MODEL_NAME": model}))
    with pytest.raises(SettingsError, match="DEFAULT_MODEL_NAME must be 1-"):
        llm_assist_settings(
            Env({**RUNTIME, "DEFAULT_MODEL_NAME": model, "RETR_LLM_SUMMARIES": "1"})
        )
    good = runtime_settings(Env({**RUNTIME, "DEFAULT_MODEL_NAME": "qwen2.5:0.5b-instruct"}))
    assert good is not None and good.default_model == "qwen2.5:0.5b-instruct"


def test_the_specs_openrouter_api_key_is_the_runtime_key(tmp_path: Path) -> None:
    runtime = runtime_settings(Env({**RUNTIME, "OPENROUTER_API_KEY": "sk-or-1"}))
    assert runtime is not None and runtime.api_key == "sk-or-1"
    both = {**RUNTIME, "OPENROUTER_API_KEY": "sk-or-1", "LLM_RUNTIME_API_KEY": "sk-own"}
    runtime = runtime_settings(Env(both))
    assert runtime is not None and runtime.api_key == "sk-own"  # LLM_RUNTIME_API_KEY first
    # The spec's name is read as itself only: no OPENROUTER_API_KEY_FILE (the spec names none).
    key_file = tmp_path / "key"
    key_file.write_text("sk-or-file\n", encoding="utf-8")
    runtime = runtime_settings(Env({**RUNTIME, "OPENROUTER_API_KEY_FILE": str(key_file)}))
    assert runtime is not None and runtime.api_key is None
    runtime = runtime_settings(Env({**RUNTIME, "LLM_RUNTIME_API_KEY_FILE": str(key_file)}))
    assert runtime is not None and runtime.api_key == "sk-or-file"
    assert "OPENROUTER_API_KEY" in NAMES
    assert "OPENROUTER_API_KEY_FILE" not in NAMES


def test_each_rate_limit_says_0_switches_it_off() -> None:
    docs = _config_docs()
    for var in RATE_LIMITS.vars.values():
        assert "0 switches this limit off" in docs.description(var), var.name
