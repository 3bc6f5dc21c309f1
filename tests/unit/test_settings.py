import pytest

from services.common import errors
from services.common.search_contract import window_radius
from services.common.setting_names import NAMES
from services.common.settings import Env, SettingsError, grpc_target, refuse_undeclared
from services.common.topology import Ports
from services.docstore.chunking import ChunkingConfig
from services.llm.config import LlmSettings
from services.orchestrator.config import OrchestratorSettings
from services.retrieval.config import (
    RetrievalSettings,
    llm_assist_settings,
    rerank_settings,
    search_defaults,
)
from services.retrieval.search import SearchQuery, validate
from services.toolsproxy.config import ToolsProxySettings
from tests.doc_pages import doc_pages


def test_first_present_name_wins_and_blank_counts_as_absent():
    env = Env({"A": " ", "B": "2", "C": "3"})
    assert env.integer(["A", "B", "C"], 9) == 2
    assert env.integer(["Z"], 9) == 9


@pytest.mark.parametrize(
    ("raw", "error"),
    [("x", "not an integer"), ("-1", "below the minimum"), ("99", "above the maximum")],
)
def test_bad_integers_name_the_variable(raw, error):
    with pytest.raises(SettingsError, match=f"N={raw!r}|N={raw}") as info:
        Env({"N": raw}).integer("N", 1, minimum=0, maximum=10)
    assert error in str(info.value)


@pytest.mark.parametrize("raw", ["nan", "NaN", "inf", "-inf", "Infinity"])
def test_numbers_must_be_finite(raw):
    # nan passes every minimum check and inf lifts every limit (a timeout of inf never fires)
    with pytest.raises(SettingsError, match=f"N={raw!r} is not a finite number"):
        Env({"N": raw}).number("N", 1.0, minimum=0.01)


def test_an_integer_past_floats_range_is_held_to_its_limits_not_a_crash():
    """math.isfinite cannot take an int past float's range (OverflowError): 400 nines for a
    port was a traceback, not the setting's error."""
    huge = "9" * 400
    with pytest.raises(SettingsError, match=r"^N=9+ is above the maximum 65535$"):
        Env({"N": huge}).integer("N", 1, minimum=0, maximum=65535)
    with pytest.raises(SettingsError, match=r"^LLM_SERVICE_PORT=9+ is above the maximum 65535$"):
        LlmSettings.from_env(Env({"LLM_SERVICE_PORT": huge}))
    assert Env({"N": huge}).integer("N", 1) == int(huge)  # no limit: an int is finite
    with pytest.raises(SettingsError, match="is not a finite number"):
        Env({"N": huge}).number("N", 1.0)


LLM = {
    "RETR_LLM_SUMMARIES": "true",
    "LLM_RUNTIME_URL": "http://127.0.0.1:9",
    "DEFAULT_MODEL_NAME": "m",
}


@pytest.mark.parametrize(
    ("settings", "env"),
    [
        ("rerank", {"RERANK_MODEL_URL": "http://127.0.0.1:9/rerank", "RERANK_TIMEOUT_S": "nan"}),
        ("rerank", {"RERANK_MODEL_URL": "http://127.0.0.1:9/rerank", "RERANK_TIMEOUT_S": "inf"}),
        ("llm", {**LLM, "LLM_RUNTIME_TIMEOUT_S": "nan"}),
        ("llm", {**LLM, "LLM_RUNTIME_TEMPERATURE": "inf"}),
    ],
)
def test_retrieval_refuses_non_finite_timeouts_at_start(settings, env):

    load = {"rerank": rerank_settings, "llm": llm_assist_settings}[settings]
    with pytest.raises(SettingsError, match="is not a finite number"):
        load(Env(env))


def test_flags():
    assert Env({"F": "yes"}).flag("F", False) is True
    assert Env({"F": "0"}).flag("F", True) is False
    with pytest.raises(SettingsError):
        Env({"F": "maybe"}).flag("F", False)


@pytest.mark.parametrize(
    ("value", "target"),
    [
        ("127.0.0.1:50053", "127.0.0.1:50053"),
        ("http://retrieval:8080/", "retrieval:8080"),
        ("grpc://llm:50052", "llm:50052"),
    ],
)
def test_grpc_target_accepts_the_specs_urls(value, target):
    assert grpc_target(value, "X") == target


@pytest.mark.parametrize("value", ["retrieval", "http://retrieval", "host:port"])
def test_grpc_target_rejects_what_is_not_host_port(value):
    with pytest.raises(SettingsError):
        grpc_target(value, "X")


def test_window_radius_primary_and_legacy_total():
    assert window_radius(2, None) == 2
    # legacy total window N -> floor((N-1)/2) per side (docs/architecture.md §8)
    assert window_radius(None, 7) == 3
    assert window_radius(None, 6) == 2
    assert window_radius(1, 9) == 1
    assert window_radius(None, None) == 3
    limits = ToolsProxySettings.from_env(Env({"MCP_PROXY_MAX_CHUNK_WINDOW": "9"})).limits
    assert limits.max_window_radius == 4
    for name in ("MCP_PROXY_MAX_WINDOW_RADIUS", "RAG_WINDOW_RADIUS"):
        env = Env({name: "50", "MCP_PROXY_MAX_CHUNK_WINDOW": "9"})
        assert ToolsProxySettings.from_env(env).limits.max_window_radius == 50
    with pytest.raises(SettingsError, match="RAG_WINDOW_RADIUS=51 is above"):
        ToolsProxySettings.from_env(Env({"RAG_WINDOW_RADIUS": "51"}))
    with pytest.raises(SettingsError, match="MCP_PROXY_MAX_CHUNK_WINDOW=102 is above"):
        OrchestratorSettings.from_env(Env({"MCP_PROXY_MAX_CHUNK_WINDOW": "102"}))


def test_orchestrator_radius_never_exceeds_the_proxy_limit():
    s = OrchestratorSettings.from_env(
        Env({"ORCH_WINDOW_RADIUS": "5", "MCP_PROXY_MAX_WINDOW_RADIUS": "2"})
    )
    assert s.runtime.window_radius == 2
    assert s.max_window_radius == 2
    proxy = ToolsProxySettings.from_env(Env({"MCP_PROXY_MAX_WINDOW_RADIUS": "2"}))
    assert proxy.limits.max_window_radius == s.max_window_radius


def test_llm_settings_read_the_specs_names():
    s = LlmSettings.from_env(
        Env(
            {
                "MAX_TOOL_STEPS": "2",
                "MCP_PROXY_URL": "http://tools:9000",
                "MAX_PROMPT_TOKENS": "3000",
            }
        )
    )
    assert s.loop.max_tool_steps == 2
    assert s.tools_proxy.target == "tools:9000"
    assert s.loop.max_prompt_tokens == 3000


def test_on_their_defaults_the_services_listen_where_their_callers_look():
    """Each service's default port and its callers' default targets are the topology's."""
    env = Env({})
    orch, llm = OrchestratorSettings.from_env(env), LlmSettings.from_env(env)
    retr, proxy = RetrievalSettings.from_env(env), ToolsProxySettings.from_env(env)
    grpc = Ports().grpc
    listening = {s.server.service: s.server.port for s in (orch, llm, retr, proxy)}
    assert listening == grpc == {
        "orchestrator": 50051, "llm": 50052, "retrieval": 50053, "toolsproxy": 50054,
    }  # fmt: skip
    assert (orch.retrieval.target, orch.llm.target) == (
        f"127.0.0.1:{grpc['retrieval']}", f"127.0.0.1:{grpc['llm']}",
    )  # fmt: skip
    assert proxy.retrieval.target == orch.retrieval.target
    assert llm.tools_proxy.target == f"127.0.0.1:{grpc['toolsproxy']}"


def test_llm_runtime_url_is_refused_until_the_runtime_client_exists():
    with pytest.raises(SettingsError, match="LLM_RUNTIME_URL"):
        LlmSettings.from_env(Env({"LLM_RUNTIME_URL": "http://vllm:8000"}))


def test_retrieval_max_results_default_is_capped_at_50():
    assert RetrievalSettings.from_env(Env({"RETR_MAX_RESULTS": "50"})).defaults.max_results == 50
    with pytest.raises(SettingsError):
        RetrievalSettings.from_env(Env({"RETR_MAX_RESULTS": "51"}))


SEARCH_DEFAULT_LIMITS = [
    ("DEFAULT_MAX_DOCS", "max_docs", 100),
    ("DEFAULT_MAX_SECTIONS", "max_sections", 200),
    ("DEFAULT_MAX_CHUNKS", "max_chunks", 200),
    ("DEFAULT_TOKEN_LIMIT", "context_token_limit", 131_072),
    ("RETR_TOPK_PER_DOC", "topk_per_doc", 50),
]
"""Each server default of a search parameter and the largest value a request may give."""


@pytest.mark.parametrize(("name", "field", "limit"), SEARCH_DEFAULT_LIMITS)
def test_a_search_default_is_held_to_the_requests_limit(name: str, field: str, limit: int):
    defaults = search_defaults(Env({name: str(limit)}))
    assert getattr(defaults, field) == limit
    validate(SearchQuery(query="q", tenant_id="t", **{field: limit}), defaults)
    with pytest.raises(errors.LimitExceededError):
        validate(SearchQuery(query="q", tenant_id="t", **{field: limit + 1}), defaults)
    with pytest.raises(SettingsError, match=name):
        search_defaults(Env({name: str(limit + 1)}))


def test_chunk_overlap_at_and_past_half_the_chunk_size():
    s = RetrievalSettings.from_env(
        Env({"RETR_CHUNK_TOKENS": "200", "RETR_CHUNK_OVERLAP_TOKENS": "100"})
    )
    assert s.chunking == ChunkingConfig(chunk_tokens=200, overlap_tokens=100)
    with pytest.raises(SettingsError, match="RETR_CHUNK_TOKENS=200, RETR_CHUNK_OVERLAP_TOKENS=101"):
        RetrievalSettings.from_env(
            Env({"RETR_CHUNK_TOKENS": "200", "RETR_CHUNK_OVERLAP_TOKENS": "101"})
        )


@pytest.mark.parametrize(
    ("size", "overlap", "ok"),
    [("32", "0", True), ("31", "0", False), ("2048", "1024", True), ("2049", "0", False),
     ("2048", "1025", False)],
)  # fmt: skip
def test_chunk_size_and_overlap_at_and_past_their_limits(size: str, overlap: str, ok: bool):
    env = Env({"RETR_CHUNK_TOKENS": size, "RETR_CHUNK_OVERLAP_TOKENS": overlap})
    if ok:
        chunking = RetrievalSettings.from_env(env).chunking
        assert (chunking.chunk_tokens, chunking.overlap_tokens) == (int(size), int(overlap))
    else:
        with pytest.raises(SettingsError, match="RETR_CHUNK"):
            RetrievalSettings.from_env(env)


def test_the_service_chunks_with_the_chunkers_defaults():
    assert RetrievalSettings.from_env(Env({})).chunking == ChunkingConfig()


def test_retrieval_message_size_leaves_room_for_the_largest_document():
    s = RetrievalSettings.from_env(Env({"RETR_MAX_DOCUMENT_BYTES": "2000000"}))
    assert s.server.max_message_bytes == 2_000_000 + (1 << 20)


@pytest.mark.parametrize(
    ("name", "closest"),
    [
        ("RETR_HNSW_FE", "RETR_HNSW_EF"),  # misspelt
        ("MCP_PROXY_TAVILY_TIMEOUT_S", "MCP_PROXY_TAVILY_URL"),  # a knob now a constant
        ("RETR_LLM_RUNTIME_URL", "LLM_RUNTIME_URL"),  # a dropped twin
        ("VISIOR_RETRY_ATTEMPTS", "ORCH_RETRY_ATTEMPTS"),  # a dropped alias
    ],
)
def test_an_undeclared_name_with_our_prefix_is_refused_naming_the_closest(name, closest):
    with pytest.raises(SettingsError) as info:
        refuse_undeclared({name: "1", "RETR_PORT": "1"}, NAMES)
    assert str(info.value) == (
        f"{name} is set, but no Visior service reads it (closest declared name: {closest})"
    )


def test_a_retired_name_is_refused_saying_what_to_do_instead():
    with pytest.raises(SettingsError) as info:
        refuse_undeclared({"MCP_PROXY_TAVILY_ALLOW_HTTP": "true"}, NAMES)
    assert str(info.value).startswith(
        "MCP_PROXY_TAVILY_ALLOW_HTTP is set, but no Visior service reads it: an http "
        "MCP_PROXY_TAVILY_URL is taken when its host is this machine"
    )


def test_undeclared_names_accepted():
    # Every service's names, since one env file may serve the whole mesh; other prefixes,
    # blank values and the test tooling's own variable are not ours to refuse.
    refuse_undeclared(
        {
            "MCP_PROXY_TAVILY_URL": "http://x", "RETR_HNSW_EF": "64", "ORCH_PORT": "1",
            "LLM_RUNTIME_API_KEY_FILE": "/k", "RETR_NOT_A_SETTING": " ", "PATH": "/bin",
            "OPENAI_API_KEY": "sk", "VISIOR_PG_BIN": "/usr/lib/postgresql/bin",
        },
        NAMES,
    )  # fmt: skip


def test_the_process_environment_is_checked_at_start(monkeypatch):
    monkeypatch.setenv("ORCH_WINDOW_RADUIS", "2")
    with pytest.raises(SettingsError, match=r"ORCH_WINDOW_RADUIS is set.*ORCH_WINDOW_RADIUS"):
        OrchestratorSettings.from_env()
    monkeypatch.delenv("ORCH_WINDOW_RADUIS")
    monkeypatch.setenv("RETR_HNSW_EF", "64")  # another service's name
    assert OrchestratorSettings.from_env().runtime.window_radius == 3


def test_docstore_url_is_sqlite_or_postgresql():
    s = RetrievalSettings.from_env(Env({"METADATA_DB_URL": "sqlite:///tmp/x.sqlite"}))
    assert (s.docstore.kind, s.docstore.target) == ("sqlite", "tmp/x.sqlite")
    default = RetrievalSettings.from_env(Env({"VISIOR_DATA_DIR": "d"})).docstore
    assert (default.kind, default.target, default.pool_size) == ("sqlite", "d/docstore.sqlite", 8)
    for url in ("postgresql://db/visior", "postgres://u@db:5433/visior?sslmode=require"):
        s = RetrievalSettings.from_env(Env({"METADATA_DB_URL": url}))
        assert (s.docstore.kind, s.docstore.target) == ("postgresql", url)
    # One URL for both services; each keeps its own pool size.
    env = {
        "METADATA_DB_URL": "postgresql://db/tools",
        "RETR_DOCSTORE_POOL_SIZE": "3",
        "MCP_PROXY_DOCSTORE_POOL_SIZE": "12",
    }
    tools = ToolsProxySettings.from_env(Env(env)).docstore
    assert (tools.kind, tools.target, tools.pool_size) == (
        "postgresql",
        "postgresql://db/tools",
        12,
    )
    retrieval = RetrievalSettings.from_env(Env(env)).docstore
    assert (retrieval.kind, retrieval.pool_size) == ("postgresql", 3)


def test_docstore_timeout_at_its_limits():
    assert RetrievalSettings.from_env(Env({})).docstore.timeout_s == 5.0
    for value in ("0.5", "60"):
        s = RetrievalSettings.from_env(Env({"RETR_DOCSTORE_TIMEOUT_S": value}))
        assert s.docstore.timeout_s == float(value)
    env = {"RETR_DOCSTORE_TIMEOUT_S": "9", "MCP_PROXY_DOCSTORE_TIMEOUT_S": "2.5"}
    assert ToolsProxySettings.from_env(Env(env)).docstore.timeout_s == 2.5
    assert RetrievalSettings.from_env(Env(env)).docstore.timeout_s == 9.0


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"METADATA_DB_URL": "mysql://u:hunter2@db/visior"}, r"sqlite:///PATH or postgresql://"),
        ({"METADATA_DB_URL": "/var/lib/x.sqlite"}, "METADATA_DB_URL"),
        ({"METADATA_DB_URL": "postgresql://u:hunter2@db/v?bogus=1"}, "not a valid PostgreSQL URL"),
        ({"RETR_DOCSTORE_POOL_SIZE": "0"}, "RETR_DOCSTORE_POOL_SIZE"),
        ({"RETR_DOCSTORE_POOL_SIZE": "101"}, "RETR_DOCSTORE_POOL_SIZE"),
        ({"RETR_DOCSTORE_TIMEOUT_S": "0.4"}, "RETR_DOCSTORE_TIMEOUT_S=0.4 is below"),
        ({"RETR_DOCSTORE_TIMEOUT_S": "60.5"}, "RETR_DOCSTORE_TIMEOUT_S=60.5 is above"),
    ],
)
def test_bad_docstore_settings_are_refused_without_the_password(env, match):
    with pytest.raises(SettingsError, match=match) as info:
        RetrievalSettings.from_env(Env(env))
    assert "hunter2" not in str(info.value)


def test_docstore_password_never_shows_in_settings_repr():
    url = "postgresql://visior:hunter2@db:5432/visior?password=hunter2"
    s = RetrievalSettings.from_env(Env({"METADATA_DB_URL": url}))
    assert s.docstore.target == url  # what the store connects with
    for text in (repr(s), str(s), repr(s.docstore), s.docstore.display):
        assert "hunter2" not in text
    assert "postgresql://visior:***@db:5432/visior?password=***" in repr(s)
    t = ToolsProxySettings.from_env(Env({"METADATA_DB_URL": url}))
    assert "hunter2" not in repr(t)


@pytest.mark.parametrize(
    "url",
    [
        # libpq reads the credentials up to the '@' before the first '/': '#' and '?' included
        "postgresql://visior:hun#ter2@db:5432/visior",
        "postgresql://visior:hun?ter2@db/visior",
        "postgres://visior:hunter2@db",
        "postgresql://db/visior?sslmode=require&password=hunter2",
        "postgresql://db/visior?%70assword=hunter2",  # a percent-encoded keyword
        "postgresql://visior:hunter2%21@db/visior",
    ],
)
def test_docstore_password_is_masked_however_the_url_spells_it(url):
    from psycopg import conninfo

    password = conninfo.conninfo_to_dict(url)["password"]  # what libpq sends
    assert "ter2" in password
    s = RetrievalSettings.from_env(Env({"METADATA_DB_URL": url}))
    for text in (repr(s), s.docstore.display):
        assert "ter2" not in text and "***" in text


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://visior:my hunter2 pw@db/visior",  # libpq quotes the token with spaces
        "postgresql://visior:50%hunter2@db/visior",  # ... and a bad percent escape
        "postgresql://db/visior?password=50%hunter2",
    ],
)
def test_a_url_libpq_refuses_is_reported_without_its_password(url):
    with pytest.raises(SettingsError, match="not a valid PostgreSQL URL") as info:
        RetrievalSettings.from_env(Env({"METADATA_DB_URL": url}))
    assert "hunter2" not in str(info.value)


def test_retrieval_min_score_at_its_limits():
    for value in ("0", "1"):
        s = RetrievalSettings.from_env(Env({"RETR_MIN_SCORE": value}))
        assert s.defaults.min_score == float(value)
    for value, error in (("1.01", "above the maximum 1.0"), ("-0.1", "below the minimum")):
        with pytest.raises(SettingsError, match=f"RETR_MIN_SCORE={value} is {error}"):
            RetrievalSettings.from_env(Env({"RETR_MIN_SCORE": value}))


def test_retrieval_quantization_setting():
    assert RetrievalSettings.from_env(Env({})).index.quantization == "int8"
    assert (
        RetrievalSettings.from_env(Env({"RETR_QUANTIZATION": "None"})).index.quantization == "none"
    )
    with pytest.raises(SettingsError, match="RETR_QUANTIZATION"):
        RetrievalSettings.from_env(Env({"RETR_QUANTIZATION": "int4"}))


def test_retrieval_indexing_threshold_setting():
    assert RetrievalSettings.from_env(Env({})).index.indexing_threshold_kb == 0  # Qdrant's default
    s = RetrievalSettings.from_env(Env({"RETR_INDEXING_THRESHOLD_KB": "100000000"}))
    assert s.index.indexing_threshold_kb == 100_000_000
    for bad in ("-1", "100000001"):
        with pytest.raises(SettingsError, match="RETR_INDEXING_THRESHOLD_KB"):
            RetrievalSettings.from_env(Env({"RETR_INDEXING_THRESHOLD_KB": bad}))


# -- declarations and the generated configuration page ---------------------------------------


def _config_docs():
    """tools/config_docs.py, the generator of docs/configuration.md."""
    import importlib.util
    import sys
    from pathlib import Path

    if "config_docs" in sys.modules:
        return sys.modules["config_docs"]
    path = Path(__file__).resolve().parents[2] / "tools" / "config_docs.py"
    spec = importlib.util.spec_from_file_location("config_docs", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["config_docs"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_name_a_service_reads_is_declared_and_documented_once():
    docs = _config_docs()
    reads = docs.collect()
    assert reads.undeclared == {}
    page = (docs.ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert page == docs.render(reads), "docs/configuration.md is stale: run make gen"
    rows = [line.split("|")[1].strip() for line in page.splitlines() if line.startswith("| `")]
    assert len(rows) == len(set(rows))
    assert "`ORCH_RETRY_ATTEMPTS`" in rows and "`MCP_PROXY_RETRY_ATTEMPTS`" in rows
    for dropped in ("VISIOR_RETRY_ATTEMPTS", "VISIOR_GRACE_SECONDS", "RETRIEVAL_URL",
                    "ORCH_WINDOW_MAX", "RETR_RERANK_MODEL_URL", "LLM_SERVICE_RUNTIME_URL",
                    "RETR_LLM_RUNTIME_URL", "LLM_SERVICE_LOG_LEVEL", "ORCH_KEEPALIVE_SECONDS"):  # fmt: skip
        assert f"`{dropped}`" not in rows
        assert dropped not in NAMES
    assert sorted(NAMES) == docs.all_names(reads), "setting_names.py is stale: run make gen"
    assert len(NAMES) <= 150  # issue 22


def test_each_default_is_written_once_on_its_settings_field():
    """A Var filling a settings field takes the field's default (FIELD_DEFAULT); one that names
    its own names a different one (a computed port, a raw text the reader parses)."""
    import dataclasses

    repeated, taken = [], 0
    for var, _ in _config_docs().collect().vars.values():
        if var.owner is None or var.kind == "secret":
            continue
        cls, name = var.owner
        default = {f.name: f for f in dataclasses.fields(cls)}[name].default
        if var.field_default:
            assert var.default == default
            taken += 1
        elif default is not dataclasses.MISSING and type(default) is type(var.default):
            if default == var.default:
                repeated.append(var.name)
    assert repeated == []
    assert taken >= 60


def test_a_var_without_a_default_takes_its_fields_or_is_refused():
    from dataclasses import dataclass

    from services.common.settings import FIELD_DEFAULT, Fields, integer, text

    @dataclass(frozen=True)
    class Knobs:
        size: int
        depth: int = 7

    fields = Fields(Knobs, size=integer("TEST_ONLY_SIZE", 2), depth=integer("TEST_ONLY_DEPTH"))
    assert fields.read(Env({})) == Knobs(2, 7)
    assert fields.read(Env({"TEST_ONLY_DEPTH": "9"})) == Knobs(2, 9)
    assert fields.vars["depth"].field_default and not fields.vars["size"].field_default
    with pytest.raises(SettingsError, match=r"TEST_ONLY_WIDTH names no default and Knobs\.size"):
        Fields(Knobs, size=integer("TEST_ONLY_WIDTH"))
    unbound = text("TEST_ONLY_UNBOUND")
    assert unbound.default is FIELD_DEFAULT
    with pytest.raises(SettingsError, match="TEST_ONLY_UNBOUND has no default"):
        unbound.read(Env({}))


NOT_APPLICABLE = {"ORCH_MCP_PROXY_URL", "ORCH_LLM_RUNTIME_URL", "RETR_VECTOR_BACKEND"}
"""Spec names docs/operations.md says do not apply here; and one error code that shares a
settings prefix."""
NOT_APPLICABLE |= {"LLM_RUNTIME_ERROR"}


def test_every_setting_the_docs_name_is_one_a_service_reads():
    import re

    from services.common.settings import NOT_SETTINGS, PREFIXES

    root = _config_docs().ROOT
    name = re.compile(r"\b(?:" + "|".join(PREFIXES) + r")[A-Z0-9_]*[A-Z0-9]\b")
    pages = doc_pages()
    named = {
        (m.group(0), page.relative_to(root).as_posix())
        for page in pages
        for m in name.finditer(page.read_text(encoding="utf-8"))
    }
    unknown = sorted(
        (n, page)
        for n, page in named
        if n not in NAMES and n not in NOT_SETTINGS and n not in NOT_APPLICABLE
        and not (n.endswith("_FILE") and n.removesuffix("_FILE") in NAMES)
    )  # fmt: skip
    assert unknown == []
    assert len(named) > 100


def test_an_undeclared_read_is_reported(monkeypatch):
    docs = _config_docs()
    real = OrchestratorSettings.from_env

    def sneaky(env):
        env.text("ORCH_SOMETHING_NEW", "")
        return real(env)

    monkeypatch.setattr(docs, "loaders", lambda: {"orchestrator": sneaky})
    assert docs.collect().undeclared == {"ORCH_SOMETHING_NEW": {"orchestrator"}}


def test_a_name_declared_twice_differently_is_refused():
    from services.common.settings import integer

    integer("TEST_ONLY_LIMIT", 3, 0, 5)
    integer("TEST_ONLY_LIMIT", 3, 0, 5)  # the same declaration again is the same setting
    with pytest.raises(SettingsError, match="declared twice"):
        integer("TEST_ONLY_LIMIT", 4, 0, 5)


def test_the_retry_count_has_one_name_per_service():
    env = {"ORCH_RETRY_ATTEMPTS": "5", "LLM_SERVICE_RETRY_ATTEMPTS": "1"}
    orch = OrchestratorSettings.from_env(Env(env))
    assert orch.retrieval.retry_attempts == orch.llm.retry_attempts == 5
    assert LlmSettings.from_env(Env(env)).tools_proxy.retry_attempts == 1
    assert ToolsProxySettings.from_env(Env(env)).retrieval.retry_attempts == 3
    with pytest.raises(SettingsError, match="MCP_PROXY_RETRY_ATTEMPTS=6 is above"):
        ToolsProxySettings.from_env(Env({"MCP_PROXY_RETRY_ATTEMPTS": "6"}))
    assert (
        OrchestratorSettings.from_env(Env({"VISIOR_RETRY_ATTEMPTS": "1"})).llm.retry_attempts == 3
    )


@pytest.mark.parametrize(("value", "ok"), [("50", True), ("51", False), ("1", True), ("0", False)])
def test_orchestrator_default_top_k_at_its_limits(value, ok):
    env = Env({"ORCH_DEFAULT_TOP_K": value})
    if ok:
        assert OrchestratorSettings.from_env(env).default_top_k == int(value)
    else:
        with pytest.raises(SettingsError, match="ORCH_DEFAULT_TOP_K"):
            OrchestratorSettings.from_env(env)


def test_text_choices_name_the_variable():
    with pytest.raises(SettingsError, match="RETR_INDEX_BACKEND='chroma' must be one of edge"):
        RetrievalSettings.from_env(Env({"RETR_INDEX_BACKEND": "chroma"}))
    assert RetrievalSettings.from_env(Env({"RETR_FUSION": "rrf"})).engine.fusion == "rrf"
