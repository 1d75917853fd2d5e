"""Commands suggested to an operator, safe to paste into a POSIX shell.

``outbox trace``, its ``--json``, the console's journey page and the inbox's hints print
commands with values from the database in them (keys, topics, consumer names, URLs), which
whoever writes a message or names a consumer chooses. Each argument is quoted on its own: a
plain one with :func:`shlex.quote`; one holding a control, format (bidi) or other unprintable
character as bash's ANSI-C quoting ``$'...'`` with that character escaped, so the printed line
shows no raw escape sequence, carriage return or direction override, and running it as printed
passes exactly the original arguments (tests/unit/test_shell_quote.py runs them in bash).
"""

from __future__ import annotations

import shlex
import unicodedata
from collections.abc import Iterable

__all__ = ["shell_line", "shell_quote"]


def _plain(ch: str) -> bool:
    """Printable and not a format character (U+202E and the other bidi controls are Cf)."""
    return ch.isprintable() and unicodedata.category(ch) != "Cf"


def shell_quote(arg: str) -> str:
    """``arg`` as one shell word that bash reads back exactly, in printable characters."""
    if all(_plain(ch) for ch in arg):
        return shlex.quote(arg)
    out = []
    for ch in arg:
        if ch == "\\" or ch == "'":
            out.append("\\" + ch)
        elif _plain(ch):
            out.append(ch)
        else:  # its UTF-8 bytes: bash reads \u by the locale, \x as is
            out.extend(f"\\x{b:02x}" for b in ch.encode("utf-8", "surrogateescape"))
    return "$'" + "".join(out) + "'"


def shell_line(args: Iterable[str]) -> str:
    """A command line of ``args``, each quoted by :func:`shell_quote`."""
    return " ".join(shell_quote(a) for a in args)
