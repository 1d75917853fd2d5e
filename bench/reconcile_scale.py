"""Scale evidence: the same reconciliation on a Spark standalone cluster, 1 vs 2 executors.

Starts a standalone master and two one-core workers from the pyspark installation (as
``tests/spark/conftest.py`` does: ``spark-class`` in the foreground, free ports on 127.0.0.1,
stopped by pid), seeds (or reuses, ``--reuse``) the databases of ``bench/reconcile.py``, then for
1 and for 2 executors (one core each, ``spark.cores.max``) runs in one application each, side by
side:

  floor : the job's own JDBC reads, every column hashed (``reconcile._read_floor``)
  full  : the whole reconciliation of the 10 days
  night : the reconciliation of the last day

each ``--repeat`` times (the fastest is reported, every time is kept), after one untimed night
to warm the executors' JVMs. For every phase it also records what bounds it: the CPU seconds
PostgreSQL spent (its live processes plus what the postmaster reaped), the CPU seconds of the
whole machine, and so how many of the machine's cores were busy on average, and the CPU seconds
of the executors, the driver's JVM, the Spark daemons and the driver's Python.

Usage: python bench/reconcile_scale.py [--sizes 1000000] [--reuse] [--repeat 2]
                                       [--name reconcile_scale]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import write_result
from reconcile import _databases, _drop, _read_floor, configs

from spark_ingest import reconcile, spark_session
from tests.support.spark_standalone import standalone

_TICK = os.sysconf("SC_CLK_TCK")


@contextmanager
def cluster_of(workers: int, root: Path, memory: str = "4g") -> Iterator[dict[str, Any]]:
    """A master and ``workers`` one-core workers (tests/support/spark_standalone.py); yields the
    master URL and the web UI. The driver runs in this process: it binds where the cluster's
    spark-defaults.conf says."""
    with standalone(root, workers=workers, worker_memory=memory) as cluster:
        os.environ["SPARK_CONF_DIR"] = cluster.driver_env["SPARK_CONF_DIR"]
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
        yield {"master": cluster.master_url, "webui": cluster.webui}


def _postgres_cpu() -> float:
    """CPU seconds of PostgreSQL so far: its live processes, plus the postmaster's reaped
    children (backends that have exited: their time is added to the parent's cutime/cstime)."""
    total = 0
    pids = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            raw = (d / "stat").read_text()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        if comm.startswith("postgres"):
            pids[int(d.name)] = (int(fields[1]), fields)
    for _pid, (ppid, fields) in pids.items():
        total += int(fields[11]) + int(fields[12])  # utime, stime
        if ppid not in pids:  # the postmaster
            total += int(fields[13]) + int(fields[14])  # cutime, cstime
    return total / _TICK


_KINDS = (
    ("executor", b"CoarseGrainedExecutorBackend"),
    ("driver_jvm", b"pyspark-shell"),  # first: its command line names deploy.SparkSubmit
    ("spark_daemons", b"org.apache.spark.deploy."),
)


def _cpu_by_kind() -> dict[str, float]:
    """CPU seconds so far of the live JVMs by role (executors, master and workers, the driver's
    JVM) and of this Python process; PostgreSQL is ``_postgres_cpu``."""
    out = dict.fromkeys([k for k, _ in _KINDS], 0.0) | {"driver_python": 0.0}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
            raw = (d / "stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        cpu = (int(fields[11]) + int(fields[12])) / _TICK
        if int(d.name) == os.getpid():
            out["driver_python"] += cpu
            continue
        for kind, marker in _KINDS:
            if marker in cmd:
                out[kind] += cpu
                break
    return out


def _machine_cpu() -> float:
    """Busy CPU seconds of the whole machine so far (every state but idle and iowait)."""
    parts = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(parts[:8]) - parts[3] - parts[4]) / _TICK


def _measured(fn: Callable[[], Any]) -> tuple[dict[str, float], Any]:
    kinds, pg, busy, start = _cpu_by_kind(), _postgres_cpu(), _machine_cpu(), time.perf_counter()
    value = fn()
    wall = time.perf_counter() - start
    pg, busy = _postgres_cpu() - pg, _machine_cpu() - busy
    after = _cpu_by_kind()
    mine = {k: after[k] - kinds[k] for k in after}
    return {
        **{f"{k}_cpu_s": round(v, 2) for k, v in mine.items()},
        # Everything else on the machine (other work running beside the bench).
        "other_cpu_s": round(busy - pg - sum(mine.values()), 2),
        "s": round(wall, 2),
        "postgres_cpu_s": round(pg, 2),
        "machine_cpu_s": round(busy, 2),
        "cores_busy": round(busy / wall, 2),
        "postgres_cores": round(pg / wall, 2),
    }, value


def _executors(spark: Any) -> int:
    return int(spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()) - 1


def run_executors(
    master: str, executors: int, urls: dict[str, str], out: Path, repeat: int
) -> dict[str, Any]:
    conf = {
        "spark.cores.max": str(executors),
        "spark.executor.cores": "1",
        "spark.executor.memory": "3g",
        "spark.driver.memory": "2g",
        "spark.sql.shuffle.partitions": "16",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "60s",
    }
    spark = spark_session(master=master, extra_conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        deadline = time.monotonic() + 60
        while _executors(spark) < executors and time.monotonic() < deadline:
            time.sleep(0.5)
        full, night = configs(urls)
        reconcile(spark, night, out, record=False)  # warm the executors' JVMs (JIT, JDBC)
        runs: dict[str, list[dict[str, float]]] = {"floor": [], "full": [], "night": []}
        counts: dict[str, Any] = {}
        for _ in range(repeat):
            m, rows = _measured(lambda: _read_floor(spark, full))
            runs["floor"].append(m | {"rows": rows})
            m, result = _measured(lambda: reconcile(spark, full, out))
            runs["full"].append(m)
            counts = result.summary["counts"]
            m, _ = _measured(lambda: reconcile(spark, night, out))
            runs["night"].append(m)
        best = {k: min(v, key=lambda m: m["s"]) for k, v in runs.items()}
        return {
            "executors": executors,
            "executors_registered": _executors(spark),
            "floor_s": best["floor"]["s"],
            "full_s": best["full"]["s"],
            "night_s": best["night"]["s"],
            "ratio_full_over_floor": round(best["full"]["s"] / best["floor"]["s"], 2),
            "ratio_night_over_full": round(best["night"]["s"] / best["full"]["s"], 3),
            "best": best,
            "runs": runs,
            "counts": {
                k: counts[k] for k in ("pairs", "delivered", "lost", "phantom", "duplicate")
            },
        }
    finally:
        spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000000")
    parser.add_argument("--reuse", action="store_true", help="keep seeded databases")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--name", default="reconcile_scale")
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    root = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    try:
        with cluster_of(2, root) as cluster:
            for n in (int(s) for s in args.sizes.split(",")):
                names, urls, seed_s = _databases(n, args.reuse)
                try:
                    per = [
                        run_executors(cluster["master"], k, urls, root / "out", args.repeat)
                        for k in (1, 2)
                    ]
                finally:
                    if not args.reuse:
                        for name in names.values():
                            _drop(name)
                one, two = per
                results.append(
                    {
                        "messages": n,
                        "seed_s": None if seed_s is None else round(seed_s, 1),
                        "by_executors": per,
                        "speedup_2_over_1": {
                            k: round(one[f"{k}_s"] / two[f"{k}_s"], 2)
                            for k in ("floor", "full", "night")
                        },
                    }
                )
                print(json.dumps(results[-1]["speedup_2_over_1"]), flush=True)
                _write(args.name, results)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"wrote {_write(args.name, results)}")


def _write(name: str, results: list[dict[str, Any]]) -> Path:
    return write_result(
        name,
        {
            "setup": "Spark standalone master + two workers (1 core, 4g each) on this 2-core box, "
            "client-mode driver in the bench process (2g), executors of 1 core / 3g, "
            "spark.cores.max = executors, spark.sql.shuffle.partitions 16 (AQE), 2 JDBC "
            "partitions per source; PostgreSQL and the driver share the same two cores. "
            "Each figure is the fastest of --repeat runs (all in 'runs'); cpu figures "
            "from /proc (postgres: live processes + reaped backends)",
            "sizes": results,
        },
    )


if __name__ == "__main__":
    main()
