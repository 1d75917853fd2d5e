"""One way to read a settings file: TOML in, errors that name the file, the key and what fits.

The relay (``relay.toml``) and the reconciliation job (its job file) read their files through
these helpers, so both say a problem the same way:

* a file that cannot be read, or is not TOML: :func:`read_toml`, naming the file;
* a key nobody knows: :func:`check_keys`, naming the key, where it is (the file and the table),
  the closest known key and every known one;
* a value of the wrong type or range: :func:`check_value` / :func:`value_error`, ``KEY must be
  WHAT IT ACCEPTS, got VALUE``;
* a value from the environment: :func:`parse_env` turns the text into the setting's type;
  :func:`env_secret` and :func:`file_secret` read a password and give it to the redactor
  (:func:`outbox._redact.remember_secrets`), so no later log line or error shows it.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from outbox._redact import redact, remember_secrets
from outbox.exceptions import ConfigurationError

__all__ = [
    "JOB_SOURCE_KEYS",
    "JOB_TOP_KEYS",
    "check_keys",
    "check_value",
    "env_secret",
    "file_secret",
    "parse_env",
    "read_toml",
    "value_error",
]

_TRUE = ("1", "true", "yes")
_FALSE = ("0", "false", "no")


#: the keys of a reconciliation job file, at its top and in its source tables ([outbox],
#: [[inbox]]): the job (spark_ingest) and ``outbox trace --job-file`` refuse any other
JOB_TOP_KEYS = ("outbox", "inbox", "subscriptions", "sla", "thresholds", "rows_per_partition")
JOB_SOURCE_KEYS = (
    "name",
    "url",
    "user",
    "password_env",
    "password_file",
    "schema",
    "max_connections",
    "sslpassword_env",
)


def read_toml(path: str | Path, *, kind: str) -> dict[str, Any]:
    """The TOML document in ``path``; ``kind`` ("config file", "job file") leads the errors."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"cannot read {kind} {path}: {exc}", path=str(path)) from exc
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"{kind} {path} is not valid TOML: {exc}", path=str(path)) from exc


def check_keys(
    table: Iterable[str], known: Iterable[str], where: str, *, what: str = "key"
) -> None:
    """Refuse a key of ``table`` not in ``known``: the error names it (the first, if several),
    the closest known one, ``where`` it is, and every known key."""
    known = list(known)
    unknown = [key for key in table if key not in known]
    if not unknown:
        return
    key = unknown[0]
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    others = f" (and {', '.join(repr(k) for k in unknown[1:])})" if unknown[1:] else ""
    raise ConfigurationError(
        f"{where}: unknown {what} {key!r}{hint}{others}; known: {', '.join(known)}",
        key=key,
        unknown=unknown,
    )


def value_error(
    key: str, value: object, accepts: str, *, where: str | None = None, **context: Any
) -> ConfigurationError:
    """``[where: ]KEY must be ACCEPTS, got VALUE`` (a secret in the value masked)."""
    head = f"{where}: " if where else ""
    shown = redact(value) if isinstance(value, str) else value
    return ConfigurationError(
        f"{head}{key} must be {accepts}, got {shown!r}", key=key, value=value, **context
    )


def check_value(
    key: str, value: object, ok: bool, accepts: str, *, where: str | None = None, **context: Any
) -> None:
    """Raise :func:`value_error` unless ``ok``."""
    if not ok:
        raise value_error(key, value, accepts, where=where, **context)


def parse_env(var: str, raw: str, kind: type, setting: str) -> Any:
    """The text ``raw`` of environment variable ``var`` as a ``kind`` (bool, int, float or str)
    for ``setting``. A bool is 1/0, true/false or yes/no."""
    try:
        if kind is bool:
            if raw.lower() not in (*_TRUE, *_FALSE):
                raise ValueError(raw)
            return raw.lower() in _TRUE
        if kind is int or kind is float:
            return kind(raw)
    except ValueError as exc:
        raise ConfigurationError(
            f"{var}={redact(raw)!r} is not a valid {kind.__name__} for {setting}", setting=setting
        ) from exc
    return raw


def env_secret(var: str, where: str, **context: Any) -> str:
    """The secret in environment variable ``var``, remembered by the redactor."""
    value = os.environ.get(var)
    if value is None:
        raise ConfigurationError(f"{where}: environment variable {var} is not set", **context)
    remember_secrets({"password": value})  # masked if a driver's error quotes it
    return value


def file_secret(path: str, where: str, **context: Any) -> str:
    """The secret in file ``path`` (stripped), remembered by the redactor."""
    try:
        secret = Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigurationError(
            f"{where}: cannot read password file {path}: {exc.strerror}", **context
        ) from exc
    remember_secrets({"password": secret})
    return secret
