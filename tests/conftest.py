"""Shared fixtures. Integration helpers for real processes live in tests/procs.py."""
