"""What the PostgreSQL document store adds to the shared contract (tests/unit/test_docstore.py):
its schema and how it keeps ids, a server that goes away and comes back, a password that
never shows. Against a real server (tests/pg_server.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from services.docstore.errors import StoreUnavailableError
from services.docstore.factory import open_document_store
from services.docstore.postgres_store import (
    SCHEMA_VERSION,
    PostgresDocumentStore,
    _lock_key,
    tcp_settings,
)
from tests.pg_server import PgCluster
from tests.unit.test_docstore import doc, points_of

PASSWORD = "pw-hunter2-do-not-log"


def test_the_factory_picks_the_store_by_url(pg_url, tmp_path):
    for url in (pg_url, pg_url.replace("postgresql://", "postgres://", 1)):
        store = open_document_store(url, pool_size=1)
        try:
            assert isinstance(store, PostgresDocumentStore) and store.kind == "postgresql"
        finally:
            store.close()
    sqlite = open_document_store(f"sqlite:///{tmp_path}/s.sqlite")
    assert sqlite.kind == "sqlite"
    sqlite.close()


def test_a_database_of_the_first_schema_gains_the_token_count(pg_url):
    store = PostgresDocumentStore(pg_url, pool_size=1)
    d = doc()
    store.put(d, points_of(d))
    store.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:  # the first schema, as it was
        conn.execute("ALTER TABLE documents DROP COLUMN tokens")
        conn.execute("DELETE FROM docstore_schema_version WHERE version > 1")
    store = PostgresDocumentStore(pg_url, pool_size=1)
    try:
        assert store.list_documents("t1")[0].tokens == 0
        assert store.incomplete_documents() == [("t1", "guide", d.generation)]
        assert store.complete_document("t1", "guide", d.generation, lambda: points_of(d), d.tokens)
        assert store.list_documents("t1")[0].tokens == d.tokens > 0
    finally:
        store.close()


def test_schema_is_versioned_and_ids_are_signed_bigints(pg_url):
    store = PostgresDocumentStore(pg_url, pool_size=2)
    d = doc()
    store.put(d, points_of(d))
    again = PostgresDocumentStore(pg_url, pool_size=1)  # reopening migrates nothing twice
    again.close()
    store.close()
    with psycopg.connect(pg_url) as conn:
        versions = conn.execute("SELECT version FROM docstore_schema_version").fetchall()
        assert versions == [(v,) for v in range(1, SCHEMA_VERSION + 1)] and SCHEMA_VERSION == 3
        ids = conn.execute("SELECT point_id FROM points ORDER BY point_id").fetchall()
        # u64 ids 0, 2^63-1, 2^63, 2^64-1 as two's complement BIGINTs, as SQLite keeps them
        assert [r[0] for r in ids] == [-(2**63), -1, 0, 2**63 - 1]
        types: dict[str, str] = dict(
            conn.execute(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_name = 'points'"
            ).fetchall()
        )
        assert types["point_id"] == types["ord"] == "bigint"


def test_services_opening_a_fresh_database_at_once_do_not_race_the_schema(pg_url):
    stores: list[PostgresDocumentStore] = []
    failures: list[BaseException] = []

    def open_one() -> None:
        try:
            stores.append(PostgresDocumentStore(pg_url, pool_size=1))
        except BaseException as exc:  # collected: the test reports it
            failures.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in stores:
        s.close()
    assert failures == [] and len(stores) == 4


def test_a_read_only_store_refuses_writes(pg_url):
    PostgresDocumentStore(pg_url, pool_size=1).close()  # the schema
    reader = PostgresDocumentStore(pg_url, read_only=True, pool_size=1)
    try:
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            reader.put(doc())
        assert reader.get_document("t1", "guide") is None
    finally:
        reader.close()


@pytest.fixture
def own_server() -> Iterator[PgCluster]:
    """A server of this test's own, to stop and start (the session's serves other tests)."""
    cluster = PgCluster()
    yield cluster
    cluster.destroy()


def test_connection_loss_is_store_unavailable_and_the_store_recovers(own_server):
    cluster = own_server
    url = cluster.url(cluster.create_database(), password=PASSWORD)  # trust auth ignores it
    store = PostgresDocumentStore(url, pool_size=2, timeout_s=1.0)
    try:
        d = doc()
        listed = points_of(d)
        ids = [p.point_id for p in listed]
        store.put(d, listed)

        # Every pooled connection is cut (a failover, an idle timeout): the next calls
        # notice, replace them and answer.
        with psycopg.connect(cluster.url(), autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname <> 'postgres' AND pid <> pg_backend_pid()"
            )
        assert len(store.points_by_ids("t1", ids)) == 4
        assert store.put(d, listed) is True

        # The server is down: reads and writes raise the error callers handle for it,
        # naming the host but never the password.
        cluster.stop()
        for call in (
            store.ping,
            lambda: store.points_by_ids("t1", ids),
            lambda: store.get_document("t1", "guide"),
            lambda: store.put(d, listed),
            lambda: store.delete("t1", "guide"),
        ):
            with pytest.raises(StoreUnavailableError) as info:
                call()
            assert info.value.reason == "backend_unavailable"
            assert PASSWORD not in str(info.value) and PASSWORD not in repr(info.value)
            assert "postgres:***@127.0.0.1" in str(info.value)

        # It comes back on the same port: the store serves again without a restart.
        cluster.start()
        deadline = time.monotonic() + 30
        while True:
            try:
                store.ping()
                break
            except StoreUnavailableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        assert store.get_document("t1", "guide") == d
        assert len(store.points_by_ids("t1", ids)) == 4
        assert store.put(d, listed) is True
    finally:
        store.close()


def _cut_connections(url: str) -> None:
    """End every other session on `url`'s database (a failover, an idle timeout)."""
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


def test_a_snapshot_begun_on_cut_connections_replaces_them(pg_url):
    # get_document reads in a snapshot (its own transaction): a pooled connection found cut
    # as it begins is replaced, as a lone read's is.
    store = PostgresDocumentStore(pg_url, pool_size=2)
    try:
        d = doc()
        store.put(d)
        _cut_connections(pg_url)
        assert store.get_document("t1", "guide") == d
    finally:
        store.close()


def test_a_connection_cut_inside_a_snapshot_is_store_unavailable(pg_url):
    store = PostgresDocumentStore(pg_url, pool_size=2)
    try:
        d = doc()
        store.put(d)
        with pytest.raises(StoreUnavailableError), store.snapshot():
            assert store.document_generation("t1", "guide") == d.generation
            _cut_connections(pg_url)
            store.get_document("t1", "guide")
        assert store.get_document("t1", "guide") == d  # the store recovers
    finally:
        store.close()


def test_an_unreachable_server_at_start_is_store_unavailable_without_the_password(pg_server):
    url = f"postgresql://visior:{PASSWORD}@127.0.0.1:1/visior"  # nothing listens on port 1
    with pytest.raises(StoreUnavailableError) as info:
        PostgresDocumentStore(url, pool_size=1, timeout_s=1.0)
    assert PASSWORD not in str(info.value)
    assert "visior:***@127.0.0.1:1/visior" in str(info.value)


def test_the_password_never_shows_in_repr(pg_server):
    name = pg_server.create_database()
    store = PostgresDocumentStore(pg_server.url(name, password=PASSWORD), pool_size=1)
    try:
        assert PASSWORD not in repr(store) and PASSWORD not in store.location
        assert "postgres:***@" in repr(store)
    finally:
        store.close()
        pg_server.drop_database(name)


def test_document_tools_answer_upstream_unavailable_while_the_server_is_down(own_server):
    from services.toolsproxy.tools import Caller, DocumentTools, ToolExecutor, ToolLimits

    cluster = own_server
    store = PostgresDocumentStore(cluster.url(cluster.create_database()), timeout_s=1.0)
    try:
        store.put(doc(tenant="a"))
        executor = ToolExecutor(DocumentTools(store, ToolLimits()).tools)
        caller = Caller("a", "u1")
        ok = asyncio.run(executor.execute("read_doc_metadata", {"doc_id": "guide"}, caller))
        assert ok.status == "ok", ok
        cluster.stop()
        down = asyncio.run(executor.execute("read_doc_metadata", {"doc_id": "guide"}, caller))
        assert (down.status, down.error_code) == ("error", "UPSTREAM_UNAVAILABLE"), down
        assert "127.0.0.1" not in str(down)  # the store's address stays in the log
    finally:
        store.close()


def _finishes_within(seconds: float, fn):
    """Run `fn` in a thread; (finished in time, its result or exception)."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # the test reads it
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive(), box.get("error", box.get("result")), thread


@pytest.mark.parametrize("held", ["document write lock", "table lock"])
def test_a_lock_held_elsewhere_is_store_unavailable_past_the_timeout(pg_url, held):
    # A stuck writer or an operator's open transaction: SQLite gives up after its busy
    # timeout, and so must this store (DOCSTORE_TIMEOUT_S), not wait for ever.
    store = PostgresDocumentStore(pg_url, pool_size=2, timeout_s=1.0)
    d = doc()
    store.put(d)
    holder = psycopg.connect(pg_url)
    try:
        if held == "document write lock":
            holder.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key("t1", "guide"),))
            call = lambda: store.put(d)  # noqa: E731
        else:
            holder.execute("LOCK TABLE chunks IN ACCESS EXCLUSIVE MODE")  # a migration's ALTER
            call = lambda: store.get_document("t1", "guide")  # noqa: E731
        started = time.monotonic()
        finished, outcome, thread = _finishes_within(10.0, call)
        waited = time.monotonic() - started
    finally:
        holder.rollback()
        holder.close()
    thread.join(30)
    try:
        assert finished, "the call still waited on the lock after 10 s"
        assert isinstance(outcome, StoreUnavailableError) and "lock timeout" in str(outcome)
        assert 0.9 <= waited < 5.0
        assert store.get_document("t1", "guide") == d  # lock gone: it answers again
        assert store.put(d) is True
    finally:
        store.close()


def test_the_store_answers_soon_after_a_long_outage_ends(own_server):
    # psycopg_pool's default reconnect_timeout (300 s) left each broken slot backing off
    # (1, 2, 4, 8, 16 s ...) with no fresh attempt: the store stayed down for seconds after
    # the server was back (tens of seconds after longer outages). Slots give up after
    # timeout_s now and the next call opens a fresh connection.
    cluster = own_server
    store = PostgresDocumentStore(
        cluster.url(cluster.create_database()), pool_size=2, timeout_s=0.5
    )
    try:
        store.ping()
        cluster.stop()
        down = time.monotonic()
        while time.monotonic() - down < 12:  # callers keep trying meanwhile
            with pytest.raises(StoreUnavailableError):
                store.ping()
            time.sleep(1.0)
        cluster.start()  # returns once the server takes connections (pg_ctl start -w)
        # The first call finds it, with no retry of ours: every broken slot has given up, so
        # the call's demand opens a fresh connection at once. With the old back-off no slot
        # tries again within the call's 0.5 s wait for a connection (the next try is up to
        # 8 s away after a 12 s outage), and the call is refused.
        try:
            store.ping()
        except StoreUnavailableError as exc:
            pytest.fail(f"the first call after the server came back was refused: {exc}")
    finally:
        store.close()


def test_connections_bound_a_dead_peer_with_tcp_keepalives_unless_the_url_says(pg_server):
    # A frozen server or a network that drops every packet is not reproduced here (no
    # packet filter in the sandbox); what is checked is that libpq gets the settings.
    url = pg_server.url(pg_server.create_database())
    assert tcp_settings(url, 5.0) == {
        "keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3,
        "tcp_user_timeout": 5000,
    }  # fmt: skip
    assert tcp_settings(url, 0.5)["tcp_user_timeout"] == 1000  # at least a second
    # whole seconds rounded up, as connect_timeout is: never shorter than the setting
    assert tcp_settings(url, 2.5)["keepalives_idle"] == 3
    sep = "&" if "?" in url else "?"
    assert "keepalives_idle" not in tcp_settings(f"{url}{sep}keepalives_idle=60", 5.0)
    store = PostgresDocumentStore(f"{url}{sep}keepalives_idle=60", pool_size=1, timeout_s=2.0)
    try:
        with store._pool.connection() as conn:
            params = conn.info.get_parameters()
        assert params.get("keepalives_idle") == "60"  # the operator's own value
        assert params.get("tcp_user_timeout") == "2000" and params.get("keepalives") == "1"
    finally:
        store.close()


def test_a_wait_for_a_connection_ends_before_the_requests_deadline(pg_url):
    """Every pooled connection busy (or the server down): a read made for a request whose
    deadline is 1.5 s away fails with the store's error before it (1.35 s), not after the
    store's 5 s timeout, which the caller's deadline cut short: the caller hears the store."""
    from services.common.context import deadline_var

    store = PostgresDocumentStore(pg_url, pool_size=1, timeout_s=5.0)
    held = store._pool.getconn()  # the only connection, taken
    try:
        deadline_var.set(time.monotonic() + 1.5)
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError):
            store.ping()
        took = time.monotonic() - started
        assert 1.2 < took < 1.5
    finally:
        deadline_var.set(None)
        store._pool.putconn(held)
        store.close()
