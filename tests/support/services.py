"""The one place a test says a service it needs is missing.

Locally a missing service skips the test, with how to start it. Under CI (``CI=true``) or with
``OUTBOX_REQUIRE_SERVICES=1`` (``.ci/run`` sets it) it FAILS the test instead, naming the
service and how to start it, so a run with a broker down cannot pass by testing nothing of it.
Skips for a feature a broker does not have (no dedup, nothing to disconnect) are not this: they
stay skips everywhere.
"""

from __future__ import annotations

import importlib
import os
import socket
import warnings
from types import ModuleType
from typing import NoReturn

import pytest

__all__ = ["import_or_missing", "missing", "require_port", "services_required"]


def services_required() -> bool:
    """True under CI or OUTBOX_REQUIRE_SERVICES=1: a missing service fails the test."""
    return (
        os.environ.get("CI", "").lower() in ("1", "true", "yes")
        or os.environ.get("OUTBOX_REQUIRE_SERVICES", "") == "1"
    )


def missing(service: str, how: str) -> NoReturn:
    """Skip (locally) or fail (CI) a test because ``service`` is not there; ``how`` says what
    to do about it."""
    message = f"{service} is not available: {how}"
    if services_required():
        pytest.fail(
            f"{message}. This run requires every service (CI=true or OUTBOX_REQUIRE_SERVICES=1): "
            "`bash .ci/run` starts the local ones",
            pytrace=False,
        )
    pytest.skip(message)


def reachable(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex((host, port)) == 0


def require_port(port: int, service: str, how: str | None = None) -> None:
    """The test needs ``service`` listening on 127.0.0.1:``port``."""
    if not reachable(port):
        missing(service, how or f"nothing listens on 127.0.0.1:{port}; start {service}")


def import_or_missing(module: str, extra: str) -> ModuleType:
    """Import ``module`` or report it missing with the pip extra that installs it."""
    try:
        with warnings.catch_warnings():  # as pytest.importorskip: a package's import-time
            warnings.simplefilter("ignore")  # warnings (e.g. platformdirs') are not the test's
            return importlib.import_module(module)
    except ImportError:
        missing(module, f"pip install 'outbox-inbox[{extra}]'")
