"""Settings refused at start, naming the variable: a downstream URL with a scheme the mesh
does not speak (TLS among them), and a log level logging does not know."""

from __future__ import annotations

import logging

import pytest

from services.client.client import Target
from services.common.runner import run_service
from services.common.settings import (
    Env,
    SettingsError,
    grpc_address,
    grpc_target,
)
from services.llm.config import LlmSettings
from services.orchestrator.config import OrchestratorSettings


@pytest.mark.parametrize(
    "value", ["https://retrieval:50053", "grpcs://retrieval:50053", "ftp://x:1", "HTTPS://r:1"]
)
def test_a_url_with_a_scheme_the_mesh_does_not_speak_is_refused(value):
    with pytest.raises(SettingsError, match=r"ORCH_RETRIEVAL_URL=.*use grpc:// or http://") as e:
        OrchestratorSettings.from_env(Env({"ORCH_RETRIEVAL_URL": value}))
    assert "TLS" in str(e.value)
    with pytest.raises(SettingsError, match="X="):
        grpc_address(value, "X")
    with pytest.raises(ValueError, match="use grpc:// or http:// or host:port"):
        Target.parse(value, "h")


@pytest.mark.parametrize(
    ("value", "target"),
    [
        ("grpc://retrieval:50053", "retrieval:50053"),
        ("http://retrieval:50053/", "retrieval:50053"),
        ("dns:///retrieval:50053", "retrieval:50053"),
        ("GRPC://retrieval:50053", "retrieval:50053"),
        ("retrieval:50053", "retrieval:50053"),
        ("[::1]:50053", "[::1]:50053"),
    ],
)
def test_the_schemes_the_mesh_speaks_and_host_port_are_taken(value, target):
    assert grpc_target(value, "X") == target
    settings = OrchestratorSettings.from_env(Env({"ORCH_RETRIEVAL_URL": value}))
    assert settings.retrieval.target == target


@pytest.mark.parametrize(
    ("value", "target"),
    [("retrieval:1", "retrieval:1"), ("retrieval:65535", "retrieval:65535"),
     ("grpc://[::1]:65535/", "[::1]:65535")],
)  # fmt: skip
def test_a_target_port_is_taken_up_to_65535(value, target):
    assert grpc_target(value, "X") == target
    settings = OrchestratorSettings.from_env(Env({"ORCH_RETRIEVAL_URL": value}))
    assert settings.retrieval.target == target


@pytest.mark.parametrize(
    "port",
    [
        "65536",
        "70000",
        "99999",
        "0",  # listening on 0 picks a free port; no target is there
        pytest.param("9" * 5000, id="5000-digits"),  # past int()'s digit limit
        "\uff15\uff10\uff10\uff15\uff13",  # full-width 50053, which int() reads
        "\u00b2",  # superscript two: isdigit() says yes, int() refuses
        "5\u00b2",
        "-1",
    ],
)
def test_a_target_port_outside_1_to_65535_or_not_in_ascii_digits_is_refused(port):
    value = f"retrieval:{port}"
    with pytest.raises(SettingsError, match=r"^X="):
        grpc_target(value, "X")
    with pytest.raises(SettingsError, match=r"^X="):
        grpc_address(value, "X")
    with pytest.raises(SettingsError, match=r"^ORCH_RETRIEVAL_URL="):
        OrchestratorSettings.from_env(Env({"ORCH_RETRIEVAL_URL": value}))


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"LOG_LEVEL": "verbose"}, "LOG_LEVEL"),
        ({"ORCH_LOG_LEVEL": "verbose", "LOG_LEVEL": "debug"}, "ORCH_LOG_LEVEL"),
    ],
)
def test_a_log_level_logging_does_not_know_is_refused_naming_the_variable(env, named):
    with pytest.raises(SettingsError, match=rf"^{named}='VERBOSE' must be one of DEBUG, INFO"):
        OrchestratorSettings.from_env(Env(env))


def test_the_llm_services_log_level_is_checked_too():
    with pytest.raises(SettingsError, match=r"^LOG_LEVEL="):
        LlmSettings.from_env(Env({"LOG_LEVEL": "trace"}))


@pytest.mark.parametrize(
    ("value", "level"), [("debug", "DEBUG"), ("INFO", "INFO"), ("Error", "ERROR")]
)
def test_a_log_level_is_taken_in_any_case(value, level):
    orch = OrchestratorSettings.from_env(Env({"ORCH_LOG_LEVEL": value}))
    assert orch.server.log_level == level
    assert LlmSettings.from_env(Env({"LOG_LEVEL": value})).server.log_level == level
    assert OrchestratorSettings.from_env(Env({})).server.log_level == "INFO"


@pytest.fixture
def _keep_logging():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.usefixtures("_keep_logging")
def test_a_bad_log_level_stops_the_service_with_exit_2(capfd):
    def load():
        return OrchestratorSettings.from_env(Env({"LOG_LEVEL": "verbose"}))

    async def start(settings):  # pragma: no cover - never reached
        raise AssertionError("started with a bad log level")

    with pytest.raises(SystemExit) as exit_info:
        run_service(load, start)
    assert exit_info.value.code == 2
    err = capfd.readouterr().err
    assert "bad setting: LOG_LEVEL='VERBOSE'" in err and "Traceback" not in err
