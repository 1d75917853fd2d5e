"""The console's message page (``/messages/{id}``) against real databases: an outbox database
and two inbox databases, the message published by the real relay (through a recording adapter)
and applied by the real inbox. The page shows the facts ``outbox trace --json`` gives, with the
inbox URLs' passwords masked and no payload; a malformed look-up is a clear 400; and in a real
browser, the dead-letter listing links to the page."""

from __future__ import annotations

import asyncio
import html
import json
import uuid
from collections.abc import Iterator, Sequence
from html.parser import HTMLParser
from typing import Any

import httpx
import psycopg
import pytest
from click.testing import CliRunner
from psycopg_pool import ConnectionPool

from inbox import HandlerRunner, Outcome
from outbox import publish
from outbox.cli import main
from outbox.envelope import Envelope
from relay import Relay, RelayConfig
from tests.console.console_helpers import TOKEN, screenshot, seed
from tests.support.harness import PgServer
from tests.support.ledger import record
from tests.support.recorder import Recorder

#: a password the inbox URLs carry (the test cluster trusts local connections and ignores it)
PASSWORD = "pw-never-shown-1234"




def _settled(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM outbox_messages WHERE status <> 'pending' OR attempts > 0"
        ).fetchone()
        return int(row[0]) if row else 0


def _relay_once(url: str, wanted: int) -> list[Envelope]:
    """Run the real relay until ``wanted`` rows are no longer pending; what it published."""
    pub = Recorder()
    config = RelayConfig(
        database_url=url, poll_interval=0.05, lease_seconds=5.0, publish_timeout=2.0,
        heartbeat_interval=0.5, shutdown_timeout=3.0, backoff_base=0.05, backoff_max=0.2,
    )  # fmt: skip

    async def go() -> None:
        relay = Relay(config, pub)
        task = asyncio.create_task(relay.run())
        for _ in range(1000):
            if _settled(url) >= wanted:
                break
            await asyncio.sleep(0.02)
        relay.stop()
        await asyncio.wait_for(task, 15)
        assert _settled(url) >= wanted, "the relay did not settle the messages"

    asyncio.run(go())
    return pub.sent


def _consume(url: str, consumer: str, envs: Sequence[Envelope]) -> list[Outcome]:
    with ConnectionPool(url, min_size=1, max_size=2, open=True) as pool:
        runner = HandlerRunner(pool, lambda conn, msg: None, consumer=consumer, ordered=True)
        return [runner.handle(env).outcome for env in envs]


def _with_password(url: str) -> str:
    assert "://postgres@" in url, url
    return url.replace("://postgres@", f"://postgres:{PASSWORD}@", 1)


class _Tables(HTMLParser):
    """The text of every cell of the page's tables, by table id; and each element's text by
    id (tables excepted)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self._table: str | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self._table = dict(attrs).get("id") or ""
            self.tables[self._table] = []
        elif tag == "tr" and self._table is not None:
            self.tables[self._table].append([])
        elif tag in ("td", "th") and self._table is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._table is not None:
            self.tables[self._table][-1].append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def _tables(page: str) -> dict[str, list[list[str]]]:
    parser = _Tables()
    parser.feed(page)
    return parser.tables


def _trace_json(message_id: uuid.UUID, outbox_url: str, *inboxes: str) -> dict[str, Any]:
    args = ["trace", str(message_id), "--url", outbox_url, "--json"]
    for url in inboxes:
        args += ["--inbox", url]
    result = CliRunner().invoke(main, args)
    assert result.exit_code in (0, 1), result.output
    doc: dict[str, Any] = json.loads(result.output)
    return doc


def _assert_same_facts(page: str, doc: dict[str, Any]) -> None:
    """The page shows what ``outbox trace --json`` says, fact by fact."""
    text = html.unescape(page)
    tables = _tables(page)
    assert f"Message {doc['id']}" in text
    assert '<p id="summary"' in page
    assert doc["summary"] in text
    identity = dict((row[0], row[1]) for row in tables["identity"])
    assert (identity["topic"], identity["key"], identity["seq"]) == (
        doc["topic"], doc["key"], str(doc["seq"]),
    )  # fmt: skip
    record = dict((row[0], row[1]) for row in tables["outbox-record"])
    assert record["status"] == doc["outbox"]["status"]
    assert record["attempts"] == str(doc["outbox"]["attempts"])
    assert record["payload"].startswith(f"{doc['outbox']['payload_bytes']} bytes")
    consumers = [row[:5] for row in tables.get("consumers", [])[1:]]
    assert consumers == [
        [r["inbox"], r["consumer"] or "-", r["state"], str(r["attempts"]), str(r["duplicates"])]
        for r in doc["inboxes"]
    ]
    for row, r in zip(tables.get("consumers", [])[1:], doc["inboxes"], strict=True):
        assert (row[7] != "") == (r["since_published"] is not None)
    steps = [row[1:3] for row in tables["timeline"][1:]]
    assert steps == [[s["what"], s["where"]] for s in doc["timeline"]]
    gaps = [row[3] != "" for row in tables["timeline"][1:]]
    assert gaps == [s["after"] is not None for s in doc["timeline"]]
    neighbours = {row[0]: row[1:4] for row in tables["neighbours"][1:]}
    for label, field in (
        ("previous", "previous"),
        ("next", "next"),
        ("waits behind", "blocked_by"),
    ):
        n = doc[field]
        assert neighbours.get(label) == ([str(n["seq"]), n["id"], n["status"]] if n else None)
        if n:
            assert f'href="/messages/{n["id"]}"' in page
    for action in doc["actions"]:
        assert action["why"] in text
        if action["command"]:
            assert action["command"] in text
    if not doc["actions"]:
        assert "Nothing: it is where it should be" in text


@pytest.fixture
def inbox_dbs(pg_server: PgServer, template_db: str) -> Iterator[tuple[str, str]]:
    with (
        pg_server.fresh_database(template=template_db) as billing_url,
        pg_server.fresh_database(template=template_db) as shipping_url,
    ):
        yield billing_url, shipping_url


def test_the_page_shows_what_trace_json_says(
    database_url: str, inbox_dbs: tuple[str, str], console: Any
) -> None:
    billing_url, shipping_url = (_with_password(u) for u in inbox_dbs)
    with psycopg.connect(database_url) as conn:
        a1, a2 = (
            publish(conn, topic="orders", key="A", payload={"secret": f"s-{n}"}, wakeup=False,
                    headers={"tenant": "acme"})
            for n in (1, 2)
        )  # fmt: skip
        dead = publish(conn, topic="orders", key="D", payload=b"relay-poison", wakeup=False)
        conn.commit()
    sent = _relay_once(database_url, 3)
    assert [e.id for e in sent] == [a1, a2]
    assert _consume(billing_url, "billing", sent) == [Outcome.PROCESSED] * 2
    assert _consume(shipping_url, "shipping", sent[:1]) == [Outcome.PROCESSED]

    inboxes = (billing_url, shipping_url)
    with console(database_url, inboxes=inboxes) as base, httpx.Client(base_url=base) as client:
        for message_id, summary in (
            (a2, "published; applied by 1 of 2 consumer(s)"),
            (a1, "published; applied by 2 of 2 consumer(s)"),
            (dead, "dead at the relay after 1 attempt(s)"),
        ):
            doc = _trace_json(message_id, database_url, *inboxes)
            assert doc["summary"] == summary
            page = client.get(f"/messages/{message_id}")
            assert page.status_code == 200, page.text
            _assert_same_facts(page.text, doc)
            assert PASSWORD not in page.text
            assert "s-1" not in page.text
            assert "s-2" not in page.text
            assert "billing" in page.text
            assert "inbox2" in page.text
        # the dead one links to its dead letter (payload, requeue), and its command is there
        assert f'href="/dead/{dead}"' in page.text
        assert f"outbox dead retry --id {dead}" in html.unescape(page.text)

        # the look-ups by topic/key/seq and by id land on the same message
        by_seq = client.get("/messages", params={"topic": "orders", "key": "A", "seq": "2"})
        assert by_seq.status_code == 200
        assert f"Message {a2}" in by_seq.text
        by_id = client.get("/messages", params={"id": f" {a1} "}, follow_redirects=False)
        assert by_id.status_code == 303
        assert by_id.headers["location"] == f"/messages/{a1}"
        # the form is on the overview and the dead-letter listing
        assert 'id="find"' in client.get("/").text
        listing = client.get("/dead").text
        assert 'id="find"' in listing
        assert f'href="/messages/{dead}"' in listing


@pytest.mark.parametrize(
    ("path", "params", "said"),
    [
        ("/messages/not-a-uuid", {}, "is not a message id"),
        ("/messages/" + "f" * 3000, {}, "is not a message id"),
        ("/messages", {"id": "12345"}, "is not a message id"),
        ("/messages", {"topic": "orders", "key": "A", "seq": "two"}, "is not a number"),
        ("/messages", {"topic": "orders", "key": "A", "seq": "9" * 30}, "is not a number"),
        ("/messages", {"topic": "orders", "key": "A", "seq": "0"}, "is not a number"),
        ("/messages", {"topic": "o" * 5000, "key": "A", "seq": "1"}, "at most 1024"),
        ("/messages", {"idempotency_key": "order-42"}, "needs --topic"),
        ("/messages", {"topic": "orders"}, "which message?"),
        ("/messages", {"id": str(uuid.uuid4()), "topic": "orders"}, "give an id alone"),
        ("/messages/0190f3a2-7c1e-7d3b-9a57-0b0c5e11e7a1", {}, "never committed"),
    ],
)
def test_malformed_or_unknown_lookups_are_said_plainly(
    database_url: str, console: Any, path: str, params: dict[str, str], said: str
) -> None:
    with console(database_url) as base:
        answer = httpx.get(base + path, params=params)
    assert answer.status_code == (404 if said == "never committed" else 400), answer.text
    assert said in html.unescape(answer.text)
    assert 'id="problem"' in answer.text
    assert "Traceback" not in answer.text


def test_the_page_keeps_the_consoles_gates(database_url: str, console: Any) -> None:
    [message_id] = seed(database_url)["timeout"]
    with psycopg.connect(database_url) as conn:
        odd = publish(conn, topic="orders", key="<script>alert(1)</script>", payload={},
                      headers={"x": "<b>bold</b>"}, wakeup=False)  # fmt: skip
        conn.commit()
    record(database_url)  # no relay runs: the message page reads outbox_messages
    with console(database_url) as base:
        page = httpx.get(f"{base}/messages/{odd}").text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
        assert "<script>" not in page
        assert "&lt;b&gt;bold&lt;/b&gt;" in page
    with console(database_url, token=TOKEN) as base:
        anonymous = httpx.get(f"{base}/messages/{message_id}", follow_redirects=False)
        assert anonymous.status_code == 303
        assert anonymous.headers["location"] == "/login"
        foreign = httpx.get(f"{base}/messages/{message_id}", headers={"Host": "evil.example"})
        assert foreign.status_code == 400
        assert str(message_id) not in foreign.text


def test_browser_follows_the_dead_letter_listing_to_the_message_page(
    database_url: str, console: Any, browser: Any
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    [target] = seed(database_url)["timeout"]
    with console(database_url) as base:
        browser.get(f"{base}/dead")
        browser.find_element(By.ID, f"journey-{target}").click()
        WebDriverWait(browser, 15).until(
            lambda d: d.find_elements(By.ID, "summary"), message="the message page"
        )
        assert browser.current_url == f"{base}/messages/{target}"
        screenshot(browser, "journey")
        assert browser.find_element(By.ID, "summary").text == "dead at the relay after 3 attempt(s)"
        record = browser.find_element(By.ID, "outbox-record").text
        assert "RetryablePublishError: no PubAck within 8 s" in record
        commands = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#actions .command")]
        assert any(c.startswith(f"outbox dead retry --id {target}") for c in commands)
        assert "amount" not in browser.page_source  # the payload stays on the dead-letter page
        # and back to the dead letter from there
        browser.find_element(By.ID, "dead-link").click()
        WebDriverWait(browser, 15).until(
            lambda d: d.find_elements(By.ID, "payload"), message="the dead letter"
        )
        assert '"amount": "1.00"' not in browser.find_element(By.ID, "payload").text
        assert "9.99" in browser.find_element(By.ID, "payload").text


@pytest.mark.parametrize(
    ("given", "name", "url"),
    [
        ("billing=postgresql://ops:pw@db/billing", "billing", "postgresql://ops:pw@db/billing"),
        ("b.2=jdbc:postgresql://db/b?sslmode=require", "b.2", "jdbc:postgresql://db/b?sslmode=require"),
        ("postgresql://db/shipping?sslmode=require", "inbox3", "postgresql://db/shipping?sslmode=require"),
        ("host=db dbname=shipping", "inbox3", "host=db dbname=shipping"),
    ],
)  # fmt: skip
def test_inbox_option_is_name_equals_url_or_a_bare_url(given: str, name: str, url: str) -> None:
    from outbox_console._settings import inbox_source

    source = inbox_source(given, 3, "messaging")
    assert (source.name, source.url, source.schema) == (name, url, "messaging")
    assert "pw" not in repr(source)


def test_two_inboxes_of_one_name_are_refused(database_url: str) -> None:
    from outbox.exceptions import ConfigurationError
    from outbox_console import create_app

    with pytest.raises(ConfigurationError, match="two inboxes are named billing"):
        create_app(database_url, inboxes=["billing=postgresql://a/x", "billing=postgresql://b/y"])


def test_console_command_takes_inboxes_and_the_job_file(tmp_path: Any) -> None:
    from outbox_console.cli import console_cmd

    usage = CliRunner().invoke(console_cmd, ["--help"]).output
    assert "--inbox NAME=URL" in usage
    assert "--config" in usage
    job = tmp_path / "job.toml"
    job.write_text('[[inbox]]\nname = "billing"\n')  # no url: refused before serving
    refused = CliRunner().invoke(
        console_cmd, ["--url", "postgresql://db/app", "--config", str(job)]
    )
    assert refused.exit_code == 2
    assert "needs url" in refused.output


def test_an_unreachable_inbox_is_said_without_its_password(database_url: str, console: Any) -> None:
    [message_id] = seed(database_url)["timeout"]
    down = f"down=postgresql://ops:{PASSWORD}@127.0.0.1:1/billing"
    with console(database_url, inboxes=[down]) as base:
        page = httpx.get(f"{base}/messages/{message_id}")
    assert page.status_code == 200, page.text
    [row] = _tables(page.text)["consumers"][1:]
    assert row[:3] == ["down", "-", "unreachable"]
    assert "127.0.0.1" in row[8]
    assert PASSWORD not in page.text
    assert "inbox down could not be read" in page.text
