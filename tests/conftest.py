"""Test-wide defaults.

The servers the tests start (in-process and as subprocesses, which inherit os.environ) use
the fast embedding profile: the default e5 model embeds 7-9 passages/s on 2 cores, which
would make every ingest in the suite take seconds. The e5 profile has its own tests
(tests/unit/test_embeddings.py) and is what `make demo` and `make run` use.
"""

import os
from collections import Counter
from collections.abc import AsyncIterator

import httpx
import pytest
from _pytest.nodeid import NodeId

os.environ.setdefault("RETR_EMBEDDING_PROFILE", "fast")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as services/retrieval/__main__.py
os.environ.setdefault("OMP_NUM_THREADS", "1")
from tests.pg_server import open_store, pg_server, pg_url  # noqa: F401  (a real PostgreSQL server)


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client for a test's calls to the fakes and servers it starts (no proxy from the
    environment)."""
    async with httpx.AsyncClient(trust_env=False) as client:
        yield client


LONGEST_FIRST = (
    "tests/e2e/test_schemathesis.py",
    "tests/e2e/test_local_model_e2e.py",
    "tests/e2e/test_faults.py",
)
"""The files that take longest (`pytest --durations`: about 4, 2 and 1 minutes), collected
first: `make test` hands whole files to pytest-xdist workers as they come free, and the
long ones started last would leave one worker busy while the other waits."""


def _longest_first(item: pytest.Item) -> int:
    path = item.nodeid.partition("::")[0]
    return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Puts LONGEST_FIRST first (the order within a file stays), and gives every test its own
    node id: pytest-xdist schedules by node id and runs one test of each id only.

    schemathesis names each operation's test ``test_api[POST /internal/...]``, but under
    pytest 9 the node id keeps only ``test_api``; the operation goes back into it here.
    """
    items.sort(key=_longest_first)
    for item in items:
        label = getattr(item, "operation_label", None)
        if label and not item.nodeid.endswith("]"):
            item._id = NodeId.parse(f"{item.nodeid}[{label}]")
    shared = [nodeid for nodeid, n in Counter(i.nodeid for i in items).items() if n > 1]
    if shared:
        raise pytest.UsageError(f"tests share node ids, and only one of each would run: {shared}")
