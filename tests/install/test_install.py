"""The built wheel, installed as the docs say, with only the extras a page names.

* The wheel and the sdist carry every module and data file of the packages.
* With no extras, every public module imports and no optional dependency is loaded; an object
  that needs an extra says which one.
* Per install line of the docs (``pip install 'outbox-inbox[...]'``): ``outbox --help`` and
  every subcommand's ``--help`` work, and the page's Python examples run against a fresh
  database, in a folder that is not the repository.
* The tutorial and the FastAPI guide run as written, shell blocks included (the tutorial
  twice: it starts clean when run again), and print what their comments say.
"""

from __future__ import annotations

import json
import re
import subprocess
import tarfile
import textwrap
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from outbox._migrate import sqlalchemy_url
from tests.support.server_process import free_port
from tests.support.services import missing

#: a clean virtualenv with the wheel (conftest.py's ``Env``)
Env = Any
ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PACKAGES = {  # directory in the checkout -> importable name in the wheel
    "outbox": "outbox",
    "inbox": "inbox",
    "relay": "relay",
    "spark_ingest": "spark_ingest",
    "outbox_console": "outbox_console",
    "migrations": "outbox_migrations",
}
#: distributions of the extras: none may be imported without its extra
OPTIONAL = (
    "nats", "aio_pika", "aiormq", "confluent_kafka", "redis", "paho", "pyspark", "py4j",
    "starlette", "jinja2", "uvicorn", "fastapi", "httpx", "greenlet", "asyncpg",
    "prometheus_client", "opentelemetry", "sqlalchemy.ext.asyncio",
)  # fmt: skip
OPTIONAL += ("proton",)  # the amqp1 extra
OPTIONAL += ("boto3", "botocore")  # the aws extra
INSTALL_LINE = re.compile(r"pip install ['\"]?outbox-inbox(?:\[([a-z0-9,]+)\])?['\"]?")
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", flags=re.DOTALL | re.MULTILINE)


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def _install_lines() -> dict[str, set[str]]:
    """page (relative to the repository) -> the extras of each install line it shows."""
    found: dict[str, set[str]] = {}
    for page in _pages():
        for extras in INSTALL_LINE.findall(page.read_text()):
            found.setdefault(str(page.relative_to(ROOT)), set()).add(extras)
    return found


INSTALLS = _install_lines()
ALL_EXTRAS = sorted({"", *(e for extras in INSTALLS.values() for e in extras)})


def _blocks(page: Path) -> list[tuple[str, str, str]]:
    """(language, info after it, code) of each fenced block, in order."""
    return [(lang, info.strip(), code) for lang, info, code in FENCE.findall(page.read_text())]


def _python_script(page: Path) -> str:
    """The page's Python blocks in order, as one script (they share one namespace)."""
    return "\n\n".join(code for lang, _, code in _blocks(page) if lang == "python")


# ---- the wheel's contents ------------------------------------------------------------------


def _tree_files() -> set[str]:
    """Every file the wheel must carry, under its installed name."""
    wanted: set[str] = set()
    for folder, name in PACKAGES.items():
        for path in (ROOT / folder).rglob("*"):
            if path.is_dir() or "__pycache__" in path.parts:
                continue
            if path.suffix in (".pyc",):
                continue
            wanted.add(f"{name}/{path.relative_to(ROOT / folder).as_posix()}")
    return wanted


def test_the_wheel_carries_every_module_and_data_file(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    missing = sorted(_tree_files() - names)
    assert missing == [], f"the wheel lacks {missing}: list them in pyproject.toml"


def test_the_wheel_installs_the_packages_top_level_names_only(wheel: Path) -> None:
    """No generic name (such as ``console``) beside the project's own packages."""
    with zipfile.ZipFile(wheel) as archive:
        tops = {n.split("/")[0] for n in archive.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == set(PACKAGES.values())


def test_the_sdist_carries_every_module_and_its_sql(sdist: Path) -> None:
    with tarfile.open(sdist) as archive:
        names = {"/".join(n.split("/")[1:]) for n in archive.getnames()}
    wanted = {
        f"{folder}/{p.relative_to(ROOT / folder).as_posix()}"
        for folder in PACKAGES
        for pattern in ("*.py", "*.sql")  # the SQL: each package's statements.sql
        for p in (ROOT / folder).rglob(pattern)
        if "__pycache__" not in p.parts
    }
    assert sorted(wanted - names) == []


# ---- imports follow the extras -------------------------------------------------------------

_IMPORT_EVERYTHING = textwrap.dedent(
    """
    import importlib, json, pkgutil, sys

    from outbox.exceptions import MissingDependencyError

    optional = {optional!r}
    report = {{"imported": [], "needs": {{}}, "leaks": {{}}}}
    for top in {packages!r}:
        try:  # a whole package may need an extra (outbox_console: the console's)
            path = importlib.import_module(top).__path__
        except MissingDependencyError as exc:
            report["needs"][top] = exc.extra
            continue
        names = [top] + [
            m.name for m in pkgutil.walk_packages(path, top + ".", onerror=lambda name: None)
        ]
        for name in names:
            if any(part.startswith("_") for part in name.split(".")):
                continue  # private: imported by its package when its objects are used
            try:
                importlib.import_module(name)
            except MissingDependencyError as exc:
                report["needs"][name] = exc.extra
                continue
            report["imported"].append(name)
            loaded = sorted(o for o in optional if o in sys.modules)
            if loaded:
                report["leaks"][name] = loaded
                for o in list(sys.modules):
                    if o.split(".")[0] in {{x.split(".")[0] for x in loaded}}:
                        del sys.modules[o]
    print(json.dumps(report))
    """
)


def test_no_extras_every_public_module_imports_without_an_optional_dependency(
    installed: Callable[[str], Env], project: Path
) -> None:
    env = installed("")
    script = _IMPORT_EVERYTHING.format(
        optional=OPTIONAL, packages=[p for p in PACKAGES.values() if p != "outbox_migrations"]
    )
    done = env.run([str(env.python), "-c", script], cwd=project)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["leaks"] == {}, "these modules import an optional dependency at import time"
    assert report["needs"] == {"outbox_console": "console", "relay.contract": "contract"}
    assert {"outbox", "outbox.wire.nats", "inbox", "relay.brokers.kafka"} <= set(
        report["imported"]
    )


_OBJECTS_NAME_THEIR_EXTRA = textwrap.dedent(
    """
    import asyncio

    from psycopg_pool import AsyncConnectionPool

    from inbox import AsyncHandlerRunner, Amqp1Consumer, KafkaConsumer, MqttConsumer
    from inbox import NatsConsumer, RabbitMQConsumer, RedisStreamConsumer, SqsConsumer
    from outbox.exceptions import MissingDependencyError
    from relay.brokers import publisher_for_url

    async def handler(conn, envelope):
        pass

    async def main():
        pool = AsyncConnectionPool("postgresql://nobody@127.0.0.1:1/none", open=False)
        runner = AsyncHandlerRunner(pool, handler, consumer="c")  # no greenlet needed
        made = {{
            "nats": lambda: NatsConsumer(runner, stream="S", durable="d"),
            "rabbitmq": lambda: RabbitMQConsumer(runner, queue="q"),
            "redis": lambda: RedisStreamConsumer(runner, stream="s", group="g", name="n"),
            "mqtt": lambda: MqttConsumer(runner, topic="t", client_id="c"),
            "kafka": lambda: KafkaConsumer(runner, config={{}}, topics=["t"]),
            "amqp1": lambda: Amqp1Consumer(runner, address="/queue/q"),
            "aws": lambda: SqsConsumer(runner, queue="q"),
            "nats relay": lambda: publisher_for_url("nats://127.0.0.1:4222"),
        }}
        for name, make in made.items():
            try:
                make()
            except MissingDependencyError as exc:
                print(name, exc.extra)

    asyncio.run(main())
    import spark_ingest
    try:
        spark_ingest.spark_session
    except MissingDependencyError as exc:
        print("spark", exc.extra)
    """
)


def test_no_extras_objects_that_need_one_name_it(
    installed: Callable[[str], Env], project: Path
) -> None:
    env = installed("")
    done = env.run([str(env.python), "-c", _OBJECTS_NAME_THEIR_EXTRA.format()], cwd=project)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "nats nats",
        "rabbitmq rabbitmq",
        "redis redis",
        "mqtt mqtt",
        "kafka kafka",
        "amqp1 amqp1",
        "aws aws",
        "nats relay nats",
        "spark spark",
    ]


# ---- per install line: the CLI, and the page's examples ------------------------------------

_EVERY_HELP = textwrap.dedent(
    """
    import json

    import click
    from click.testing import CliRunner

    from outbox.cli import main

    def walk(group, path):
        for name, command in sorted(group.commands.items()):
            yield path + [name]
            if isinstance(command, click.Group):
                yield from walk(command, path + [name])

    answers = {}
    for path in walk(main, []):
        result = CliRunner().invoke(main, [*path, "--help"])
        answers[" ".join(path)] = [result.exit_code, result.output, repr(result.exception)]
    print(json.dumps(answers))
    """
)


@pytest.mark.parametrize("extras", ALL_EXTRAS, ids=lambda e: e or "no-extras")
def test_every_command_answers_help(
    installed: Callable[[str], Env], project: Path, extras: str
) -> None:
    env = installed(extras)
    top = env.run([str(env.bin / "outbox"), "--help"], cwd=project)  # the installed script
    assert top.returncode == 0, top.stderr
    assert "Usage: outbox" in top.stdout
    done = env.run([str(env.python), "-c", _EVERY_HELP], cwd=project)
    assert done.returncode == 0, done.stderr
    answers = json.loads(done.stdout)
    assert {"migrate", "relay", "status", "dead", "inbox", "capture"} <= set(answers)
    for command, (code, output, exception) in answers.items():
        assert code == 0, f"outbox {command} --help: {exception}"
        assert "Usage:" in output, f"outbox {command} --help printed {output!r}"


#: pages run as written, shell blocks included, and how many times
RUN_AS_WRITTEN = {"docs/tutorial/first-message.md": 2, "docs/how-to/fastapi.md": 1}
#: pages whose Python blocks run on their own (none now: the README runs as written, with
#: its relay and consumer, in test_readme.py)
EACH_BLOCK_ALONE: set[str] = set()
#: pages run as written by a test of their own
OWN_TEST = {"README.md"}


def _page_extras(page: str) -> str:
    """The virtualenv a page's reader has: the union of its install lines' extras."""
    return ",".join(sorted({x for e in INSTALLS[page] for x in e.split(",") if x}))


PAGES_WITH_PYTHON = sorted(
    page
    for page in INSTALLS
    if page not in RUN_AS_WRITTEN
    and page not in OWN_TEST
    and any(lang == "python" for lang, _, _ in _blocks(ROOT / page))
)


@pytest.mark.parametrize("page", PAGES_WITH_PYTHON)
def test_a_pages_examples_run_with_its_install_line(
    installed: Callable[[str], Env], project: Path, database_url: str, page: str
) -> None:
    env = installed(_page_extras(page))
    urls = {
        "OUTBOX_DATABASE_URL": database_url,
        "DATABASE_URL": sqlalchemy_url(database_url).render_as_string(hide_password=False),
    }
    path = ROOT / page
    scripts = (
        [code for lang, _, code in _blocks(path) if lang == "python"]
        if page in EACH_BLOCK_ALONE
        else [_python_script(path)]
    )
    for index, script in enumerate(scripts):
        done = env.run([str(env.python), "-c", script], cwd=project, **urls)
        assert done.returncode == 0, f"{page} (script {index}) failed:\n{done.stderr[-4000:]}"


def _expected_prints(script: str) -> list[str]:
    """What ``print(...)  # expected`` lines say they print, in order."""
    return re.findall(r"^\s*print\(.*\)\s*#\s*(.+?)\s*$", script, flags=re.MULTILINE)


def _run_as_written(env: Env, page: Path, folder: Path) -> list[str]:
    """Run ``page``: shell blocks before its Python, the Python (one script, blocks saved as
    files where the fence names one), shell blocks after; returns the script's output lines."""
    blocks = _blocks(page)
    kinds = [lang for lang, _, _ in blocks if lang in ("bash", "python")]
    first, last = kinds.index("python"), len(kinds) - 1 - kinds[::-1].index("python")
    assert "bash" not in kinds[first:last], f"{page.name}: a shell block between Python blocks"
    for lang, info, code in blocks:
        if lang == "python" and info.startswith("file="):
            (folder / info.removeprefix("file=")).write_text(code)
    environ: dict[str, str] = {}

    def shell(code: str) -> None:
        envfile = folder / ".env.json"
        wrapped = (
            f"set -euo pipefail\n{code}\n"
            f"python -c 'import json, os; print(json.dumps(dict(os.environ)))' > {envfile}"
        )
        done = env.run(["bash", "-c", wrapped], cwd=folder, timeout=600, **environ)
        assert done.returncode == 0, f"{page.name} shell block failed:\n{code}\n{done.stderr}"
        environ.update(json.loads(envfile.read_text()))

    for lang, _, code in blocks[: [b[0] for b in blocks].index("python")]:
        if lang == "bash":
            shell(code)
    script = _python_script(page)
    done = env.run([str(env.python), "-c", script], cwd=folder, timeout=600, **environ)
    assert done.returncode == 0, f"{page.name} failed:\n{done.stderr[-4000:]}"
    after = len(blocks) - [b[0] for b in blocks][::-1].index("python")
    for lang, _, code in blocks[after:]:
        if lang == "bash":
            shell(code)
    return done.stdout.splitlines()


@pytest.mark.parametrize("page", sorted(RUN_AS_WRITTEN))
def test_a_page_runs_as_written_in_a_clean_virtualenv(
    installed: Callable[[str], Env], project: Path, page: str
) -> None:
    env = installed(_page_extras(page))
    path = ROOT / page
    expected = _expected_prints(_python_script(path))
    for _ in range(RUN_AS_WRITTEN[page]):
        printed = _run_as_written(env, path, project)
        assert printed == expected, f"{page} printed {printed}, its comments say {expected}"


def test_the_pages_name_their_install_lines() -> None:
    # the pages these tests are about still say how to install what they use
    pages = {"docs/tutorial/first-message.md", "docs/how-to/fastapi.md", "docs/how-to/reconcile.md"}
    assert pages <= set(INSTALLS)
    assert {"nats", "fastapi,nats", "spark", "console"} <= set(ALL_EXTRAS)


# ---- the operator pages' commands, from their own install lines ----------------------------


def test_the_console_serves_with_only_its_extra(
    installed: Callable[[str], Env], project: Path, database_url: str
) -> None:
    # docs/how-to/console.md: pip install 'outbox-inbox[console]', then `outbox console`
    env = installed(_page_extras("docs/how-to/console.md"))
    port = free_port()
    server = subprocess.Popen(
        [str(env.bin / "outbox"), "console", "--url", database_url, "--port", str(port)],
        cwd=project,
        env=env.environ(OUTBOX_CONSOLE_TOKEN="a-token-of-24-characters"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        login = None
        while time.monotonic() < deadline and server.poll() is None:
            try:
                login = httpx.get(f"http://127.0.0.1:{port}/login", timeout=2)
                break
            except httpx.TransportError:
                time.sleep(0.1)  # the server is still starting: nothing to wait on but its port
        assert login is not None, "the console did not answer within 60 s"
        assert login.status_code == 200
        overview = httpx.get(f"http://127.0.0.1:{port}/", timeout=5)
        assert overview.status_code in (302, 303, 307)  # a token is set: log in first
        assert overview.headers["location"].endswith("/login")
    finally:
        server.terminate()
        output = server.communicate(timeout=30)[0]
    assert "Traceback" not in output, output


def test_reconcile_runs_with_only_its_extra(
    installed: Callable[[str], Env], project: Path, database_url: str
) -> None:
    # docs/how-to/reconcile.md: pip install 'outbox-inbox[spark]', the JDBC driver, then
    # `outbox reconcile` (here one database is both the outbox and the inbox)
    jar = Path("/usr/share/java/postgresql.jar")
    if not jar.is_file():
        missing("the PostgreSQL JDBC driver", "apt-get install libpostgresql-jdbc-java")
    env = installed(_page_extras("docs/how-to/reconcile.md"))
    command = [
        str(env.bin / "outbox"), "reconcile", "--outbox", database_url,
        "--inbox", database_url, "--subscribe", "orders=billing",
        "--output", str(project / "recon"), "--no-record",
    ]  # fmt: skip
    done = env.run(command, cwd=project, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "outcome: OK" in done.stdout
