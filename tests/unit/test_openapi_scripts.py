"""tools/openapi.py's IngestDocumentRequest patterns take every id and file name the server
takes, in any script: a client that validates against the OpenAPI never refuses a request
the server accepts. In ASCII they refuse exactly what the server refuses.

The patterns are checked with Python's `re` (as jsonschema applies them) and through
jsonschema on the request schema built from the protos; the server's answer is the
Ingestor's own validation.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from types import ModuleType
from typing import Any

import jsonschema
import pytest
from google.protobuf import descriptor_pb2

from services.common import errors
from services.common.document_limits import MAX_DOC_ID_CHARS
from services.common.search_contract import MAX_TENANT_ID_CHARS
from services.devtools.envoy import REPO_ROOT as ROOT
from services.docstore.parsing import SUFFIX_FORMATS
from services.retrieval.embeddings import EmbeddingSettings
from services.retrieval.factories import build_embedder
from services.retrieval.ingestion import IngestInput, Ingestor
from tests.unit.test_search import make_stack

PREFIX = "#/components/schemas/"
REQUEST = "visior.retrieval.v1.IngestDocumentRequest"


def _load_tool() -> ModuleType:
    name = "visior_openapi_tool_scripts"
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools/openapi.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


tool = _load_tool()
TENANT_RULE = tool.REQUEST_RULES[f"{REQUEST}.tenant_id"]
DOC_ID_RULE = tool.REQUEST_RULES[f"{REQUEST}.doc_id"]


@pytest.fixture(scope="module")
def ingestor(tmp_path_factory: pytest.TempPathFactory) -> Ingestor:
    tmp = tmp_path_factory.mktemp("openapi_scripts")
    return make_stack(tmp, build_embedder(EmbeddingSettings(profile="fast"))).ingestor


@pytest.fixture(scope="module")
def request_validator() -> jsonschema.Draft202012Validator:
    """IngestDocumentRequest's schema as tools/openapi.py builds it from the protos."""
    fds = descriptor_pb2.FileDescriptorSet()
    fds.ParseFromString((ROOT / "envoy" / "visior.pb").read_bytes())
    components = tool.build(fds)["components"]["schemas"]
    local = json.loads(json.dumps(components).replace(PREFIX, "#/$defs/"))
    return jsonschema.Draft202012Validator({"$ref": f"#/$defs/{REQUEST}", "$defs": local})


def server_takes(ingestor: Ingestor, **fields: str) -> bool:
    item = IngestInput(**{"tenant_id": "t", "content": b"text", "doc_id": "d", **fields})
    try:
        ingestor._validate(item)
    except errors.InvalidArgumentError:
        return False
    return True


def schema_takes(validator: jsonschema.Draft202012Validator, **fields: str) -> bool:
    body = {"tenant_id": "t", "content": "dGV4dA==", "doc_id": "d", **fields}
    return validator.is_valid(body)


def rule_takes(rule: dict[str, Any], value: str) -> bool:
    """The rule's pattern with Python's `re` (jsonschema's `pattern`), and its lengths."""
    lengths = rule.get("minLength", 0) <= len(value) <= rule.get("maxLength", len(value))
    return lengths and re.search(rule["pattern"], value) is not None


ANY_SCRIPT_TENANTS = ["тенант-1", "文档.v2", "Ωμέγα:9", "𝐀" * MAX_TENANT_ID_CHARS]
ASCII_TENANTS = ["demo", "a.b:c-d_e", "_x", "T" * MAX_TENANT_ID_CHARS]
PAST = MAX_TENANT_ID_CHARS + 1
REFUSED_TENANTS = ["a b", "a/b", "", "t" * PAST, "т" * PAST, "t\n", "a@b"]


ANY_SCRIPT_DOC_IDS = ["文档.v2", "тенант-1", "Отчёт_2024", "٣ar", "д" * MAX_DOC_ID_CHARS]
ASCII_DOC_IDS = ["guide", "v1.2-final_x", "9lives", "d" * MAX_DOC_ID_CHARS]
REFUSED_DOC_IDS = ["a b", "a/b", "a:b", "-a", "_a", ".a", "d" * (MAX_DOC_ID_CHARS + 1), "d\n"]


RULES = {"tenant_id": TENANT_RULE, "doc_id": DOC_ID_RULE}
TAKEN = [("tenant_id", v) for v in ANY_SCRIPT_TENANTS + ASCII_TENANTS] + [
    ("doc_id", v) for v in ANY_SCRIPT_DOC_IDS + ASCII_DOC_IDS
]
REFUSED = [("tenant_id", v) for v in REFUSED_TENANTS] + [("doc_id", v) for v in REFUSED_DOC_IDS]


@pytest.mark.parametrize(("field", "value"), TAKEN)
def test_an_id_the_server_takes_is_valid(ingestor, request_validator, field, value):
    assert server_takes(ingestor, **{field: value})
    assert rule_takes(RULES[field], value)
    assert schema_takes(request_validator, **{field: value})


@pytest.mark.parametrize(("field", "value"), REFUSED)
def test_an_id_the_server_refuses_is_not_valid(ingestor, request_validator, field, value):
    assert not server_takes(ingestor, **{field: value})
    assert not rule_takes(RULES[field], value)
    assert not schema_takes(request_validator, **{field: value})


def test_in_ascii_the_id_patterns_are_the_servers_rules(ingestor):
    for code in range(128):
        c = chr(code)
        for tenant in (f"a{c}a", f"{c}a", f"a{c}", c):
            assert rule_takes(TENANT_RULE, tenant) == server_takes(ingestor, tenant_id=tenant)
        for doc_id in (f"a{c}a", f"{c}a", f"a{c}", c):
            assert rule_takes(DOC_ID_RULE, doc_id) == server_takes(ingestor, doc_id=doc_id)


@pytest.mark.parametrize(
    "name", ["Отчёт.md", "docs/отчёт за 2024.pdf", "ёлка", "архив.tar.md", "x/Я.txt"]
)
def test_a_file_name_in_cyrillic_makes_a_doc_id(ingestor, request_validator, name):
    assert server_takes(ingestor, doc_id="", file_name=name, content_type="text/plain")
    assert re.search(tool.FILE_STEM, name)
    assert schema_takes(request_validator, doc_id="", file_name=name, content_type="text/plain")


def test_in_ascii_the_file_stem_pattern_is_the_servers_rule(ingestor):
    for code in range(32, 127):
        c = chr(code)
        for name in (f"{c}.md", f"d/{c}.md", f"{c}", f"{c}{c}.{c}", f"a.{c}"):
            takes = server_takes(ingestor, doc_id="", file_name=name, content_type="text/plain")
            assert (re.search(tool.FILE_STEM, name) is not None) == takes, repr(name)


def test_the_extension_patterns_are_the_parsers_suffixes():
    for suffix, fmt in SUFFIX_FORMATS.items():
        for name in (f"a{suffix}", f"a{suffix.upper()}"):
            assert re.search(tool.KNOWN_EXTENSION, name)
            assert bool(re.search(tool.CSV_EXTENSION, name)) == (fmt == "csv")
    assert not re.search(tool.KNOWN_EXTENSION, "a.png")


def test_the_descriptions_state_the_servers_limits():
    assert f"1-{MAX_TENANT_ID_CHARS} letters (any script)" in TENANT_RULE["description"]
    assert f"1-{MAX_DOC_ID_CHARS} letters (any script)" in DOC_ID_RULE["description"]
