"""The order service's write path with a plain psycopg 3 connection: no ORM, no framework.

The order and its ``OrderPlaced`` message are written in one transaction: ``commit()`` makes
both exist, an exception (``with psycopg.connect(...)`` rolls back on the way out) makes
neither. Run it (the outbox tables must exist: ``outbox migrate upgrade``)::

    OUTBOX_DATABASE_URL=postgresql://app@127.0.0.1:5432/app python examples/psycopg_orders.py A-1
"""

from __future__ import annotations

import os
import sys
import uuid

import psycopg

from outbox import publish

SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (
    id       varchar(40) PRIMARY KEY,
    item     varchar(100) NOT NULL,
    quantity integer NOT NULL
)
"""


class Rejected(Exception):
    """A check after the writes failed: the transaction rolls back."""


def place_order(
    url: str, order_id: str, item: str, quantity: int, *, fail: bool = False
) -> uuid.UUID:
    """Write the order and publish ``OrderPlaced`` in one transaction; the message's id."""
    with psycopg.connect(url) as conn:  # autocommit off: the first statement opens a transaction
        conn.execute(
            "INSERT INTO orders (id, item, quantity) VALUES (%s, %s, %s)",
            (order_id, item, quantity),
        )
        message_id = publish(
            conn,
            topic="orders",
            key=order_id,
            payload={
                "event": "OrderPlaced",
                "order_id": order_id,
                "item": item,
                "quantity": quantity,
            },
            headers={"type": "OrderPlaced"},
        )
        if fail:
            raise Rejected(f"order {order_id} rejected after publishing: nothing was written")
        conn.commit()
    return message_id


def create_tables(url: str) -> None:
    with psycopg.connect(url) as conn:
        conn.execute(SCHEMA)
        conn.commit()


if __name__ == "__main__":
    database_url = os.environ["OUTBOX_DATABASE_URL"]
    create_tables(database_url)
    print(place_order(database_url, sys.argv[1] if len(sys.argv) > 1 else "A-1", "book", 2))
