"""The document store's interface (`DocumentStore`: the SQL core whose dialects the SQLite
and PostgreSQL stores are) and what reading its location takes (URL schemes, masking a
password); the factory that opens one is services/docstore/factory.py."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

from services.docstore.sql_store import SqlDocumentStore

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
"""URL prefixes that select the PostgreSQL store (libpq takes both)."""
SQLITE_SCHEME = "sqlite:///"
DEFAULT_POOL_SIZE = 8
"""Connections a PostgreSQL store keeps open (<prefix>DOCSTORE_POOL_SIZE)."""
DEFAULT_TIMEOUT_S = 5.0
"""Either store's longest wait for a lock (SQLite's busy_timeout) or, on PostgreSQL, for a
connection, before a call fails with StoreUnavailableError (<prefix>DOCSTORE_TIMEOUT_S)."""


def sqlite_path(target: str) -> str:
    """The SQLite path of `target`: a plain path, or sqlite:///PATH (sqlite:/// alone is an
    in-memory database)."""
    if target.startswith(SQLITE_SCHEME):
        return target.removeprefix(SQLITE_SCHEME) or ":memory:"
    return target


DocumentStore = SqlDocumentStore
"""Full text by document, section, page and chunk position, per tenant: the interface is
`SqlDocumentStore`'s (services/docstore/sql_store.py), the SQL core both stores share.

Every read takes the tenant: a document of another tenant is simply not found. A
document and its index points are written in one transaction. Implemented by
`SqliteDocumentStore` (services/docstore/sqlite_store.py) and `PostgresDocumentStore`
(services/docstore/postgres_store.py); both raise `StoreUnavailableError` when the store
cannot be reached or written now. Methods are blocking: call them from worker threads.
"""


def _split_url(url: str) -> tuple[str, str, str, str, str, str] | None:
    """(scheme, userinfo, "@" or "", host part, path, query) as libpq reads a URL; None
    without "://".

    libpq takes the credentials up to the '@' before the first '/', so a '?' or '#' in a
    password stays in it (urllib ends the host part there and would see no password at
    all). The last such '@' is used: a stray one is masked with the password, not shown.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    authority, slash, tail = rest.partition("/")
    if slash:
        path, qmark, query = tail.partition("?")
        path = "/" + path
    else:  # no path: a query may follow the authority directly
        authority, qmark, query = authority.partition("?")
        path = ""
    userinfo, at, host = authority.rpartition("@")
    return scheme, userinfo, at, host, path, qmark + query


def _is_password_key(key: str) -> bool:
    """A URL parameter naming the password, percent-encoded or not (libpq decodes keys)."""
    return unquote(key).strip().lower() == "password"


def url_secrets(url: str) -> list[str]:
    """The password(s) a connection URL carries, as written and percent-decoded, longest
    first: for scrubbing messages that quote them (libpq's parse errors quote the bad token)."""
    parts = _split_url(url)
    if parts is None:
        return []
    _, userinfo, _, _, _, query = parts
    found = [userinfo.split(":", 1)[1]] if ":" in userinfo else []
    for pair in query[1:].split("&"):
        key, eq, value = pair.partition("=")
        if eq and _is_password_key(key):
            found.append(value)
    return sorted({v for raw in found for v in (raw, unquote(raw)) if v}, key=len, reverse=True)


def mask_url(url: str) -> str:
    """`url` with its password (user:PASSWORD@, or a password= parameter however spelled)
    replaced by ***, for logs, errors, reprs and health answers. A string that is not a URL
    but looks as if it could hold a secret comes back as ***."""
    parts = _split_url(url)
    if parts is None:
        return "***" if any(ch in url for ch in "@=:") else url
    scheme, userinfo, at, host, path, query = parts
    if ":" in userinfo:
        userinfo = userinfo.split(":", 1)[0] + ":***"
    if query:
        pairs = []
        for pair in query[1:].split("&"):
            key, eq, _ = pair.partition("=")
            pairs.append(f"{key}=***" if eq and _is_password_key(key) else pair)
        query = "?" + "&".join(pairs)
    return f"{scheme}://{userinfo}{at}{host}{path}{query}"


def scrub(message: str, url: str) -> str:
    """`message` with `url` masked and every password the URL carries replaced by ***."""
    message = message.replace(url, mask_url(url))
    for secret in url_secrets(url):
        message = message.replace(secret, "***")
    return message


def is_postgres_url(url_or_path: str | Path) -> bool:
    """True for a postgresql:// or postgres:// URL."""
    return isinstance(url_or_path, str) and url_or_path.lower().startswith(POSTGRES_SCHEMES)
