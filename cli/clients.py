"""Subcommands contributed by this package (see ``cli.main``)."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: argparse._SubParsersAction[Any], perf: argparse._SubParsersAction[Any]) -> None:
    """No subcommands yet."""
