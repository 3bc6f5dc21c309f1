"""Respond fields that were taken unchecked: user.roles beside top-level ids, and channel and
locale (bounded, no control characters), refused naming the field before anything
downstream is asked."""

from __future__ import annotations

import pytest
from visior.common.v1 import common_pb2
from visior.orchestrator.v1 import orchestrator_pb2 as pb

from services.common import errors
from services.common.search_contract import MAX_ROLE_CHARS, MAX_ROLES
from services.orchestrator.model import LlmOutcome, RespondInput, RetrievalOutcome, User
from services.orchestrator.respond import (
    MAX_CHANNEL_CHARS,
    MAX_LOCALE_CHARS,
    Responder,
    resolve_user,
    validate,
)
from services.orchestrator.runtime_config import ConfigHolder, RuntimeConfig
from services.orchestrator.servicer import respond_input


class Retriever:
    def __init__(self) -> None:
        self.calls: list = []

    async def search(self, request):
        self.calls.append(request)
        return RetrievalOutcome((), 1)

    async def document_sizes(self, user, doc_ids):
        self.calls.append(doc_ids)
        return {}


class Generator:
    def __init__(self) -> None:
        self.requests: list = []

    async def generate(self, request):
        self.requests.append(request)
        return LlmOutcome("answer", (), 0, 1)


def _req(**kw) -> RespondInput:
    return RespondInput(**{"query": "Как настроить LDAP?", "user": User("t", "u"), **kw})


# --- user.roles beside top-level user_id / tenant_id --------------------------------------


def test_roles_of_a_user_without_ids_are_kept_with_the_top_level_ids():
    assert resolve_user(User("", "", ("admin", "hr")), "u", "demo") == User(
        "demo", "u", ("admin", "hr")
    )


@pytest.mark.parametrize(("roles", "exc"), [
    (tuple(f"r{i}" for i in range(MAX_ROLES + 1)), errors.LimitExceededError),
    (("x" * (MAX_ROLE_CHARS + 1),), errors.LimitExceededError),
    (("ad\x00min",), errors.InvalidArgumentError),
])  # fmt: skip
@pytest.mark.parametrize("ids_in_user", [True, False])
def test_roles_are_checked_whichever_form_carries_the_ids(roles, exc, ids_in_user):
    if ids_in_user:
        user, uid, tid = User("demo", "u", roles), "", ""
    else:
        user, uid, tid = User("", "", roles), "u", "demo"
    with pytest.raises(exc) as info:
        resolve_user(user, uid, tid)
    assert info.value.metadata["field"] == "user.roles"


def test_roles_at_the_limit_pass_with_top_level_ids():
    roles = tuple(f"r{i}" for i in range(MAX_ROLES))
    assert resolve_user(User("", "", roles), "u", "demo").roles == roles


def test_the_wire_form_with_roles_only_in_user_keeps_and_checks_them():
    req = pb.RespondRequest(query="LDAP", user_id="u", tenant_id="demo",
                            user=common_pb2.UserContext(roles=["admin"]))  # fmt: skip
    assert respond_input(req).user == User("demo", "u", ("admin",))
    req.user.roles.extend(f"r{i}" for i in range(33))
    with pytest.raises(errors.LimitExceededError) as info:
        respond_input(req)
    assert info.value.metadata["field"] == "user.roles"
    assert info.value.metadata["limit"] == str(MAX_ROLES)


# --- channel and locale --------------------------------------------------------------------


@pytest.mark.parametrize(("name", "limit"), [
    ("channel", MAX_CHANNEL_CHARS), ("locale", MAX_LOCALE_CHARS),
])  # fmt: skip
def test_channel_and_locale_at_their_limit_pass_and_one_past_is_limit_exceeded(name, limit):
    validate(_req(**{name: "a" * limit}))
    with pytest.raises(errors.LimitExceededError) as info:
        validate(_req(**{name: "a" * (limit + 1)}))
    assert info.value.reason == "LIMIT_EXCEEDED"
    assert info.value.metadata == {"field": name, "limit": str(limit)}


def test_the_limits_fit_bcp_47_and_a_modest_channel_name():
    assert MAX_LOCALE_CHARS == 35  # RFC 5646 §4.4.1: the longest tag to support
    assert MAX_CHANNEL_CHARS == 64
    validate(_req(locale="zh-Hant-CN-x-private1-private2", channel="telegram"))
    validate(_req(locale="ru_RU.UTF-8", channel="web"))  # POSIX spellings still pass


@pytest.mark.parametrize("name", ["channel", "locale"])
@pytest.mark.parametrize("bad", ["\x00", "ru\nRU", "a\x1b", "\x7f", "\x85", "ru\u2028"])
def test_a_control_character_in_channel_or_locale_is_invalid_argument(name, bad):
    with pytest.raises(errors.InvalidArgumentError) as info:
        validate(_req(**{name: bad}))
    assert info.value.reason == "INVALID_ARGUMENT"
    assert info.value.metadata["field"] == name


@pytest.mark.parametrize("kw", [
    {"channel": "x" * 200_000 + "\x00"},
    {"locale": "x" * 200_000 + "\x00"},
    {"locale": "ru-RU\x00"},
])  # fmt: skip
async def test_a_bad_channel_or_locale_is_refused_before_anything_downstream(kw):
    retriever, generator = Retriever(), Generator()
    responder = Responder(retriever, generator, ConfigHolder(RuntimeConfig(mock_mode=False), 3))
    with pytest.raises(errors.InvalidArgumentError) as info:
        await responder.respond(_req(**kw))
    assert info.value.metadata["field"] == next(iter(kw))
    assert retriever.calls == [] and generator.requests == []
