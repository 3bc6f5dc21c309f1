"""The cache bounded by entries and characters (common/bounded_cache.py), and the runtime
client's message-JSON cache that uses it."""

from __future__ import annotations

from services.common.bounded_cache import BoundedCache
from services.model_runtime import client
from services.model_runtime.chat import ChatMessage, ChatRequest, ToolCall, message_chars


def test_the_cache_holds_texts_up_to_its_bound_and_evicts_the_oldest_past_it() -> None:
    cache: BoundedCache[str, int] = BoundedCache(100, 10)
    cache.put("a", 1, 5)
    cache.put("b", 2, 5)
    assert (cache.chars, len(cache), cache.get("a"), cache.get("b")) == (10, 2, 1, 2)  # at it
    cache.put("c", 3, 1)  # one past it: the oldest goes
    assert (cache.chars, cache.get("a"), cache.get("b"), cache.get("c")) == (6, None, 2, 3)


def test_a_text_of_the_whole_bound_is_kept_one_longer_never() -> None:
    cache: BoundedCache[str, int] = BoundedCache(100, 10)
    cache.put("small", 1, 3)
    cache.put("whole", 2, 10)
    assert (cache.get("whole"), cache.get("small"), cache.chars) == (2, None, 10)
    cache.put("longer", 3, 11)
    assert (cache.get("longer"), cache.get("whole"), cache.chars) == (None, 2, 10)


def test_the_entry_bound_still_holds() -> None:
    cache: BoundedCache[int, int] = BoundedCache(3, 1000)
    for i in range(5):
        cache.put(i, i, 1)
    assert len(cache) == 3 and cache.get(0) is None and cache.get(4) == 4


def test_a_message_counts_every_text_it_holds() -> None:
    call = ToolCall(id="c1", name="search", arguments="{}")
    message = ChatMessage("assistant", "ab", (call,), tool_call_id="x", name="yz")
    assert message_chars(message) == 2 + 1 + 2 + 2 + 6 + 2


def test_many_long_messages_keep_the_message_json_cache_under_its_bound(monkeypatch) -> None:
    """64 messages of 32,768 characters a request, request after request: an entry count
    alone would keep 1,024 of them and their JSON (64 M characters)."""
    cache: BoundedCache[ChatMessage, str] = BoundedCache(
        client._JSON_CACHE_LIMIT, client._JSON_CACHE_CHARS
    )
    monkeypatch.setattr(client, "_MESSAGE_JSON", cache)
    long = ("абвгдежзийклмнопрстуфхцчшщыэюя " * 1100)[:32_760]
    for request in range(2 * client._JSON_CACHE_CHARS // (64 * 65_536) + 2):
        messages = tuple(ChatMessage("user", f"{request}:{i}:{long}") for i in range(64))
        body = client.encode_request(ChatRequest(messages))
        assert cache.chars <= client._JSON_CACHE_CHARS
    assert long in body.decode() and cache.get(messages[-1]) is not None  # the latest is kept
    assert cache.chars > client._JSON_CACHE_CHARS - 2 * 32_768  # the bound is used
