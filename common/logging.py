"""structlog, configured in one place.

JSON lines when stderr is not a TTY (files, pipes, containers), readable
console output on a TTY. Every process calls ``configure`` once with its role
and node id, which are bound to every event it logs.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import structlog


def configure(role: str, node_id: int | str | None = None, *, level: str | None = None,
              json: bool | None = None) -> None:
    level_name = (level or os.environ.get("MINIBROKER_LOG_LEVEL", "INFO")).upper()
    log_level = logging.getLevelNamesMapping().get(level_name, logging.INFO)
    use_json = (not sys.stderr.isatty()) if json is None else json
    renderer: Any = structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(log_level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.clear_contextvars()
    bound: dict[str, Any] = {"role": role}
    if node_id is not None:
        bound["node_id"] = node_id
    structlog.contextvars.bind_contextvars(**bound)


def get_logger(name: str | None = None) -> Any:
    return structlog.get_logger(name) if name else structlog.get_logger()
