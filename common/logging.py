"""structlog, configured in one place.

JSON lines when stderr is not a TTY (files, pipes, containers), readable
console output on a TTY. Every process calls ``configure`` once with its role
and node id, which are bound to every event it logs.

Records of the standard ``logging`` module (aiohttp's ``aiohttp.server``
"Error handling request", asyncio, any other library) go through the same
renderer: one JSON line each, the logger's name under ``logger`` and a
traceback inside the object (``exception``), never raw lines in a JSON log.
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
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(log_level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    _route_stdlib_logging(shared, renderer, log_level)
    structlog.contextvars.clear_contextvars()
    bound: dict[str, Any] = {"role": role}
    if node_id is not None:
        bound["node_id"] = node_id
    structlog.contextvars.bind_contextvars(**bound)


def get_logger(name: str | None = None) -> Any:
    return structlog.get_logger(name) if name else structlog.get_logger()


class _StderrHandler(logging.Handler):
    """Writes formatted records to the current ``sys.stderr``, as logging's last-resort handler (which wrote
    library records before this one was installed) does: a stream replaced since is never written to."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            stream = sys.stderr
            stream.write(text + "\n")
            stream.flush()
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)


def _route_stdlib_logging(shared: list[Any], renderer: Any, log_level: int) -> None:
    """Render standard-library log records like our own events: one line each (JSON when ``renderer`` is).

    Replaces the handler an earlier ``configure`` installed; other handlers of the root logger (pytest's,
    an embedding application's) are left alone. The root logger's level is not changed: libraries still log
    warnings and up unless they were set otherwise, as before, and ``level`` filters further."""
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, renderer],
    )
    handler = _StderrHandler(log_level)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
