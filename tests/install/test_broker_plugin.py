"""A broker added from outside the package: tests/plugin_fixture/outbox_redis_list (Redis lists),
installed beside the built wheel in a clean virtualenv, as its author would install it.

* Its own tests run the contract suite of the wheel (``relay.contract``) on it, and pass.
* The relay takes its URL scheme: ``outbox relay --help`` names it, and ``outbox relay check``
  connects to the broker through it.
* Its consumer (an ``inbox.brokers.BrokerConsumer``) applies what its publisher sent, each
  message once, in key order.
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from outbox._migrate import sqlalchemy_url
from tests.support.services import require_port

Env = Any
FIXTURE = Path(__file__).resolve().parents[1] / "plugin_fixture" / "outbox_redis_list"
BROKER = "redis-list://127.0.0.1:6379/0"


@pytest.fixture(scope="module")
def with_plugin(
    installed: Callable[[str], Env], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Env, Path]:
    """The wheel with its redis and contract extras, and the plug-in installed from its own
    folder (a copy, where it is built); the virtualenv and that folder."""
    env = installed("redis,contract")
    source = tmp_path_factory.mktemp("plugin") / "outbox_redis_list"
    shutil.copytree(FIXTURE, source)  # built where it is copied, not in the checkout
    done = env.run(
        [str(env.python), "-m", "pip", "install", "-q", str(source)],
        cwd=source.parent,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return env, source


def test_the_plugin_passes_the_contract_suite(with_plugin: tuple[Env, Path]) -> None:
    require_port(6379, "redis")
    env, folder = with_plugin
    done = env.run(
        [str(env.python), "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests"],
        cwd=folder,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout
    assert "failed" not in done.stdout
    assert "redis-list has no broker-side dedup" in done.stdout  # derived from its features


def test_the_relay_takes_the_plugin_scheme(
    with_plugin: tuple[Env, Path], project: Path, empty_database_url: str
) -> None:
    require_port(6379, "redis")
    env, _ = with_plugin
    outbox = str(env.bin / "outbox")
    helped = env.run([outbox, "relay", "--help"], cwd=project)
    assert helped.returncode == 0, helped.stderr
    assert "redis-list://" in " ".join(helped.stdout.split())
    url = sqlalchemy_url(empty_database_url).render_as_string(hide_password=False)
    migrated = env.run([outbox, "migrate", "upgrade", "--url", url], cwd=project)
    assert migrated.returncode == 0, migrated.stderr
    checked = env.run(
        [outbox, "relay", "check", "--url", url, "--broker", BROKER], cwd=project
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    refused = env.run(
        [outbox, "relay", "check", "--url", url, "--broker", "redis-lists://h"], cwd=project
    )
    assert refused.returncode == 2
    assert "unknown broker URL 'redis-lists://h'" in refused.stderr
    assert "redis-list://" in refused.stderr


_CONSUME = textwrap.dedent(
    """
    import asyncio, sys, uuid

    from psycopg_pool import AsyncConnectionPool

    from inbox import AsyncHandlerRunner
    from inbox.testing import ResultLog
    from outbox.brokers import plugin_for_scheme
    from outbox.envelope import Envelope
    from relay.brokers import publisher_for_url

    URL, BROKER = sys.argv[1], sys.argv[2]
    LIST = f"plugin-{{uuid.uuid4().hex[:8]}}"

    async def main():
        sent = [Envelope(id=uuid.uuid4(), topic="orders", key=f"k{{i % 3}}", seq=i // 3 + 1,
                         payload=b'{{"n": %d}}' % i) for i in range(12)]
        pub = publisher_for_url(BROKER, destinations={{"orders": LIST}})
        await pub.start()
        assert await pub.publish_batch(sent + sent[:2]) == [None] * 14  # two sent twice
        await pub.close()
        applied = []

        async def handler(conn, envelope):
            applied.append((envelope.key, envelope.seq))

        consumer_class = plugin_for_scheme("redis-list").load("consumer")
        async with AsyncConnectionPool(URL, open=False) as pool:
            log = ResultLog()
            consumer = consumer_class(AsyncHandlerRunner(pool, handler, consumer="c"),
                                      key=LIST, on_result=log)
            task = asyncio.create_task(consumer.run())
            await log.wait_processed([e.id for e in sent], within=30)
            consumer.stop()
            await task
        for key in ("k0", "k1", "k2"):
            seqs = [s for k, s in applied if k == key]
            assert seqs == [1, 2, 3, 4], (key, seqs)
        print("applied", len(applied))

    asyncio.run(main())
    """
)


def test_the_plugin_consumer_applies_what_its_publisher_sent(
    with_plugin: tuple[Env, Path], project: Path, empty_database_url: str
) -> None:
    require_port(6379, "redis")
    env, _ = with_plugin
    url = sqlalchemy_url(empty_database_url).render_as_string(hide_password=False)
    outbox = str(env.bin / "outbox")
    migrated = env.run([outbox, "migrate", "upgrade", "--url", url], cwd=project)
    assert migrated.returncode == 0, migrated.stderr
    done = env.run(
        [str(env.python), "-c", _CONSUME.format(), empty_database_url, BROKER],
        cwd=project,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert done.stdout.strip() == "applied 12"
