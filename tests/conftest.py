"""Test-wide defaults.

The servers the tests start (in-process and as subprocesses, which inherit os.environ) use
the fast embedding profile: the default e5 model embeds 7-9 passages/s on 2 cores, which
would make every ingest in the suite take seconds. The e5 profile has its own tests
(tests/unit/test_embeddings.py) and is what `make demo` and `make run` use.
"""

import os

os.environ.setdefault("RETR_EMBEDDING_PROFILE", "fast")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as services/retrieval/__main__.py
os.environ.setdefault("OMP_NUM_THREADS", "1")
from tests.pg_server import pg_server, pg_url  # noqa: F401  (a real PostgreSQL server)
