"""structlog, configured in one place.

JSON lines when stderr is not a TTY (files, pipes, containers), readable
console output on a TTY. Every process calls ``configure`` once with its role
and node id, which are bound to every event it logs. Code used as a library
(the client, from plain Python) logs through the standard ``logging`` module
until structlog is configured: never on stdout (see ``get_logger``).

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
    """A logger for ``name`` (a module's ``__name__``). Once structlog is configured (``configure`` in our
    processes, or an embedding application's own ``structlog.configure``) it is structlog's, as configured.
    Until then (the client library used from plain Python) events go to the standard ``logging`` module
    under ``name``, as a library's should: shown by the application's handlers when it set logging up, else
    by ``logging``'s last resort, warnings and up on stderr. Never structlog's unconfigured default, which
    prints every event, info too, on stdout (where a program's own output goes)."""
    return _Logger(name)


class _Logger:
    """Picks, at each call, structlog's configured logger or the standard-library fallback (see get_logger)."""

    __slots__ = ("_fallback", "_name")

    def __init__(self, name: str | None) -> None:
        self._name = name
        self._fallback: _StdlibLogger | None = None

    def _target(self) -> Any:
        if structlog.is_configured():
            return structlog.get_logger(self._name) if self._name else structlog.get_logger()
        if self._fallback is None:
            self._fallback = _StdlibLogger(logging.getLogger(self._name or "minibroker"), {})
        return self._fallback

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._target(), attr)


class _StdlibLogger:
    """structlog's logging methods over a standard-library logger: ``event key=value ...`` messages (the
    handlers add level and time when the application set them up), tracebacks by ``logging`` itself."""

    __slots__ = ("_context", "_logger")

    def __init__(self, logger: logging.Logger, context: dict[str, Any]) -> None:
        self._logger = logger
        self._context = context

    def bind(self, **kw: Any) -> _StdlibLogger:
        return _StdlibLogger(self._logger, {**self._context, **kw})

    def new(self, **kw: Any) -> _StdlibLogger:
        return _StdlibLogger(self._logger, dict(kw))

    def log(self, level: int, event: object = "", *, exc_info: Any = None, **kw: Any) -> None:
        if not self._logger.isEnabledFor(level):
            return
        fields = {**self._context, **kw}
        text = " ".join([str(event), *(f"{k}={v!r}" for k, v in fields.items())])
        self._logger.log(level, "%s", text, exc_info=exc_info)

    def debug(self, event: object = "", **kw: Any) -> None:
        self.log(logging.DEBUG, event, **kw)

    def info(self, event: object = "", **kw: Any) -> None:
        self.log(logging.INFO, event, **kw)

    def warning(self, event: object = "", **kw: Any) -> None:
        self.log(logging.WARNING, event, **kw)

    warn = warning

    def error(self, event: object = "", **kw: Any) -> None:
        self.log(logging.ERROR, event, **kw)

    def critical(self, event: object = "", **kw: Any) -> None:
        self.log(logging.CRITICAL, event, **kw)

    fatal = critical

    def exception(self, event: object = "", **kw: Any) -> None:
        kw.setdefault("exc_info", True)
        self.log(logging.ERROR, event, **kw)


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
