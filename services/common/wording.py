"""How the rules read a question: case- and ё-folded text, and whole-word patterns over it.

The orchestrator's scenario rules and the currency names (services/common/currencies.py)
are written with these, so every rule is case- and ё-insensitive the same way.
"""

from __future__ import annotations

import re


def fold_yo(text: str) -> str:
    """``ё``/``Ё`` replaced by ``е``/``Е`` (how the letter is usually typed)."""
    return text.replace("ё", "е").replace("Ё", "Е")


def fold_case(text: str) -> str:
    """Lower case with ё folded into е, so every rule is case- and ё-insensitive."""
    return fold_yo(text.lower())


def whole_words(*alternatives: str) -> re.Pattern[str]:
    """One pattern matching any alternative as whole words; a space in a phrase is any gap.

    Alternatives are regex fragments over `fold_case` text; `\\w*` after a stem takes the
    Russian (and English) inflections: "курс\\w*" matches курс, курса, курсы, курсов.
    """
    gap = r"[\s,]+"
    body = "|".join("(?:" + a.replace(" ", gap) + ")" for a in alternatives)
    return re.compile(rf"(?<!\w)(?:{body})(?!\w)")
