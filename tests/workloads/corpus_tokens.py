"""Token counts of the `bytes4` tokenizer, for the tests of the corpus's converters: what the importer counts for a
text when the tests pass `tokenizer="bytes4"`."""

from __future__ import annotations


def b4(text: str) -> int:
    """The text's UTF-8 bytes over four, rounded up."""
    return -(-len(text.encode()) // 4)
