"""Optional dependencies: imported only by the objects that need them.

Each extra of the package (``nats``, ``console``, ``spark``, ...) brings libraries that only
some objects use. Nothing imports them at module level: an object imports its library when it
is first used, through :func:`require`, whose error names the extra to install.
:func:`loaded_class` answers "is this object an instance of that library's class?" without
importing the library: when the library was never imported, no object of it can exist.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any

from outbox.exceptions import MissingDependencyError

__all__ = ["loaded_class", "require"]


def require(module: str, extra: str) -> ModuleType:
    """``importlib.import_module(module)``, or a MissingDependencyError naming ``extra``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"this needs the Python package providing {module!r}, which is not installed: "
            f'pip install "outbox-inbox[{extra}]"',
            module=module,
            extra=extra,
        ) from exc


def loaded_class(module: str, name: str) -> Any:
    """The class ``module.name`` if ``module`` is already imported, else None (not importing it).

    Typed ``Any`` so that ``isinstance(x, loaded_class(...))`` leaves ``x`` usable as that class.
    """
    loaded = sys.modules.get(module)
    found = getattr(loaded, name, None) if loaded is not None else None
    return found if isinstance(found, type) else None
