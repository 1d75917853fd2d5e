"""The console on a shared network: with a token nothing is shown before a login; without one
it answers loopback only; a foreign Host (DNS rebinding) is refused; reports come from the
configured directory only; logins are rate-limited and failures logged without the token; a
change without a filter needs "all"; bad numbers and deep payloads are a 400 page, never a
500; listings read no payloads; one pool of connections for the app's life.

A real browser where one can show it, HTTP where a browser cannot (a Host header, a client
address, a cookie's flags)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from outbox.exceptions import ConfigurationError
from tests.console.console_helpers import REBOUND, TOKEN, csrf_of, http_login, seed


def _wait(driver: Any, predicate: Any, what: str, within: float = 15.0) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, within).until(lambda d: predicate(d), message=what)


def _login(driver: Any, base: str, name: str = "alice", token: str = TOKEN) -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{base}/login")
    driver.find_element(By.ID, "operator").send_keys(name)
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.ID, "login-submit").click()


def _status(url: str, message_id: uuid.UUID) -> str | None:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT status FROM outbox_messages WHERE id = %s", (message_id,))
        found = row.fetchone()
    return None if found is None else str(found[0])


def _run(url: str, report: str) -> uuid.UUID:
    """A reconciliation run whose row names ``report``."""
    run_id = uuid.uuid4()
    now = dt.datetime.now(dt.UTC)
    with psycopg.connect(url) as conn:
        conn.execute(
            "INSERT INTO outbox_reconciliation_runs (run_id, started_at, finished_at, "
            "window_start, window_end, horizon_xmin, messages, discrepancies, outcome, summary) "
            "VALUES (%s, %s, %s, %s, %s, 1, 0, 0, 'ok', %s)",
            (run_id, now, now, now - dt.timedelta(days=1), now,
             json.dumps({"files": {"report": report}})),
        )  # fmt: skip
    return run_id


def test_with_a_token_no_page_shows_anything_before_the_login(
    database_url: str, console: Any, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    dead = seed(database_url)
    target = dead["timeout"][0]
    browser.delete_all_cookies()
    with console(database_url, token=TOKEN) as base:
        for page in ("/", "/dead", f"/dead/{target}", "/held", "/audit", "/api/history",
                     f"/runs/{uuid.uuid4()}/report"):  # fmt: skip
            browser.get(base + page)
            assert browser.current_url == f"{base}/login", page
            shown = browser.page_source
            for secret in (str(target), "payments", "PubAck", "postgres", "5432"):
                assert secret not in shown, (page, secret)
        assert browser.find_elements(By.ID, "token")  # the login form is all there is
        _login(browser, base)
        _wait(browser, lambda d: d.find_elements(By.ID, "logout"), "the operator session")
        browser.get(f"{base}/dead/{target}")
        assert '"amount": "9.99"' in browser.find_element(By.ID, "payload").text
        browser.find_element(By.ID, "logout").click()
        _wait(browser, lambda d: d.current_url == f"{base}/login", "back to the login page")


def test_a_foreign_host_name_is_refused(database_url: str, console: Any, browser: Any) -> None:
    """A page on an attacker's name that resolves to 127.0.0.1 gets nothing from the console."""
    import httpx

    dead = seed(database_url)
    with console(database_url) as base:
        port = base.rsplit(":", 1)[1]
        browser.get(f"http://{REBOUND}:{port}/dead")
        assert "Invalid host header" in browser.page_source
        assert str(dead["timeout"][0]) not in browser.page_source
        for host in ("127.0.0.1", "localhost", f"localhost:{port}", "[::1]"):
            assert httpx.get(base + "/dead", headers={"Host": host}).status_code == 200, host
        for host in (REBOUND, "127.0.0.1.nip.io", "evil.example:80", ""):
            assert httpx.get(base + "/dead", headers={"Host": host}).status_code == 400, host
    with console(database_url, allowed_host=[REBOUND]) as base:
        port = base.rsplit(":", 1)[1]
        browser.get(f"http://{REBOUND}:{port}/dead")
        assert str(dead["timeout"][0]) in browser.page_source  # named by the operator: served


def test_reports_come_from_the_reports_directory_only(
    database_url: str, console: Any, browser: Any, tmp_path: Path, caplog: Any
) -> None:
    from selenium.webdriver.common.by import By

    reports, outside = tmp_path / "runs", tmp_path / "elsewhere"
    (reports / "r1").mkdir(parents=True)
    outside.mkdir()
    (reports / "r1" / "report.html").write_text("<h1 id='report'>run one</h1>")
    (outside / "secret.html").write_text("<h1 id='report'>not for you</h1>")
    (reports / "link.html").symlink_to(outside / "secret.html")
    good = _run(database_url, str(reports / "r1" / "report.html"))
    relative = _run(database_url, "r1/report.html")
    refused = [
        _run(database_url, str(outside / "secret.html")),
        _run(database_url, str(reports / ".." / "elsewhere" / "secret.html")),
        _run(database_url, str(reports / "link.html")),  # a symlink out of the directory
        _run(database_url, "/etc/passwd"),
    ]
    with caplog.at_level(logging.WARNING, logger="outbox.console"):
        with console(database_url, reports_dir=reports) as base:
            browser.get(f"{base}/runs/{good}/report")
            assert browser.find_element(By.ID, "report").text == "run one"
            browser.get(f"{base}/runs/{relative}/report")
            assert browser.find_element(By.ID, "report").text == "run one"
            for run_id in refused:
                browser.get(f"{base}/runs/{run_id}/report")
                problem = browser.find_element(By.ID, "problem").text
                assert "not in the console's reports directory" in problem
                assert "not for you" not in browser.page_source
                assert "root:" not in browser.page_source
        with console(database_url) as base:  # no --reports-dir: no report at all
            browser.get(f"{base}/runs/{good}/report")
            assert "--reports-dir" in browser.find_element(By.ID, "problem").text
    logged = [r.getMessage() for r in caplog.records if "not served" in r.getMessage()]
    assert len(logged) == len(refused)
    from outbox_console import create_app

    with pytest.raises(ConfigurationError, match="not a directory"):
        create_app(database_url, reports_dir=tmp_path / "missing")


def test_failed_logins_are_limited_and_logged_without_the_token(
    database_url: str, console: Any, browser: Any, caplog: Any
) -> None:
    import httpx
    from selenium.webdriver.common.by import By

    wrong = "wrong-token-" + "s3cr3t" * 3
    browser.delete_all_cookies()
    with (
        caplog.at_level(logging.INFO, logger="outbox.console"),
        console(database_url, token=TOKEN) as base,
    ):
        for _ in range(5):
            _login(browser, base, "mallory", wrong)
            _wait(browser, lambda d: d.find_elements(By.ID, "problem"), "the refusal")
            assert browser.find_element(By.ID, "problem").text == "wrong token"
        _login(browser, base, "mallory", TOKEN)  # even the right token: wait first
        _wait(browser, lambda d: "too many failed logins" in d.page_source, "the limit")
        assert not browser.find_elements(By.ID, "logout")
        with httpx.Client(base_url=base) as client:
            csrf = csrf_of(client.get("/login").text)
            answer = client.post("/login", data={"csrf": csrf, "operator": "m", "token": TOKEN})
            assert answer.status_code == 429
            assert 1 <= int(answer.headers["retry-after"]) <= 60
    failures = [r.getMessage() for r in caplog.records if "failed login" in r.getMessage()]
    assert len(failures) == 5
    assert "'mallory'" in failures[-1]
    assert "127.0.0.1" in failures[-1]
    assert all(wrong not in r.getMessage() and TOKEN not in r.getMessage() for r in caplog.records)


def test_login_throttle_forgets_after_its_window() -> None:
    from outbox_console._security import LoginThrottle

    now = [1000.0]
    throttle = LoginThrottle(attempts=2, window=60, clients=2, clock=lambda: now[0])
    assert throttle.retry_after("a") == 0
    throttle.failed("a")
    now[0] += 10
    throttle.failed("a")
    assert throttle.retry_after("a") == 50  # the first failure leaves the window in 50 s
    assert throttle.retry_after("b") == 0  # per client address
    now[0] += 50
    assert throttle.retry_after("a") == 0
    throttle.failed("a")
    throttle.succeeded("a")
    assert throttle.retry_after("a") == 0
    for client in ("x", "y", "z"):  # bounded: the oldest client is forgotten
        throttle.failed(client)
    assert len(throttle._failures) == 2


def test_a_change_without_a_filter_needs_all(database_url: str, console: Any, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    dead = seed(database_url)
    everything = dead["too_large"] + dead["timeout"]
    browser.delete_all_cookies()
    with console(database_url, token=TOKEN) as base:
        _login(browser, base, "bob")
        _wait(browser, lambda d: d.find_elements(By.ID, "logout"), "the operator session")
        browser.get(f"{base}/dead")
        browser.find_element(By.ID, "bulk-reason").send_keys("clean slate")
        browser.find_element(By.ID, "bulk-purge").click()  # a form post: await its page
        _wait(browser, lambda d: d.find_elements(By.ID, "problem"), "the refusal page")
        problem = browser.find_element(By.ID, "problem").text
        assert "no filter" in problem
        assert all(_status(database_url, i) == "dead" for i in everything)
        browser.get(f"{base}/dead")
        browser.find_element(By.ID, "bulk-reason").send_keys("clean slate")
        browser.find_element(By.ID, "bulk-all").click()
        browser.find_element(By.ID, "bulk-retry").click()
        _wait(browser, lambda d: d.find_elements(By.ID, "notice"), "the notice")
        assert "3 message(s) requeued by bob" in browser.find_element(By.ID, "notice").text
        browser.get(f"{base}/dead?topic=orders")
        assert not browser.find_elements(By.ID, "bulk-all")  # a filter is set: no "all"
    assert all(_status(database_url, i) == "pending" for i in everything)


@pytest.mark.parametrize(
    "older", ["inf", "-inf", "nan", "-5", "1e308", "9" * 400, "10 minutes", "0x10"]
)
def test_bad_numbers_are_a_400_page(database_url: str, console: Any, older: str) -> None:
    import httpx

    dead = seed(database_url)
    with console(database_url, token=TOKEN) as base, httpx.Client(base_url=base) as client:
        csrf = http_login(client)
        listing = client.get("/dead", params={"older_than_minutes": older})
        change = client.post("/dead/change", data={
            "csrf": csrf, "action": "purge", "scope": "filter", "reason": "x",
            "older_than_minutes": older})  # fmt: skip
        for answer in (listing, change):
            assert answer.status_code == 400, answer.text
            assert "is not a number of minutes from 0" in answer.text
    assert _status(database_url, dead["timeout"][0]) == "dead"


def test_bad_numbers_in_the_browser(database_url: str, console: Any, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    seed(database_url)
    with console(database_url) as base:
        browser.get(f"{base}/dead")
        browser.find_element(By.NAME, "older_than_minutes").send_keys("inf")
        browser.find_element(By.ID, "apply-filters").click()  # a form submit: await its page
        _wait(browser, lambda d: d.find_elements(By.ID, "problem"), "the 400 page")
        assert "not a number of minutes" in browser.find_element(By.ID, "problem").text
        browser.get(f"{base}/dead?key=a%00b")  # a NUL byte PostgreSQL cannot take
        assert "refused a value" in browser.find_element(By.ID, "problem").text


def test_deep_and_huge_payloads_render_safely(
    database_url: str, console: Any, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    dead = seed(database_url)
    deep, huge = dead["too_large"]
    with psycopg.connect(database_url) as conn:
        conn.execute("UPDATE outbox_messages SET payload = %s WHERE id = %s",
                     (b"[" * 30_000 + b"]" * 30_000, deep))  # fmt: skip
        conn.execute("UPDATE outbox_messages SET payload = %s WHERE id = %s",
                     (b'"' + b"x" * 3_000_000 + b'"', huge))  # fmt: skip
    with console(database_url) as base:
        browser.get(f"{base}/dead/{deep}")
        assert browser.find_element(By.ID, "payload").text.startswith("[[[[")
        browser.get(f"{base}/dead/{huge}")
        shown = browser.find_element(By.ID, "payload").text
        assert shown.startswith("(the first 65536 of 3000002 bytes)")
        assert len(shown) < 70_000


def test_listings_read_no_payloads(database_url: str, console: Any) -> None:
    """A role that may not read payloads or headers still sees every listing."""
    import httpx

    dead = seed(database_url)
    role = f"lister_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        columns = [r[0] for r in conn.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_name = 'outbox_messages' AND column_name NOT IN ('payload', 'headers')"
        )]  # fmt: skip
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
        conn.execute(f"REVOKE SELECT ON outbox_messages FROM {role}")
        conn.execute(f"GRANT SELECT ({', '.join(columns)}) ON outbox_messages TO {role}")
    try:
        url = database_url.replace("postgres@", f"{role}@", 1)
        with console(url) as base, httpx.Client(base_url=base) as client:
            for page in ("/", "/dead", "/dead?error=TIMEOUT", "/held", "/audit"):
                answer = client.get(page)
                assert answer.status_code == 200, (page, answer.text)
            assert str(dead["timeout"][0]) in client.get("/dead?error=TIMEOUT").text
            assert str(dead["too_large"][0]) not in client.get("/dead?error=TIMEOUT").text
            page = client.get(f"/dead/{dead['timeout'][0]}")  # the one page that reads it
            assert page.status_code == 503
            assert "permission denied" in page.text
            # the journey shows no payload, but reads its size and the headers: refused alike
            journey = client.get(f"/messages/{dead['timeout'][0]}")
            assert journey.status_code == 503
            assert "permission denied" in journey.text
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


def _console_backends(url: str) -> list[int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'outbox console' "
            "AND datname = current_database() ORDER BY pid"
        ).fetchall()
    return [r[0] for r in rows]


def test_one_connection_pool_for_the_apps_life(database_url: str, console: Any) -> None:
    import httpx

    seed(database_url)
    with console(database_url) as base, httpx.Client(base_url=base) as client:
        for _ in range(30):
            for page in ("/", "/dead", "/held", "/audit"):
                assert client.get(page).status_code == 200
        backends = _console_backends(database_url)
        assert 1 <= len(backends) <= 4  # the pool's, not one per query
        for page in ("/", "/dead"):
            client.get(page)
        assert set(_console_backends(database_url)) <= set(backends)  # the same connections
    deadline = time.monotonic() + 10
    while _console_backends(database_url):  # closed when the app stopped (backends exit)
        assert time.monotonic() < deadline, "the pool's connections outlived the console"
        time.sleep(0.05)


def test_create_app_enforces_the_token_rules(database_url: str) -> None:
    from outbox_console import create_app

    for token in ("", "short", "x" * 15):
        with pytest.raises(ConfigurationError, match="at least 16 characters"):
            create_app(database_url, token=token)
    for host in ("0.0.0.0", "192.0.2.10", "::", "console.example"):
        with pytest.raises(ConfigurationError, match="loopback"):
            create_app(database_url, host=host)
        create_app(database_url, host=host, token=TOKEN)  # with a token: fine
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        create_app(database_url, host=host)


def test_the_cli_refuses_what_create_app_refuses(database_url: str) -> None:
    from outbox_console.cli import console_cmd

    cases = [
        (["--host", "0.0.0.0", "--allowed-host", "ops.example"], "loopback interface only"),
        (["--host", "0.0.0.0", "--token", TOKEN], "--allowed-host"),
        (["--token", "short"], "at least 16 characters"),
        (["--token", TOKEN, "--reports-dir", "/nonexistent/runs"], "not a directory"),
    ]
    for args, problem in cases:
        result = CliRunner().invoke(console_cmd, ["--url", database_url, *args])
        assert result.exit_code == 2, (args, result.output)
        assert problem in result.output, (args, result.output)
        assert "Traceback" not in result.output


async def _ask(
    app: Any, client: tuple[str, int], path: str, headers: dict[str, str] | None = None
) -> Any:
    """One GET of ``path`` from ``client`` (a peer address), straight to the ASGI app."""
    import httpx

    transport = httpx.ASGITransport(app, client=client)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        return await http.get(path, headers=headers or {})


def test_without_a_token_a_remote_client_is_refused(database_url: str, console: Any) -> None:
    """However the app is served (here: not by the CLI), a client from another machine gets
    nothing from a console without a token."""
    import asyncio

    import httpx

    from outbox_console import create_app

    app = create_app(database_url)
    answer = asyncio.run(_ask(app, ("192.0.2.7", 40000), "/dead"))
    assert answer.status_code == 403
    assert "loopback clients only" in answer.text
    tokened = create_app(database_url, token=TOKEN)
    answer = asyncio.run(_ask(tokened, ("192.0.2.7", 40000), "/dead"))
    assert (answer.status_code, answer.headers["location"]) == (303, "/login")
    with console(database_url) as base:  # a loopback client is served
        assert httpx.get(base + "/dead").status_code == 200


async def _session_cookie(app: Any, headers: dict[str, str], client: tuple[str, int]) -> str:
    import httpx

    transport = httpx.ASGITransport(app, client=client)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        form = await http.get("/login")
        csrf = csrf_of(form.text)
        session = form.headers["set-cookie"].split(";")[0]  # sent back even if marked Secure
        http.cookies.clear()
        answer = await http.post("/login", data={"csrf": csrf, "operator": "o", "token": TOKEN},
                                 headers={**headers, "Cookie": session})  # fmt: skip
        assert answer.status_code == 303, answer.text
        return str(answer.headers["set-cookie"]).lower()


def test_the_session_cookie_is_secure_when_asked_or_behind_a_trusted_tls_proxy(
    database_url: str,
) -> None:
    import asyncio

    from outbox_console import create_app

    def cookie(app: Any, headers: dict[str, str]) -> str:
        return asyncio.run(_session_cookie(app, headers, ("10.0.0.5", 40000)))

    https = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "198.51.100.4"}
    plain = create_app(database_url, token=TOKEN)
    assert "secure" not in cookie(plain, {})
    assert "secure" not in cookie(plain, https)  # an untrusted proxy's word
    forced = create_app(database_url, token=TOKEN, secure_cookie=True)
    assert "secure" in cookie(forced, {})
    behind = create_app(database_url, token=TOKEN, trusted_proxy=["10.0.0.0/8"])
    assert "secure" in cookie(behind, https)
    assert "secure" not in cookie(behind, {"X-Forwarded-Proto": "http"})


def test_the_console_role_of_outbox_grants_serves_every_page_and_change(
    database_url: str, console: Any
) -> None:
    """docs/how-to/console.md runs the console as a role granted `outbox migrate grants
    --console`: every page and every change works with it."""
    import httpx

    from outbox.cli import main as outbox_cli

    dead = seed(database_url)
    role = f"console_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
    granted = CliRunner().invoke(
        outbox_cli, ["migrate", "grants", "--apply", "--url", database_url, "--console", role]
    )
    assert granted.exit_code == 0, granted.output
    try:
        url = database_url.replace("postgres@", f"{role}@", 1)
        # the message page reads this database as an inbox database too, as the same role
        with (
            console(url, token=TOKEN, inboxes=[url]) as base,
            httpx.Client(base_url=base) as client,
        ):
            csrf = http_login(client, "gil")
            one = dead["timeout"][0]
            for page in ("/", "/dead", f"/dead/{one}", "/held", "/audit", "/messages",
                         f"/messages/{one}"):  # fmt: skip
                assert client.get(page).status_code == 200, page
            assert "unreachable" not in client.get(f"/messages/{one}").text
            for action, target in (("retry", dead["timeout"][0]), ("purge", dead["too_large"][0])):
                form = {"csrf": csrf, "action": action, "scope": "one", "id": str(target)}
                answer = client.post("/dead/change", data={**form, "reason": "ops"})
                assert answer.status_code == 303, answer.text
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")
    assert _status(database_url, dead["timeout"][0]) == "pending"
    assert _status(database_url, dead["too_large"][0]) is None


def test_concurrent_wrong_logins_are_limited_while_the_operator_still_logs_in(
    database_url: str, console: Any
) -> None:
    """100 wrong logins at once, each from a fresh session: the limit's check and count are
    one step, so 5 are compared and 95 get 429; an operator's browser that logged in before
    (same address) still logs in with the right token, while a fresh session must wait."""
    import asyncio

    import httpx

    async def attempt(base: str, token: str) -> int:
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            csrf = csrf_of((await client.get("/login")).text)
            answer = await client.post(
                "/login", data={"csrf": csrf, "operator": "mallory", "token": token}
            )
            return answer.status_code

    with console(database_url, token=TOKEN) as base, httpx.Client(base_url=base) as operator:
        csrf = http_login(operator, "olga")  # the operator's browser, known from before
        operator.post("/logout", data={"csrf": csrf})
        assert operator.get("/dead").status_code != 200

        async def attack() -> list[int]:
            return list(await asyncio.gather(*(attempt(base, "wrong" * 5) for _ in range(100))))

        codes = asyncio.run(attack())
        assert sorted(set(codes)) == [403, 429]
        assert codes.count(403) == 5  # compared: exactly the limit
        assert codes.count(429) == 95
        assert asyncio.run(attempt(base, TOKEN)) == 429  # a fresh session waits
        csrf = csrf_of(operator.get("/login").text)
        answer = operator.post("/login", data={"csrf": csrf, "operator": "olga", "token": TOKEN})
        assert answer.status_code == 303, answer.text
        assert operator.get("/dead").status_code == 200


def test_logout_ends_the_session_for_every_copy_of_the_cookie(
    database_url: str, console: Any
) -> None:
    import httpx

    with console(database_url, token=TOKEN) as base:
        with httpx.Client(base_url=base) as alice:
            csrf = http_login(alice, "alice")
            copied = dict(alice.cookies)
            with httpx.Client(base_url=base, cookies=copied) as thief:
                assert thief.get("/dead").status_code == 200  # the copy works while logged in
                assert alice.post("/logout", data={"csrf": csrf}).status_code == 303
                after = thief.get("/dead")
        assert after.status_code != 200
        assert "/login" in after.headers.get("location", "") or 'name="token"' in after.text


@pytest.mark.parametrize("older", ["0", "0.0", " 0 "])
def test_older_than_zero_is_no_filter_so_a_bulk_change_needs_all(
    database_url: str, console: Any, older: str
) -> None:
    import httpx

    dead = seed(database_url)
    with console(database_url, token=TOKEN) as base, httpx.Client(base_url=base) as client:
        csrf = http_login(client, "carol")
        answer = client.post("/dead/change", data={
            "action": "purge", "scope": "filter", "older_than_minutes": older,
            "reason": "cleanup", "csrf": csrf})  # fmt: skip
        assert answer.status_code in (200, 303, 400), answer.text
        page = client.get("/dead").text if answer.status_code == 303 else answer.text
    assert "no filter" in page
    with psycopg.connect(database_url) as conn:
        left = conn.execute(
            "SELECT count(*) FROM outbox_messages WHERE id = ANY(%s)", (dead["all"],)
        ).fetchone()
    assert left == (len(dead["all"]),)  # nothing purged
