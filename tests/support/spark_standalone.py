"""A Spark standalone cluster run from the pyspark installation, for the tests and the benches.

A master and one-core workers, started with ``spark-class`` in the foreground (the pid is the
JVM's: the script execs java) on free ports of 127.0.0.1, and stopped by pid, SIGTERM then
SIGKILL. Nothing is downloaded. The driver's settings go to a ``spark-defaults.conf`` of the
cluster's own (what a user puts on the machine the driver runs on).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ClusterError", "StandaloneCluster", "spark_class", "standalone"]


class ClusterError(RuntimeError):
    """The cluster did not come up; the message holds the tail of each daemon's log."""


@dataclass
class StandaloneCluster:
    """A running master and its workers."""

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


def spark_class() -> Path:
    """The pyspark installation's launcher."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "bin" / "spark-class"


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


@contextmanager
def standalone(
    root: Path,
    *,
    workers: int = 2,
    worker_memory: str = "1g",
    driver_defaults: Mapping[str, str] | None = None,
    drop_env: Iterable[str] = (),
) -> Iterator[StandaloneCluster]:
    """Start a master and ``workers`` one-core workers under ``root``; stop them on exit.

    ``driver_defaults`` go to the cluster's spark-defaults.conf (after the driver's address);
    ``drop_env`` names variables of this process the daemons must not inherit.
    """
    launcher = spark_class()
    spark_home = launcher.parent.parent
    conf_dir = root / "conf"
    conf_dir.mkdir(parents=True, exist_ok=True)
    defaults = {
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        **(driver_defaults or {}),
    }
    (conf_dir / "spark-defaults.conf").write_text(
        "".join(f"{k} {v}\n" for k, v in defaults.items())
    )
    port, webui_port, *worker_ui = _free_ports(2 + workers)
    dropped = set(drop_env)
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SPARK_", "PYSPARK_")) and k not in dropped
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
                    [str(launcher), *args], env=env, stdout=out, stderr=subprocess.STDOUT
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
                    *("--memory", worker_memory, "--host", "127.0.0.1"),
                    *("--webui-port", str(ui), "--work-dir", str(work)),
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
            if len(alive) == workers:
                break
            if dead or time.monotonic() > deadline:
                detail = "\n".join(f"--- {log.name}\n{_tail(log)}" for log in logs)
                raise ClusterError(
                    f"{len(alive)} of {workers} workers alive, exited: {dead or 'none'}\n{detail}"
                )
            time.sleep(0.5)
        yield cluster
    finally:
        for proc in reversed(procs):
            _stop(proc)
