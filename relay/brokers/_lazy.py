"""Import a broker SDK on first use, with an error that names the pip extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType

from outbox.exceptions import ConfigurationError

__all__ = ["MissingDependencyError", "require"]


class MissingDependencyError(ConfigurationError, ImportError):
    """A broker SDK is not installed: install the package's extra for that broker."""


def require(module: str, extra: str) -> ModuleType:
    """``importlib.import_module(module)``, or a MissingDependencyError naming ``extra``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"the {extra} adapter needs the Python package providing {module!r}: "
            f'pip install "outbox-inbox[{extra}]"',
            module=module,
            extra=extra,
        ) from exc
