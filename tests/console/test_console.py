"""The console as an operator uses it: a real browser against a real PostgreSQL. Requeue and
purge change exactly what the CLI would and leave the same audit; a read-only console, a missing
login or a bad CSRF token change nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.console.console_helpers import TOKEN, http_login, screenshot, seed

OUTBOX = str(Path(sys.executable).with_name("outbox"))


def _row(url: str, message_id: uuid.UUID) -> tuple[Any, ...] | None:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT status, attempts, last_error FROM outbox_messages WHERE id = %s",
            (message_id,),
        ).fetchone()


def _audit(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT actor, action, message_id, topic, key, seq, reason FROM outbox_dead_audit "
            "ORDER BY id"
        ).fetchall()


def _wait(driver: Any, predicate: Any, what: str, within: float = 15.0) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, within).until(lambda d: predicate(d), message=what)


def _login(driver: Any, base: str, name: str = "alice") -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{base}/login")
    driver.find_element(By.ID, "operator").send_keys(name)
    driver.find_element(By.ID, "token").send_keys(TOKEN)
    driver.find_element(By.ID, "login-submit").click()
    _wait(driver, lambda d: d.find_elements(By.ID, "logout"), "the operator session")


def test_overview_and_dead_letters_read_only(database_url: str, console: Any, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    dead = seed(database_url)
    with console(database_url) as base:
        browser.get(base + "/")
        topics = browser.find_element(By.ID, "topics").text
        assert "orders" in topics
        assert "payments" in topics
        # the chart script is packaged and served from the console itself
        _wait(browser, lambda d: d.execute_script("return typeof Chart") == "function", "Chart.js")
        assert "read-only" in browser.find_element(By.TAG_NAME, "header").text
        assert TOKEN not in browser.page_source
        screenshot(browser, "overview")
        browser.get(base + "/dead")
        listed = browser.find_element(By.ID, "dead").text
        assert all(str(i) in listed for i in dead["too_large"] + dead["timeout"])
        assert not browser.find_elements(By.ID, "bulk")  # no change forms without a token
        browser.get(f"{base}/dead/{dead['too_large'][0]}")
        assert '"n": 1' in browser.find_element(By.ID, "payload").text
        assert "tenant: acme" in browser.find_element(By.ID, "message").text
        assert not browser.find_elements(By.ID, "retry")
        # a change posted anyway is refused, and nothing changes
        import httpx

        answer = httpx.post(f"{base}/dead/change", data={"action": "retry", "scope": "one",
                            "id": str(dead["timeout"][0]), "reason": "x"})  # fmt: skip
        assert answer.status_code == 403
        assert "read-only" in answer.text
    assert _row(database_url, dead["timeout"][0])[0] == "dead"  # type: ignore[index]
    assert _audit(database_url) == []


def test_requeue_one_message_is_what_the_cli_does(
    database_url: str, console: Any, browser: Any, pg_server: Any, template_db: str
) -> None:
    from selenium.webdriver.common.by import By

    dead = seed(database_url)
    target = dead["timeout"][0]
    with console(database_url, token=TOKEN) as base:
        _login(browser, base)
        browser.get(f"{base}/dead/{target}")
        browser.find_element(By.ID, "reason").send_keys("broker fixed")
        browser.find_element(By.ID, "retry").click()
        _wait(browser, lambda d: d.find_elements(By.ID, "notice"), "the notice")
        assert "1 message(s) requeued by alice" in browser.find_element(By.ID, "notice").text
        screenshot(browser, "dead")
    console_row, console_audit = _row(database_url, target), _audit(database_url)
    assert console_row == ("pending", 0, "RetryablePublishError: no PubAck within 8 s (timeout)")
    assert console_audit == [("alice (console)", "retry", target, "payments", "p-1", 1,
                              "broker fixed")]  # fmt: skip
    # the CLI, on a twin database, with the same ids, actor and reason: the same outcome
    with pg_server.fresh_database(template=template_db) as twin:
        twin_dead = seed(twin)
        with psycopg.connect(twin) as conn:  # the same ids as the console's database
            for old, new in zip(twin_dead["all"], dead["all"], strict=True):
                conn.execute("UPDATE outbox_messages SET id = %s WHERE id = %s", (new, old))
            conn.commit()
        done = subprocess.run(
            [OUTBOX, "dead", "retry", "--url", twin, "--id", str(target),
             "--reason", "broker fixed", "--actor", "alice (console)"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert (_row(twin, target), _audit(twin)) == (console_row, console_audit)


def test_filtered_purge_dry_run_then_for_real(
    database_url: str, console: Any, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    dead = seed(database_url)
    with console(database_url, token=TOKEN) as base:
        _login(browser, base, "bob")
        browser.get(f"{base}/dead?error=too+large")
        listed = browser.find_element(By.ID, "dead").text
        assert str(dead["timeout"][0]) not in listed  # filtered out by its error
        browser.find_element(By.ID, "bulk-reason").send_keys("obsolete orders")
        browser.find_element(By.ID, "bulk-dry-run").click()
        browser.find_element(By.ID, "bulk-purge").click()
        _wait(browser, lambda d: d.find_elements(By.ID, "preview-ids"), "the dry run")
        previewed = browser.find_element(By.ID, "preview-ids").text.split()
        assert sorted(previewed) == sorted(str(i) for i in dead["too_large"])
        assert all(_row(database_url, i) is not None for i in dead["too_large"])  # unchanged
        assert _audit(database_url) == []
        browser.get(f"{base}/dead?error=too+large")
        browser.find_element(By.ID, "bulk-reason").send_keys("obsolete orders")
        browser.find_element(By.ID, "bulk-purge").click()
        _wait(browser, lambda d: d.find_elements(By.ID, "notice"), "the notice")
        assert "2 message(s) purged by bob" in browser.find_element(By.ID, "notice").text
    assert all(_row(database_url, i) is None for i in dead["too_large"])
    assert _row(database_url, dead["timeout"][0])[0] == "dead"  # type: ignore[index]
    audit = _audit(database_url)
    assert sorted(r[2] for r in audit) == sorted(dead["too_large"])
    assert {(r[0], r[1], r[6]) for r in audit} == {("bob (console)", "purge", "obsolete orders")}


def test_requeue_a_keys_messages_in_order(database_url: str, console: Any, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    dead = seed(database_url)
    first = dead["too_large"][0]  # o-1 seq 1 and seq 2 are both dead
    with console(database_url, token=TOKEN) as base:
        _login(browser, base)
        browser.get(f"{base}/dead/{first}")
        browser.find_element(By.ID, "reason").send_keys("payload limit raised")
        browser.find_element(By.ID, "scope-key").click()
        browser.find_element(By.ID, "retry").click()
        _wait(browser, lambda d: d.find_elements(By.ID, "notice"), "the notice")
    assert [_row(database_url, i)[0] for i in dead["too_large"]] == ["pending", "pending"]  # type: ignore[index]
    assert [(r[4], r[5]) for r in _audit(database_url)] == [("o-1", 1), ("o-1", 2)]


def test_changes_need_a_login_and_the_sessions_csrf_token(database_url: str, console: Any) -> None:
    import httpx

    dead = seed(database_url)
    target = str(dead["timeout"][0])
    with console(database_url, token=TOKEN) as base, httpx.Client(base_url=base) as client:
        form = {"action": "retry", "scope": "one", "id": target, "reason": "x"}
        assert client.post("/dead/change", data=form).status_code == 403  # no session
        page = client.get("/login").text
        csrf = page.split('name="csrf" value="')[1].split('"')[0]
        wrong = client.post("/login", data={"csrf": csrf, "operator": "eve", "token": "nope"})
        assert wrong.status_code == 403
        client.post("/login", data={"csrf": csrf, "operator": "carol", "token": TOKEN})
        refused = client.post("/dead/change", data={**form, "csrf": "forged"})
        assert refused.status_code == 403
        assert "CSRF" in refused.text
        assert _row(database_url, dead["timeout"][0])[0] == "dead"  # type: ignore[index]
        fresh = client.get(f"/dead/{target}").text.split('name="csrf" value="')[1].split('"')[0]
        done = client.post("/dead/change", data={**form, "csrf": fresh})
        assert done.status_code == 303
        assert done.headers["content-security-policy"].startswith("default-src 'self'")
    assert _row(database_url, dead["timeout"][0])[0] == "pending"  # type: ignore[index]


def test_a_read_only_database_role_can_view_and_is_told_it_cannot_change(
    database_url: str, console: Any
) -> None:
    import httpx

    dead = seed(database_url)
    role = f"viewer_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
    viewer_url = database_url.replace("postgres@", f"{role}@", 1)
    assert role in viewer_url
    try:
        with console(viewer_url, token=TOKEN) as base, httpx.Client(base_url=base) as client:
            csrf = http_login(client, "dan")
            for page in ("/", "/dead", f"/dead/{dead['timeout'][0]}", "/held", "/audit",
                         "/api/history"):  # fmt: skip
                assert client.get(page).status_code == 200, page
            answer = client.post("/dead/change", data={
                "action": "purge", "scope": "one", "id": str(dead["timeout"][0]),
                "reason": "x", "csrf": csrf})  # fmt: skip
            assert answer.status_code == 403
            assert "may not change dead letters" in answer.text
            assert client.get("/dead").status_code == 200  # its pooled connection rolled back
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")
    assert _row(database_url, dead["timeout"][0])[0] == "dead"  # type: ignore[index]


def test_overview_history_samples_the_backlog(database_url: str, console: Any) -> None:
    import httpx

    seed(database_url)
    with console(database_url) as base, httpx.Client(base_url=base) as client:
        deadline = time.monotonic() + 20
        while not (series := client.get("/api/history").json())["labels"]:
            assert time.monotonic() < deadline, "no sample within 20 s"
            time.sleep(0.1)
    assert series["backlog"]["orders"][-1] == 1  # o-2 pending; o-1's two are dead
    assert series["backlog"]["payments"][-1] == 1


@pytest.mark.parametrize("page", ["/dead/not-a-uuid", f"/dead/{uuid.uuid4()}"])
def test_unknown_message_is_a_404_with_a_reason(database_url: str, console: Any, page: str) -> None:
    import httpx

    with console(database_url) as base:
        answer = httpx.get(base + page)
    assert answer.status_code == 404
    assert "problem" in answer.text


def test_retry_a_held_inbox_key_then_the_consumer_applies_it(
    database_url: str, console: Any, browser: Any
) -> None:
    from psycopg_pool import ConnectionPool
    from selenium.webdriver.common.by import By

    from inbox import HandlerRunner, Outcome
    from inbox.admin import dead_audit
    from outbox.envelope import Envelope

    broken = {"on": True}
    applied: list[int] = []

    def handler(_conn: Any, msg: Any) -> None:
        if broken["on"] and msg.payload == b"poison":
            raise ValueError(f"cannot parse {msg.seq}")
        applied.append(msg.seq)

    def env(seq: int, payload: bytes) -> Envelope:
        return Envelope(id=uuid.uuid4(), topic="orders", key="K", seq=seq, payload=payload)

    first, poison, later = env(1, b"ok"), env(2, b"poison"), env(3, b"ok")
    with ConnectionPool(database_url, min_size=1, max_size=2, open=True) as pool:
        runner = HandlerRunner(pool, handler, consumer="billing", ordered=True, max_attempts=1,
                               on_dead="hold")  # fmt: skip
        assert runner.handle(first).outcome is Outcome.PROCESSED
        assert runner.handle(poison).outcome is Outcome.DEAD
        assert runner.handle(later).outcome is Outcome.PARKED
        with console(database_url, token=TOKEN) as base:
            _login(browser, base, "erin")
            browser.get(f"{base}/held")
            table = browser.find_element(By.ID, "held")
            assert str(poison.id) in table.text
            assert "ValueError: cannot parse 2" in table.text
            table.find_element(By.NAME, "reason").send_keys("parser fixed")
            table.find_element(By.CSS_SELECTOR, "button[value=retry]").click()
            _wait(browser, lambda d: d.find_elements(By.ID, "notice"), "the notice")
            assert "1 message(s) requeued by erin" in browser.find_element(By.ID, "notice").text
        broken["on"] = False  # the fix is deployed; the consumer applies the decision
        results = runner.resolve_held()
    assert [(r.message_id, r.outcome) for r in results] == [
        (poison.id, Outcome.PROCESSED),
        (later.id, Outcome.PROCESSED),
    ]
    assert applied == [1, 2, 3]
    audit = dead_audit(database_url, consumer="billing")
    assert any(r["actor"] == "erin (console)" and r["reason"] == "parser fixed" for r in audit)


def test_an_unreachable_database_is_a_page_that_says_so(console: Any) -> None:
    import httpx

    with console("postgresql://postgres@127.0.0.1:1/nowhere") as base:
        answer = httpx.get(base + "/", timeout=30)  # the pool waits for a connection first
    assert answer.status_code == 503
    assert "cannot be reached" in answer.text
    assert "Traceback" not in answer.text


def test_an_unmigrated_database_says_what_to_run(empty_database_url: str, console: Any) -> None:
    import httpx

    with console(empty_database_url) as base:
        answer = httpx.get(base + "/dead")
    assert answer.status_code == 503
    assert "outbox migrate upgrade" in answer.text


@pytest.mark.parametrize(
    ("path", "form", "problem"),
    [
        ("/dead/change", {"action": "retry", "scope": "one", "id": "{id}", "reason": " "},
         "say why"),
        ("/dead/change", {"action": "resend", "scope": "one", "id": "{id}", "reason": "x"},
         "action must be retry or purge"),
        ("/dead/change", {"action": "retry", "scope": "one", "id": "not-an-id", "reason": "x"},
         "is not a message id"),
        ("/dead/change", {"action": "purge", "scope": "filter", "older_than_minutes": "soon",
                          "reason": "x"}, "not a number of minutes"),
        ("/held/change", {"action": "purge", "scope": "filter", "reason": "x"},
         "say which held keys"),
    ],
)  # fmt: skip
def test_a_bad_change_is_refused_with_its_reason_and_changes_nothing(
    database_url: str, console: Any, path: str, form: dict[str, str], problem: str
) -> None:
    import httpx

    dead = seed(database_url)
    target = str(dead["timeout"][0])
    with console(database_url, token=TOKEN) as base, httpx.Client(base_url=base) as client:
        csrf = client.get("/login").text.split('name="csrf" value="')[1].split('"')[0]
        logged = client.post("/login", data={"csrf": csrf, "operator": "fay", "token": TOKEN})
        cookie = logged.headers["set-cookie"].lower()
        assert "httponly" in cookie
        assert "samesite=strict" in cookie
        csrf = client.get("/").text.split('name="csrf" value="')[1].split('"')[0]
        filled = {k: v.replace("{id}", target) for k, v in form.items()}
        answer = client.post(path, data={**filled, "csrf": csrf})
    assert answer.status_code == 400
    assert problem in answer.text
    assert "Traceback" not in answer.text
    assert all(_row(database_url, i)[0] == "dead" for i in dead["too_large"] + dead["timeout"])  # type: ignore[index]
    assert _audit(database_url) == []


def test_the_overview_names_each_relays_broker_and_a_paused_topics_destination(
    database_url: str, console: Any
) -> None:
    """A relay on a cloud broker, as it registers itself (a password in its row, as an older
    relay or a hand-written row might leave it): the overview shows the broker family, the
    destination a paused topic maps to, and never the password."""
    import httpx

    seed(database_url)
    secret = "s3cr3t-" + uuid.uuid4().hex[:8]
    config = {
        "broker": f"amqp1s://RelaySend:{secret}@my-ns.servicebus.windows.net",
        "paused_destinations": {
            "orders": {
                "destination": "/queues/orders",
                "reason": f"amqp:not-found from amqp1s://RelaySend:{secret}@my-ns.servicebus.windows.net",
                "since": "2026-11-27T00:00:00+00:00",
                "refusals": 3,
            }
        },
    }
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO outbox_relays (relay_id, hostname, pid, config) "
            "VALUES ('relay-cloud', 'host-a', 4242, %s::jsonb)",
            (json.dumps(config),),
        )
    with console(database_url) as base, httpx.Client(base_url=base) as client:
        page = client.get("/")
    assert page.status_code == 200, page.text
    row = page.text.split('id="relays"', 1)[1].split("</table>", 1)[0]
    assert "relay-cloud" in row
    assert "AMQP 1.0" in row
    assert "my-ns.servicebus.windows.net" in row
    assert "/queues/orders" in row
    assert secret not in page.text
