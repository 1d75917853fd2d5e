"""Where a Spark application's time went, from its event log (spark.eventLog.enabled).

Usage: python bench/spark_events.py EVENT_LOG (file or eventlog_v2_* directory) [--json OUT]

Prints one line per job: id, wall time, stages and tasks, the call site that triggered it (the
Python line of the action), and the gaps between jobs (driver-side time: Python, JDBC horizon
queries, planning). Used to find repeated reads and needless actions in the reconciliation.
``--stages`` adds one line per stage: tasks, wall, the tasks' run and CPU seconds, shuffle MB.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _lines(path: Path) -> list[str]:
    """A plain event log file, or Spark 4's rolling ``eventlog_v2_*`` directory."""
    if path.is_file():
        return path.read_text().splitlines()
    files = sorted(path.glob("events_*"), key=lambda f: int(f.name.split("_")[1]))
    return [line for f in files for line in f.read_text().splitlines()]


def stages(path: Path) -> list[dict[str, Any]]:
    """One row per completed stage: its job, tasks, wall time, the tasks' run and CPU seconds
    and the shuffle bytes they wrote and read (from the task end events)."""
    rows: dict[int, dict[str, Any]] = {}
    job_of: dict[int, int] = {}
    for line in _lines(path):
        ev = json.loads(line)
        kind = ev["Event"]
        if kind == "SparkListenerJobStart":
            for sid in ev["Stage IDs"]:
                job_of[sid] = ev["Job ID"]
        elif kind == "SparkListenerTaskEnd":
            m = ev.get("Task Metrics") or {}
            row = rows.setdefault(ev["Stage ID"], {"run_ms": 0, "cpu_ns": 0, "w": 0, "r": 0})
            row["run_ms"] += m.get("Executor Run Time", 0)
            row["cpu_ns"] += m.get("Executor CPU Time", 0)
            row["w"] += (m.get("Shuffle Write Metrics") or {}).get("Shuffle Bytes Written", 0)
            read = m.get("Shuffle Read Metrics") or {}
            row["r"] += read.get("Remote Bytes Read", 0) + read.get("Local Bytes Read", 0)
        elif kind == "SparkListenerStageCompleted":
            info = ev["Stage Info"]
            row = rows.setdefault(info["Stage ID"], {"run_ms": 0, "cpu_ns": 0, "w": 0, "r": 0})
            row |= {
                "tasks": info["Number of Tasks"],
                "wall_s": round((info["Completion Time"] - info["Submission Time"]) / 1000, 2),
                "name": info.get("Stage Name", ""),
            }
    return [
        {
            "job": job_of.get(sid),
            "stage": sid,
            "tasks": r.get("tasks"),
            "wall_s": r.get("wall_s"),
            "task_run_s": round(r["run_ms"] / 1000, 2),
            "task_cpu_s": round(r["cpu_ns"] / 1e9, 2),
            "shuffle_write_mb": round(r["w"] / 1e6, 1),
            "shuffle_read_mb": round(r["r"] / 1e6, 1),
            "name": r.get("name", ""),
        }
        for sid, r in sorted(rows.items())
    ]


def summarise(path: Path) -> dict[str, Any]:
    """Jobs with their times, stage and task counts and call sites; totals."""
    jobs: dict[int, dict[str, Any]] = {}
    stage_tasks: dict[int, int] = {}
    stage_job: dict[int, int] = {}
    skipped: set[int] = set()
    app_start = app_end = None
    for line in _lines(path):
        ev = json.loads(line)
        kind = ev["Event"]
        if kind == "SparkListenerApplicationStart":
            app_start = ev["Timestamp"]
        elif kind == "SparkListenerApplicationEnd":
            app_end = ev["Timestamp"]
        elif kind == "SparkListenerJobStart":
            props = ev.get("Properties", {})
            jobs[ev["Job ID"]] = {
                "job": ev["Job ID"],
                "start": ev["Submission Time"],
                "stages": len(ev["Stage IDs"]),
                "call_site": props.get("callSite.short", ""),
                "description": props.get("spark.job.description", ""),
            }
            for sid in ev["Stage IDs"]:
                stage_job[sid] = ev["Job ID"]
                skipped.add(sid)
        elif kind == "SparkListenerJobEnd":
            jobs[ev["Job ID"]]["end"] = ev["Completion Time"]
        elif kind == "SparkListenerStageCompleted":
            info = ev["Stage Info"]
            skipped.discard(info["Stage ID"])
            stage_tasks[info["Stage ID"]] = info["Number of Tasks"]
    for sid, job in stage_job.items():
        if sid not in skipped:
            jobs[job]["tasks"] = jobs[job].get("tasks", 0) + stage_tasks.get(sid, 0)
            jobs[job]["stages_run"] = jobs[job].get("stages_run", 0) + 1
    ordered = [jobs[k] for k in sorted(jobs)]
    for j in ordered:
        j["seconds"] = round((j.get("end", j["start"]) - j["start"]) / 1000, 3)
    busy = sum(j["seconds"] for j in ordered)
    return {
        "jobs": ordered,
        "job_count": len(ordered),
        "job_seconds": round(busy, 2),
        "app_seconds": None
        if app_start is None or app_end is None
        else round((app_end - app_start) / 1000, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--stages", action="store_true", help="also one line per stage")
    args = parser.parse_args()
    doc = summarise(args.log)
    if args.stages:
        doc["stages"] = stages(args.log)
        for st in doc["stages"]:
            print(
                f"job {st['job']} stage {st['stage']:>4} tasks {st['tasks']} wall "
                f"{st['wall_s']}s run {st['task_run_s']}s cpu {st['task_cpu_s']}s "
                f"shuffle w {st['shuffle_write_mb']} MB r {st['shuffle_read_mb']} MB  {st['name']}"
            )
    prev_end = None
    for j in doc["jobs"]:
        gap = "" if prev_end is None else f"  (+{(j['start'] - prev_end) / 1000:.2f}s before)"
        print(
            f"job {j['job']:>3} {j['seconds']:>7.2f}s  stages {j.get('stages_run', 0)}/"
            f"{j['stages']}  tasks {j.get('tasks', 0):>4}  {j['call_site']}{gap}"
        )
        prev_end = j.get("end", j["start"])
    total = f"{doc['job_count']} jobs, {doc['job_seconds']} s inside jobs"
    print(f"{total}, app {doc['app_seconds']} s")
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
