"""Follow-ups (agent.md §4 with the recent turns a caller passes): a turn that leans on the
ones before takes their route and what it leaves out, however long the chain."""

from datetime import date

from services.common.search_contract import MAX_QUERY_CHARS
from services.orchestrator.scenarios import Decision, rule_decision

TODAY = date(2026, 11, 28)


def after(*turns: str) -> Decision:
    """The decision for the last of `turns`, the ones before it the user's history (each
    answered by the assistant)."""
    history = []
    for turn in turns[:-1]:
        history += [("user", turn), ("assistant", "…")]
    return rule_decision(turns[-1], history=history, today=TODAY)


def rates(d: Decision) -> tuple[str, str, str, str, str]:
    return d.intent, d.currency, d.date, d.date_from, d.date_to


# -- chains ----------------------------------------------------------------------------------


def test_a_chain_walks_back_to_the_last_turn_with_a_route():
    assert rates(after("курс доллара", "а на вчера?")) == (
        "currency_rates", "USD", "2026-11-27", "", "",
    )  # fmt: skip
    assert rates(after("курс доллара", "а на вчера?", "а на позавчера?")) == (
        "currency_rates", "USD", "2026-11-26", "", "",
    )  # fmt: skip


def test_a_chain_keeps_what_each_turn_changed():
    d = after("курс доллара", "а евро?", "а на вчера?")
    assert rates(d) == ("currency_rates", "EUR", "2026-11-27", "", "")
    d = after("What is the key rate?", "and yesterday?", "and on 2026-11-21?")
    assert (d.intent, d.date, d.language) == ("key_rate", "2026-11-21", "en")


def test_a_chain_through_a_question_asked_back():
    # «30.02» was asked back; the answer to that question keeps the rate route
    d = after("курс доллара на 30.02", "а на 28.02?")
    assert rates(d) == ("currency_rates", "USD", "2026-02-28", "", "")


def test_small_talk_ends_a_chain():
    assert after("курс доллара", "Привет", "а на вчера?").intent == "clarify"


def test_a_long_chain():
    turns = ["курс доллара", *["а на вчера?"] * 30, "а на позавчера?"]
    assert rates(after(*turns)) == ("currency_rates", "USD", "2026-11-26", "", "")


# -- what a follow-up leaves out -------------------------------------------------------------

DATED = "курс доллара на 1 марта 2024"


def test_another_currency_keeps_the_earlier_day():
    for follow_up in ("а евро?", "а в евро?", "евро?", "а курс евро?"):
        assert rates(after(DATED, follow_up)) == (
            "currency_rates", "EUR", "2024-03-01", "", "",
        ), follow_up  # fmt: skip
    d = after("USD rate on March 1, 2024", "and the euro?")
    assert rates(d) == ("currency_rates", "EUR", "2024-03-01", "", "")


def test_the_key_rate_after_a_rate_keeps_the_day():
    assert rates(after(DATED, "а ключевая ставка?")) == ("key_rate", "", "2024-03-01", "", "")


def test_a_whole_question_of_its_own_does_not_lean_on_the_earlier_one():
    assert rates(after(DATED, "курс евро")) == ("currency_rates", "EUR", "", "", "")
    assert after(DATED, "Найди договор аренды").intent == "documents"


def test_a_period_is_kept_and_replaced():
    period = "курс доллара в 2023 году"
    assert rates(after(period, "а евро?")) == (
        "currency_rates", "EUR", "", "2023-01-01", "2023-12-31",
    )  # fmt: skip
    assert rates(after(period, "а на 5 марта?")) == ("currency_rates", "USD", "2023-03-05", "", "")
    assert rates(after(DATED, "а с 1 по 10 марта?")) == (
        "currency_rates", "USD", "", "2024-03-01", "2024-03-10",
    )  # fmt: skip


# -- now, and a day without a year -----------------------------------------------------------


def test_now_means_today():
    assert rates(after(DATED, "а сейчас?")) == ("currency_rates", "USD", "", "", "")
    assert rates(after("ключевая ставка на 1 марта 2024", "а сейчас?")) == (
        "key_rate", "", "", "", "",
    )  # fmt: skip
    d = after("What is the key rate on 1 March 2024?", "and now?")
    assert (d.intent, d.date) == ("key_rate", "")
    assert after("курс доллара вчера", "а сегодня?").date == "2026-11-28"


def test_a_day_without_a_year_takes_the_earlier_turns_year():
    assert after(DATED, "а на 5 марта?").date == "2024-03-05"
    assert after(DATED, "а на 05.03?").date == "2024-03-05"
    assert after(DATED, "а на 5 марта 2023?").date == "2023-03-05"  # its own year wins


def test_the_earlier_year_only_up_to_tomorrow():
    d = after("курс доллара на 1 марта 2026", "а на 31 декабря?")
    assert d.date == "2025-12-31"  # 2026-12-31 is after tomorrow
    assert after("курс доллара на 1 марта 2026", "а на 29 ноября?").date == "2026-11-29"


def test_a_day_without_a_year_and_no_earlier_day():
    assert after("курс доллара", "а на 31 декабря?").date == "2025-12-31"


# -- what a follow-up cannot use is asked back -----------------------------------------------


def test_a_follow_up_with_no_such_day_is_asked_back():
    d = after(DATED, "а на 31.06?")
    assert (d.scenario, d.intent) == ("S5", "clarify")
    assert "«31.06»" in d.clarifications[0]


def test_a_follow_up_with_an_unknown_country_is_asked_back():
    d = after(DATED, "а ямайского доллара?")
    assert (d.scenario, d.intent, d.currency) == ("S5", "clarify", "")
    assert "«ямайского доллара»" in d.clarifications[0]


def test_only_the_users_turns_make_a_chain():
    history = [("assistant", "Курс доллара"), ("assistant", "а на вчера?")]
    assert rule_decision("а на позавчера?", history=history, today=TODAY).intent == "clarify"


# -- the length of a history turn --------------------------------------------------------------


def test_a_history_turn_is_read_up_to_the_longest_question():
    """Each history turn is routed by its first MAX_QUERY_CHARS characters (the longest
    question a user may ask): a rate question ending at that limit gives the follow-up its
    rate route; with its currency past the limit, the turn is a question about documents."""
    words = "курс доллара"
    at = "ы" * (MAX_QUERY_CHARS - len(words) - 1) + " " + words
    assert len(at) == MAX_QUERY_CHARS
    assert after(at, "а на вчера?").intent == "currency_rates"
    past = "ы" * (MAX_QUERY_CHARS - len("курс ") - 1) + " " + words  # "доллара" is cut off
    assert after(past, "а на вчера?").intent == "documents"


def test_a_follow_up_month_takes_the_earlier_turn_s_year():
    d = after("курс евро на 1 марта 2024", "а в апреле?")
    assert rates(d) == ("currency_rates", "EUR", "", "2024-04-01", "2024-04-30")
    d = after("курс доллара", "а за неделю?")
    assert rates(d) == ("currency_rates", "USD", "", "2026-11-21", "2026-11-28")
