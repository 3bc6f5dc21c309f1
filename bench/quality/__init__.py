"""Retrieval-quality gold set and harness."""
