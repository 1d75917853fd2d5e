"""``outbox relay check``: load the config, reach the database and the broker, and say per topic
where the relay would publish and whether that destination exists. It publishes nothing.

The topics are the ones with unpublished rows in the outbox, the ones the config names
(``[topics.NAME]``, ``[broker.destinations]``) and any given with ``--topic``. A destination
is looked up with the adapter's ``check_destination`` (NATS: the stream whose subjects cover
the subject; RabbitMQ: the exchange or queue; Kafka: the topic; SQS/SNS: the queue or topic);
adapters without one (Redis, MQTT, AMQP 1.0, the sinks) accept any destination the first time
a message goes there, and the line says it was not checked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row

from outbox.exceptions import ConfigurationError
from outbox.kit import connect_failure, describe_database_error, redact
from relay._config import RelayConfig
from relay._statements import relay_statements
from relay.brokers.base import WILDCARD, Destinations, Publisher

__all__ = ["CheckReport", "check_relay"]

_BOUND = 10.0


@dataclass
class CheckReport:
    """Lines to print, and whether everything was found."""

    lines: list[str] = field(default_factory=list)
    ok: bool = True

    def say(self, line: str, *, ok: bool = True) -> None:
        self.lines.append(" ".join(redact(line).split()))
        self.ok = self.ok and ok


async def check_relay(
    config: RelayConfig,
    make_publisher: Callable[[RelayConfig], Publisher],
    *,
    extra_topics: Iterable[str] = (),
) -> CheckReport:
    report = CheckReport()
    topics = await _database(config, report)
    if topics is None:
        return report
    topics |= {t for t in config.topics} | {t for t in config.destinations if t != WILDCARD}
    topics |= {t for t in config.partitions if t != WILDCARD}
    topics |= set(extra_topics)
    if config.claim_check is not None:
        from relay._claimcheck_config import build_claim_check, check_store

        ok, line = await check_store(build_claim_check(config.claim_check), _BOUND)
        report.say(line, ok=ok)
    await _broker(config, make_publisher, sorted(topics), report)
    return report


async def _database(config: RelayConfig, report: CheckReport) -> set[str] | None:
    where = f"database {redact(config.database_url)}"
    stmts = relay_statements(config.schema)
    try:
        async with asyncio.timeout(_BOUND):
            conn = await psycopg.AsyncConnection.connect(config.database_url, autocommit=True)
    except (psycopg.Error, TimeoutError) as exc:
        reason = (
            describe_database_error(exc)
            if isinstance(exc, psycopg.Error) and connect_failure(exc) is not None
            else (str(exc) or f"no answer within {_BOUND:g}s")
        )
        report.say(f"{where}: FAILED: {reason}", ok=False)
        return None
    async with conn:
        cur = conn.cursor(row_factory=dict_row)
        present = await (await cur.execute(stmts.tables_present)).fetchone()
        if not (present and present["tables"] and present["leases"]):
            schema = f" in schema {config.schema}" if config.schema else ""
            report.say(
                f"{where}: FAILED: the outbox tables{schema} do not exist or are too old: run "
                "`outbox migrate upgrade`",
                ok=False,
            )
            return None
        rows = await (await cur.execute(stmts.status_topics)).fetchall()
    report.say(f"{where}: ok, {len(rows)} topic(s) with unpublished messages")
    return {row["topic"] for row in rows}


async def _broker(
    config: RelayConfig,
    make_publisher: Callable[[RelayConfig], Publisher],
    topics: list[str],
    report: CheckReport,
) -> None:
    from relay._broker_config import scheme_of

    url = config.broker_url or ""
    where = f"broker {redact(url)}"
    options = dict(config.broker_options)
    created: tuple[str, list[str]] | None = None  # a stream the relay would create at start
    if scheme_of(url) == "nats" and options.get("create_stream") and options.get("stream"):
        options["create_stream"] = False  # the check changes nothing on the broker
    # the broker's own adapter (its check_destination), without the claim check's wrapper
    config = _replace(config, claim_check=None)
    publisher = make_publisher(_replace(config, broker_options=options))
    try:
        try:
            await asyncio.wait_for(publisher.start(), _BOUND * 2)
        except ConfigurationError as exc:  # NATS: the configured stream does not exist
            if not config.broker_options.get("create_stream"):
                report.say(f"{where}: FAILED: {exc}", ok=False)
                return
            stream = str(options["stream"])
            subjects = list(options.get("stream_subjects") or [f"{stream}.>"])
            created = (stream, subjects)
            report.say(
                f"{where}: ok; stream {stream} does not exist yet: the relay creates it at "
                f"start (subjects {', '.join(subjects)})"
            )
            options.pop("stream")
            options.pop("create_stream")
            publisher = make_publisher(_replace(config, broker_options=options))
            await asyncio.wait_for(publisher.start(), _BOUND * 2)
        else:
            report.say(f"{where}: ok, connected")
    except Exception as exc:
        report.say(f"{where}: FAILED: {_reason(exc)}", ok=False)
        return
    try:
        destination = Destinations(config.destinations, partitions=config.partitions)
        probe = getattr(publisher, "check_destination", None)
        if not topics:
            report.say("no topics to check: none has unpublished messages or is configured")
        for dest, head in _places(destination, topics):
            if probe is None:
                report.say(f"{head}: not checked (the broker takes any destination)")
                continue
            try:
                found = await asyncio.wait_for(probe(dest), _BOUND)
            except Exception as exc:
                if created is not None and any(_covers(s, dest) for s in created[1]):
                    report.say(f"{head}: ok, stream {created[0]} (created at start)")
                else:
                    report.say(f"{head}: MISSING: {_reason(exc)}", ok=False)
                continue
            report.say(f"{head}: ok, {found}")
    finally:
        try:
            await asyncio.wait_for(publisher.close(), _BOUND)
        except Exception as exc:  # the verdict stands; say why closing failed
            report.say(f"{where}: closing the connection failed: {_reason(exc)}")


def _places(destination: Destinations, topics: Iterable[str]) -> list[tuple[str, str]]:
    """(destination, what the report calls it) of every destination to check: one per topic,
    or one per partition of a partitioned topic."""
    places = []
    for topic in topics:
        count = destination.partitions_of(topic)
        if count is None:
            dest = destination(topic)
            places.append((dest, f"topic {topic} -> {dest}"))
            continue
        for partition in range(count):
            dest = destination.partition(topic, partition)
            places.append((dest, f"topic {topic} partition {partition}/{count} -> {dest}"))
    return places


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer within {_BOUND:g}s"
    return str(exc) or type(exc).__name__


def _replace(config: RelayConfig, **changes: Any) -> RelayConfig:
    import dataclasses

    return dataclasses.replace(config, **changes)


def _covers(pattern: str, subject: str) -> bool:
    """A NATS subject pattern (``*`` one token, ``>`` the rest) matches ``subject``."""
    want, have = pattern.split("."), subject.split(".")
    for i, part in enumerate(want):
        if part == ">":
            return len(have) > i
        if i >= len(have) or part not in ("*", have[i]):
            return False
    return len(want) == len(have)
