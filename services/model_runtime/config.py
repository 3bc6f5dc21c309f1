"""The model runtime client's settings (LLM_RUNTIME_* and llm-service.md §11's names), read here only."""

from __future__ import annotations

from services.common.generate_contract import MODEL_NAME_RULE, is_model_name
from services.common.settings import (
    MAX_TIMEOUT_SECONDS,
    Env,
    Fields,
    SettingsError,
    flag,
    number,
    secret,
    text,
)
from services.model_runtime.chat import SAMPLING_RANGES
from services.model_runtime.client import RuntimeSettings

# The connect timeout, retries, Retry-After ceiling and breaker are RuntimeSettings'
# defaults (client.py), not read from the environment.
RUNTIME = Fields(
    RuntimeSettings,
    url=text("LLM_RUNTIME_URL", "", default_doc="unset: the built-in extractive responder"),
    default_model=text("DEFAULT_MODEL_NAME", "", default_doc="required with LLM_RUNTIME_URL"),
    # agent.md §10 keeps the runtime's key (an OpenRouter one) as OPENROUTER_API_KEY.
    api_key=secret("LLM_RUNTIME_API_KEY", also=("OPENROUTER_API_KEY",)),
    enable_json_mode=flag("ENABLE_JSON_MODE"),
    json_schema=flag("LLM_RUNTIME_JSON_SCHEMA"),
    timeout_s=number("LLM_RUNTIME_TIMEOUT_S", minimum=0.01, maximum=MAX_TIMEOUT_SECONDS),
    stream_usage=flag("LLM_RUNTIME_STREAM_USAGE"),
    temperature=number(
        "LLM_RUNTIME_TEMPERATURE",
        minimum=SAMPLING_RANGES["temperature"][0],
        maximum=SAMPLING_RANGES["temperature"][1],
        default_doc="unset: the runtime's own",
    ),
)
URL, DEFAULT_MODEL = RUNTIME.vars["url"], RUNTIME.vars["default_model"]


def runtime_settings(env: Env) -> RuntimeSettings | None:
    """The runtime LLM_RUNTIME_URL names, or None when it is unset (the extractive responder).

    Every setting of the group is checked either way: one an operator set is meant to be used,
    and a bad value (a temperature of "abc", a key file that is missing) is a SettingsError
    now, not once LLM_RUNTIME_URL is set. DEFAULT_MODEL_NAME is held to the model-name rule
    ORCH_DEFAULT_MODEL is (generate_contract.is_model_name): it is sent as a Generate's model.
    """
    values = RUNTIME.values(env)
    model = values["default_model"]
    if model and not is_model_name(model):
        raise SettingsError(f"DEFAULT_MODEL_NAME must be {MODEL_NAME_RULE}")
    if not values["url"]:
        return None
    return RuntimeSettings(**values)
