"""chunking.join_chunks: consecutive chunks read as one text, the overlap once."""

from __future__ import annotations

import pytest

from services.docstore.chunking import join_chunks


@pytest.mark.parametrize(
    ("texts", "joined"),
    [
        ((), ""),
        (("Only one.",), "Only one."),
        # The chunker repeats whole trailing sentences: the text goes on after them.
        (("Backups run nightly. They take an hour.", "They take an hour. Restore with tar."),
         "Backups run nightly. They take an hour. Restore with tar."),
        # A token-count cut inside a sentence (at least 12 characters shared) is overlap too.
        (("Run it to update the chroot and build the packages:",
          "update the chroot and build the packages:\n\n$ sudo pbuilder --update"),
         "Run it to update the chroot and build the packages:\n\n$ sudo pbuilder --update"),
        # No overlap (another section, or a word both happen to share): the joiner goes between.
        (("Read more in the manual", "manual pages for details."),
         "Read more in the manual\n\nmanual pages for details."),
        (("First section.", "Second section."), "First section.\n\nSecond section."),
    ],
)  # fmt: skip
def test_join_chunks(texts: tuple[str, ...], joined: str) -> None:
    assert join_chunks(texts) == joined


def test_a_chunk_wholly_inside_the_overlap_adds_nothing_and_the_joiner_is_the_callers() -> None:
    assert (
        join_chunks(["A long sentence here.", "A long sentence here."]) == "A long sentence here."
    )
    assert join_chunks(["One.", "Two."], joiner=" | ") == "One. | Two."
