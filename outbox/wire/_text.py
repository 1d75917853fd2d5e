"""Header values as text, whatever type a broker client hands them back as."""

from __future__ import annotations

__all__ = ["text"]


def text(value: object) -> str:
    """UTF-8 text of ``value`` (bytes from RabbitMQ tables, Kafka and Redis; str elsewhere)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8")
    return str(value)
