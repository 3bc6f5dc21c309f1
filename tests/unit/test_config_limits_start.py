"""Bad start-up settings end in one line, never a traceback: what the value alone shows (a
path under a regular file, a synonyms file that is missing or does not parse, a Qdrant URL
that is no http(s) URL) is a SettingsError at load naming the variable (run_service: "bad
setting", exit 2); a dependency that cannot be reached or is held by another process while
starting is one "cannot start" line and exit 1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from services.common.settings import Env, SettingsError
from services.retrieval.config import RetrievalSettings
from services.toolsproxy.config import ToolsProxySettings

_ROOT = Path(__file__).resolve().parents[2]
_PATH = os.pathsep.join([str(_ROOT / "gen" / "python"), str(_ROOT)])


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    """A regular file, which no directory can be under."""
    path = tmp_path / "a-file"
    path.write_text("not a directory", encoding="utf-8")
    return path


def _retrieval(environ: dict[str, str]) -> RetrievalSettings:
    return RetrievalSettings.from_env(Env(environ))


def _toolsproxy(environ: dict[str, str]) -> ToolsProxySettings:
    return ToolsProxySettings.from_env(Env(environ))


# -- paths: a directory, or one that can be made ---------------------------------------------


@pytest.mark.parametrize("load", [_retrieval, _toolsproxy])
def test_a_data_dir_under_a_regular_file_is_a_bad_setting_naming_it(load, a_file: Path) -> None:
    with pytest.raises(SettingsError, match=r"^VISIOR_DATA_DIR=.*is a file, not a directory"):
        load({"VISIOR_DATA_DIR": str(a_file / "data")})
    with pytest.raises(SettingsError, match=r"^VISIOR_DATA_DIR=.*is a file, not a directory"):
        load({"VISIOR_DATA_DIR": str(a_file)})


@pytest.mark.parametrize("load", [_retrieval, _toolsproxy])
def test_a_sqlite_file_under_a_regular_file_or_on_a_directory_is_a_bad_setting(
    load, a_file: Path, tmp_path: Path
) -> None:
    data = {"VISIOR_DATA_DIR": str(tmp_path / "data")}
    with pytest.raises(SettingsError, match=r"^METADATA_DB_URL=.*is a file, not a directory"):
        load({**data, "METADATA_DB_URL": f"sqlite:///{a_file}/x.db"})
    with pytest.raises(SettingsError, match=r"^METADATA_DB_URL=.*is a directory, not a file"):
        load({**data, "METADATA_DB_URL": f"sqlite:///{tmp_path}"})


@pytest.mark.parametrize("load", [_retrieval, _toolsproxy])
def test_paths_that_do_not_exist_yet_are_made_at_start(load, tmp_path: Path) -> None:
    settings = load(
        {
            "VISIOR_DATA_DIR": str(tmp_path / "a" / "b"),
            "METADATA_DB_URL": f"sqlite:///{tmp_path}/c/d/store.db",
        }
    )
    assert settings.docstore.target == f"{tmp_path}/c/d/store.db"
    assert not (tmp_path / "a").exists()  # checked, not made, while loading


def test_an_index_path_under_a_regular_file_is_a_bad_setting_naming_it(
    a_file: Path, tmp_path: Path
) -> None:
    with pytest.raises(SettingsError, match=r"^RETR_INDEX_PATH=.*is a file, not a directory"):
        _retrieval({"VISIOR_DATA_DIR": str(tmp_path), "RETR_INDEX_PATH": str(a_file / "index")})
    index = _retrieval({"VISIOR_DATA_DIR": str(tmp_path), "RETR_INDEX_PATH": str(tmp_path / "i")})
    assert index.index.path == str(tmp_path / "i")


def test_mock_mode_opens_no_store_so_its_paths_are_not_checked(a_file: Path) -> None:
    settings = _retrieval({"RETR_MOCK_MODE": "true", "VISIOR_DATA_DIR": str(a_file / "data")})
    assert settings.mock_mode


# -- RETR_SYNONYMS_PATH: a file that parses ----------------------------------------------------


def test_a_synonyms_file_that_is_missing_a_directory_or_bad_json_is_a_bad_setting(
    tmp_path: Path,
) -> None:
    bad_json = tmp_path / "synonyms.json"
    bad_json.write_text('[["договор", "контракт"', encoding="utf-8")
    not_lists = tmp_path / "groups.json"
    not_lists.write_text('{"groups": "договор"}', encoding="utf-8")
    data = {"VISIOR_DATA_DIR": str(tmp_path / "data")}
    for path, why in (
        (tmp_path / "missing.json", "No such file"),
        (tmp_path, "Is a directory"),
        (bad_json, "not valid JSON"),
        (not_lists, "expected a list of lists of strings"),
    ):
        with pytest.raises(SettingsError, match=rf"^RETR_SYNONYMS_PATH=.*{why}"):
            _retrieval({**data, "RETR_SYNONYMS_PATH": str(path)})
    good = tmp_path / "good.txt"
    good.write_text("договор, контракт\n", encoding="utf-8")
    assert _retrieval({**data, "RETR_SYNONYMS_PATH": str(good)}).synonyms_path == str(good)


def _run(module: str, environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`python -m module` with only `environ` (and what finds Python and the code) set."""
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": _PATH, **environ}
    return subprocess.run(
        [sys.executable, "-m", module], capture_output=True, text=True, timeout=120, env=env
    )


def test_toolsproxy_with_an_unreachable_postgresql_is_one_line_exit_1_password_masked(
    tmp_path: Path,
) -> None:
    done = _run(
        "services.toolsproxy",
        {"MCP_PROXY_PORT": "0", "METADATA_DB_URL": "postgresql://u:secret-pw@127.0.0.1:1/db"},
    )
    assert done.returncode == 1, done.stderr
    assert "cannot start: document store (PostgreSQL postgresql://u:***@127.0.0.1:1/db)" in (
        done.stderr
    )
    assert "Traceback" not in done.stderr
    assert "secret-pw" not in done.stderr


def test_retrieval_with_an_unreachable_remote_embedder_is_one_line_exit_1(tmp_path: Path) -> None:
    done = _run(
        "services.retrieval",
        {
            "RETR_PORT": "0",
            "VISIOR_DATA_DIR": str(tmp_path),
            "RETR_EMBEDDING_PROFILE": "remote",
            "RETR_EMBEDDING_URL": "http://127.0.0.1:1",
            "RETR_EMBEDDING_MODEL": "m",
        },
    )
    assert done.returncode == 1, done.stderr
    assert "cannot start: " in done.stderr
    assert "Traceback" not in done.stderr


def test_a_data_dir_under_a_file_is_one_bad_setting_line_exit_2(a_file: Path) -> None:
    done = _run("services.toolsproxy", {"MCP_PROXY_PORT": "0", "VISIOR_DATA_DIR": str(a_file)})
    assert done.returncode == 2, done.stderr
    assert "bad setting: VISIOR_DATA_DIR=" in done.stderr
    assert "Traceback" not in done.stderr
