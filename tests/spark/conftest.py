"""One real SparkSession (local[2]) for the whole run, a standalone cluster, inbox databases.

The JVM takes ~10 s to start, so every Spark test shares the session-scoped ``spark`` fixture;
the cluster tests share ``spark_cluster`` (a master and two workers, started only when asked).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from harness import PgServer
from services import import_or_missing, missing
from spark_plant import RECON_PASSWORD_ENV

import_or_missing("pyspark", "spark")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from spark_ingest import find_jdbc_jar, spark_session
    from spark_ingest._errors import JdbcDriverNotFoundError

    try:
        find_jdbc_jar()
    except JdbcDriverNotFoundError as exc:
        missing("the PostgreSQL JDBC driver", str(exc))
    session = spark_session(
        master="local[2]",
        extra_conf={
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.driver.memory": "1g",
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def inbox_urls(pg_server: PgServer, template_db: str) -> Iterator[tuple[str, str]]:
    """Two more fresh migrated databases: each consuming service keeps its own inbox."""
    with (
        pg_server.fresh_database(template=template_db) as a,
        pg_server.fresh_database(template=template_db) as b,
    ):
        yield a, b


@dataclass
class StandaloneCluster:
    """A Spark standalone master and two one-core workers, run from the pyspark installation."""

    spark_home: Path
    master_url: str
    webui: str
    worker_dirs: list[Path]
    #: Environment for a driver run against the cluster (its own SPARK_CONF_DIR, 127.0.0.1).
    driver_env: dict[str, str]

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.webui}/json/", timeout=5) as response:
            state: dict[str, Any] = json.load(response)
        return state

    def executor_dirs(self, app_id: str) -> list[Path]:
        """The work directories the workers made for ``app_id``'s executors."""
        return sorted(p for d in self.worker_dirs for p in (d / app_id).glob("*") if p.is_dir())


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)


def _tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return "\n".join(text.splitlines()[-lines:])


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A standalone master and two workers (1 core, 1 GiB each) on free ports of 127.0.0.1.

    Started with ``spark-class`` in the foreground (the pid is the JVM's: the script execs
    java) and stopped by pid, SIGTERM then SIGKILL. Nothing is downloaded.
    """
    import pyspark

    from spark_ingest import find_jdbc_jar
    from spark_ingest._errors import JdbcDriverNotFoundError

    try:
        find_jdbc_jar()
    except JdbcDriverNotFoundError as exc:
        missing("the PostgreSQL JDBC driver", str(exc))
    spark_home = Path(pyspark.__file__).resolve().parent
    spark_class = spark_home / "bin" / "spark-class"
    if not os.access(spark_class, os.X_OK):
        missing("Spark's launcher", f"{spark_class} is not there or not executable")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        missing("Java", "install a JDK 17+ (apt-get install openjdk-17-jre-headless)")
    root = tmp_path_factory.mktemp("spark-cluster")
    conf_dir = root / "conf"
    conf_dir.mkdir()
    # What a user puts in spark-defaults.conf on the machine the driver runs on.
    (conf_dir / "spark-defaults.conf").write_text(
        "spark.driver.host 127.0.0.1\n"
        "spark.driver.bindAddress 127.0.0.1\n"
        "spark.driver.memory 512m\n"
        "spark.executor.memory 512m\n"
    )
    port, webui_port, *worker_ui = _free_ports(4)
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SPARK_", "PYSPARK_")) and k != RECON_PASSWORD_ENV
    }
    base |= {
        "SPARK_HOME": str(spark_home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_CONF_DIR": str(conf_dir),
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_DAEMON_MEMORY": "256m",
    }
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []

    def start(name: str, args: list[str], env: dict[str, str]) -> None:
        log = root / f"{name}.log"
        logs.append(log)
        with log.open("wb") as out:
            procs.append(
                subprocess.Popen(
                    [str(spark_class), *args], env=env, stdout=out, stderr=subprocess.STDOUT
                )
            )

    master_url = f"spark://127.0.0.1:{port}"
    try:
        start(
            "master",
            [
                *("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"),
                *("--port", str(port), "--webui-port", str(webui_port)),
            ],
            base | {"SPARK_LOCAL_DIRS": str(root / "master-local")},
        )
        worker_dirs = []
        for i, ui in enumerate(worker_ui):
            work = root / f"worker{i}"
            worker_dirs.append(work)
            start(
                f"worker{i}",
                [
                    *("org.apache.spark.deploy.worker.Worker", master_url, "--cores", "1"),
                    *("--memory", "1g", "--host", "127.0.0.1", "--webui-port", str(ui)),
                    *("--work-dir", str(work)),
                ],
                base | {"SPARK_WORKER_DIR": str(work), "SPARK_LOCAL_DIRS": str(root / f"l{i}")},
            )
        cluster = StandaloneCluster(
            spark_home, master_url, f"http://127.0.0.1:{webui_port}", worker_dirs, base
        )
        deadline = time.monotonic() + 90
        while True:
            dead = [log.stem for p, log in zip(procs, logs, strict=True) if p.poll() is not None]
            try:
                alive = [w for w in cluster.state()["workers"] if w["state"] == "ALIVE"]
            except (OSError, ValueError):
                alive = []
            if len(alive) == 2:
                break
            if dead or time.monotonic() > deadline:
                detail = "\n".join(f"--- {log.name}\n{_tail(log)}" for log in logs)
                missing(
                    "a Spark standalone cluster",
                    f"{len(alive)} of 2 workers alive, exited: {dead or 'none'}\n{detail}",
                )
            time.sleep(0.5)
        yield cluster
    finally:
        for proc in reversed(procs):
            _stop(proc)
