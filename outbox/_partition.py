"""The key -> partition hash, defined once for the relay (which writes to partitioned
destinations) and the consumers (which own partitions).

``partition_for(key, partitions)`` is the CRC-32 (IEEE 802.3, the checksum of ``zlib.crc32``,
Java's ``java.util.zip.CRC32``, Go's ``crc32.ChecksumIEEE``) of the key's UTF-8 bytes, as an
unsigned 32-bit number, modulo ``partitions``. Any language computes it in one line, so a
consumer written in another language finds the same partition for a key as the relay does.
"""

from __future__ import annotations

import zlib

from outbox.exceptions import ConfigurationError

__all__ = ["MAX_PARTITIONS", "check_partitions", "partition_for"]

#: the most partitions a topic may be split into
MAX_PARTITIONS = 1024


def check_partitions(partitions: object, what: str = "partitions") -> int:
    """``partitions`` when it is an int in 1..MAX_PARTITIONS; else ConfigurationError."""
    if isinstance(partitions, bool) or not isinstance(partitions, int):
        raise ConfigurationError(
            f"{what} must be a whole number 1..{MAX_PARTITIONS}, not {partitions!r}"
        )
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise ConfigurationError(f"{what} must be 1..{MAX_PARTITIONS}, not {partitions}")
    return partitions


def partition_for(key: str, partitions: int) -> int:
    """The partition (0 .. ``partitions`` - 1) of a message key: the CRC-32 of the key's UTF-8
    bytes modulo ``partitions``. The relay and every consumer use this one function.

    >>> partition_for("customer-42", 8)
    5
    """
    if not isinstance(key, str):
        raise ConfigurationError(f"a message key is text, not {type(key).__name__}")
    return zlib.crc32(key.encode("utf-8")) % check_partitions(partitions)
