"""What the packages built on outbox use of it: the relay, the inbox, the reconciliation,
the console, and a broker plug-in from outside this repository.

outbox's modules are private (``outbox._*``); a package above it takes what it needs from here
and from outbox's public modules (:mod:`outbox`, :mod:`outbox.envelope`, :mod:`outbox.wire`,
:mod:`outbox.schema`, :mod:`outbox.exceptions`, :mod:`outbox.amqp1_reactor`), never from a
private module (a unit test, ``tests/unit/test_layers.py``, fails on such an import).
The names are grouped by what they do:

* SQL: ``load``, ``registry``, ``templates``, ``Names``, ``qualified``, ``table_name`` (one
  ``statements.sql`` a package, rendered once per schema: ``outbox/_sql.py``);
* connections: ``Database``, ``connected``, ``Target``, ``AsyncTarget``, ``AsyncRaw``,
  ``resolve_sync``, ``resolve_async``, ``AsyncpgConnection``; rows read by name from a
  cursor that gives tuples (``rows_by_name``, ``row_by_name``);
* settings: ``read_toml``, ``parse_env``, ``check_keys``, ``check_value``, ``env_secret``,
  ``file_secret``; the reconciliation job file's keys (``JOB_TOP_KEYS``, ``JOB_SOURCE_KEYS``),
  which the job and ``outbox trace`` both check;
* secrets and errors: ``redact``, ``remember_secrets``, ``secrets_in``, ``install_log_redaction``,
  ``redact_library_logs``, ``one_line``, ``translate``, ``connect_failure``,
  ``describe_cli_error``, ``describe_database_error``, ``schema_not_installed``;
* optional dependencies: ``require``, ``loaded_class``, ``NoopMetric``;
* partitioned destinations: ``partition_for`` (the key -> partition hash, also public as
  ``outbox.partition_for``), ``check_partitions``, ``MAX_PARTITIONS``;
* the limits every broker side holds to (``MAX_*``, ``DEFAULT_MAX_RECEIVE_BYTES``) and
  ``check_text``;
* WAL capture's records (``MODE_WAL``, ``PREFIX``, ``WalRecord``, ``decode_record``,
  ``RecordError``), the relays' wake-up (``WAKEUP_CHANNEL``, ``doorbell_for``,
  ``ring_after_commit``), ``redrive_statements`` and ``default_actor`` (who an audit row names).
"""

from __future__ import annotations

from outbox._actor import default_actor
from outbox._asyncpg import AsyncpgConnection
from outbox._capture import MODE_WAL, PREFIX, RecordError, WalRecord, decode_record
from outbox._config import (
    JOB_SOURCE_KEYS,
    JOB_TOP_KEYS,
    check_keys,
    check_value,
    env_secret,
    file_secret,
    parse_env,
    read_toml,
    value_error,
)
from outbox._connections import AsyncRaw, AsyncTarget, Target, resolve_async, resolve_sync
from outbox._database import Database, connected, row_by_name, rows_by_name
from outbox._dburl import ACCEPTED, libpq_url, url_source
from outbox._errors import (
    connect_failure,
    describe_cli_error,
    describe_database_error,
    one_line,
    schema_not_installed,
    translate,
)
from outbox._limits import (
    DEFAULT_MAX_RECEIVE_BYTES,
    MAX_HEADER_NAME_BYTES,
    MAX_HEADER_VALUE_BYTES,
    MAX_KEY_BYTES,
    MAX_RECEIVED_HEADERS,
    MAX_TOPIC_BYTES,
)
from outbox._message import check_text
from outbox._noop_metric import NoopMetric
from outbox._optional import loaded_class, require
from outbox._partition import MAX_PARTITIONS, check_partitions, partition_for
from outbox._redact import (
    install_log_redaction,
    redact,
    redact_library_logs,
    remember_secrets,
    secrets_in,
)
from outbox._sql import Names, load, qualified, registry, table_name, templates
from outbox._statements import WAKEUP_CHANNEL, redrive_statements
from outbox._topic import topic_problem
from outbox._wakeup import doorbell_for, ring_after_commit

__all__ = [
    "ACCEPTED",
    "DEFAULT_MAX_RECEIVE_BYTES",
    "JOB_SOURCE_KEYS",
    "JOB_TOP_KEYS",
    "MAX_HEADER_NAME_BYTES",
    "MAX_HEADER_VALUE_BYTES",
    "MAX_KEY_BYTES",
    "MAX_PARTITIONS",
    "MAX_RECEIVED_HEADERS",
    "MAX_TOPIC_BYTES",
    "MODE_WAL",
    "PREFIX",
    "WAKEUP_CHANNEL",
    "AsyncRaw",
    "AsyncTarget",
    "AsyncpgConnection",
    "Database",
    "Names",
    "NoopMetric",
    "RecordError",
    "Target",
    "WalRecord",
    "check_keys",
    "check_partitions",
    "check_text",
    "check_value",
    "connect_failure",
    "connected",
    "decode_record",
    "default_actor",
    "describe_cli_error",
    "describe_database_error",
    "doorbell_for",
    "env_secret",
    "file_secret",
    "install_log_redaction",
    "libpq_url",
    "load",
    "loaded_class",
    "one_line",
    "parse_env",
    "partition_for",
    "qualified",
    "read_toml",
    "redact",
    "redact_library_logs",
    "redrive_statements",
    "registry",
    "remember_secrets",
    "require",
    "resolve_async",
    "resolve_sync",
    "ring_after_commit",
    "row_by_name",
    "rows_by_name",
    "schema_not_installed",
    "secrets_in",
    "table_name",
    "templates",
    "topic_problem",
    "translate",
    "url_source",
    "value_error",
]
