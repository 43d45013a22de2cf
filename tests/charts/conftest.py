"""Fixtures of the chart's tests: ``helm`` is shared (tests/conftest.py)."""
