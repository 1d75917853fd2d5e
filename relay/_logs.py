"""Structured logs with the stdlib: one JSON object per line, or plain text."""

from __future__ import annotations

import contextvars
import json
import logging
import time
from typing import Any

from outbox.kit import install_log_redaction

__all__ = ["DATABASE", "JsonFormatter", "configure_logging", "name_the_database"]

#: the configured name of the database the current task works for (a relay serving several,
#: relay/_fleet.py): every log line made in its tasks names it (``database`` in JSON, the
#: logger's name followed by ``[name]`` in text)
DATABASE: contextvars.ContextVar[str | None] = contextvars.ContextVar("database", default=None)

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "where"}
_installed = False


def name_the_database() -> None:
    """Put the current task's database (:data:`DATABASE`) on every log record from now on.

    A record factory rather than a handler's filter: the records reach every handler with it
    (pytest's too), made in the task that logged them."""
    global _installed
    if _installed:
        return
    _installed = True
    make = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        name = DATABASE.get()
        record.where = f"[{name}]" if name else ""
        if name:
            record.database = name
        return record

    logging.setLogRecordFactory(factory)


class _TextFormatter(logging.Formatter):
    """``time LEVEL logger[database]: message``; records made before the factory have no
    ``where``."""

    def format(self, record: logging.LogRecord) -> str:
        if not hasattr(record, "where"):
            record.where = ""
        return super().format(record)


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "msg", ...extra fields}`` per record."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:  # formatted (and masked) by the RedactingFilter
            out["exc"] = record.exc_text
        return json.dumps(out, default=str)


def configure_logging(level: str = "info", fmt: str = "text") -> None:
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            _TextFormatter("%(asctime)s %(levelname)s %(name)s%(where)s: %(message)s")
        )
    install_log_redaction(handler)  # every record, a library's too, with secrets masked
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
