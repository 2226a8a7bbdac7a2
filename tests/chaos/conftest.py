"""CLI commands run in-process here: every test resets structlog afterwards."""

import pytest


@pytest.fixture(autouse=True)
def _reset_structlog(reset_structlog: None) -> None:
    """Uses the shared ``reset_structlog`` fixture for every test in this folder."""
