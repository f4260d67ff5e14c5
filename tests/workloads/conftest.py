"""Fixtures of the corpus's tests (tests/workloads/test_corpus_*.py)."""

from __future__ import annotations

import pytest

from tests.scripts import load_script


@pytest.fixture(scope="module")
def build_corpus():
    """scripts/build_corpus.py as a module (with its sources' table and converters), loaded once per test module."""
    return load_script("build_corpus")
