"""What every wire decoder shares: header values as text, bounded header lists, and the rule
that a decoder raises :class:`~outbox.exceptions.InvalidMessageError` and nothing else."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable
from typing import ParamSpec, TypeVar

from outbox._limits import MAX_HEADER_VALUE_BYTES, MAX_RECEIVED_HEADERS
from outbox.exceptions import InvalidMessageError

__all__ = ["bounded", "text", "total"]

P = ParamSpec("P")
R = TypeVar("R")


def text(value: object) -> str:
    """UTF-8 text of ``value`` (bytes from RabbitMQ tables, Kafka and Redis; str elsewhere;
    numbers and nested tables from RabbitMQ as ``str()`` of them)."""
    if value.__class__ is str:
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        if len(value) > MAX_HEADER_VALUE_BYTES:  # refused before it is decoded
            raise InvalidMessageError(
                f"broker message has a header of {len(value)} bytes, above the maximum of "
                f"{MAX_HEADER_VALUE_BYTES}",
                reason="bad_header",
            )
        return bytes(value).decode("utf-8")  # total() turns an error into not_utf8
    return str(value)


def bounded(pairs: Iterable[tuple[str, R]]) -> list[tuple[str, R]]:
    """At most :data:`MAX_RECEIVED_HEADERS` header pairs, read lazily: a longer list is refused
    before the rest of it is looked at."""
    taken = list(itertools.islice(pairs, MAX_RECEIVED_HEADERS + 1))
    if len(taken) > MAX_RECEIVED_HEADERS:
        raise InvalidMessageError(
            f"broker message has more than {MAX_RECEIVED_HEADERS} headers: it was not "
            "published by the outbox relay",
            reason="too_many_headers",
        )
    return taken


def total(decode: Callable[P, R]) -> Callable[P, R]:
    """``decode``, raising only :class:`InvalidMessageError` for malformed input: bytes that are
    not UTF-8, and a structure that is not what the broker's client hands over (a header that
    is not a pair, a field of the wrong type), become one with a ``reason``."""

    @functools.wraps(decode)
    def decoded(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return decode(*args, **kwargs)
        except InvalidMessageError:
            raise
        except UnicodeError as exc:
            raise InvalidMessageError(
                "broker message has a header or field that is not UTF-8 text: "
                f"{getattr(exc, 'reason', exc)}",
                reason="not_utf8",
            ) from exc
        except (TypeError, ValueError, AttributeError, KeyError, IndexError, RecursionError,
                OverflowError) as exc:  # fmt: skip
            raise InvalidMessageError(
                f"broker message is not shaped like an outbox message ({type(exc).__name__})",
                reason="bad_format",
            ) from exc

    return decoded
