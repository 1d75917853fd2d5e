"""A reconciliation run's HTML report (``/runs/{run_id}/report``), served only from the
console's reports directory (``--reports-dir``)."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Route

from outbox_console._state import console_of

__all__ = ["report_file", "routes"]

log = logging.getLogger("outbox.console")


def report_file(root: Path, named: str) -> Path | None:
    """The report file ``named`` (a run's row) if it resolves, symlinks followed, to a file
    inside ``root``; None otherwise."""
    try:
        path = (root / named).resolve(strict=True)
    except (OSError, ValueError, RuntimeError):  # missing, a NUL byte, a symlink loop
        return None
    return path if path.is_relative_to(root) and path.is_file() else None


async def report(request: Request) -> Response:
    console = console_of(request)
    try:
        run_id = uuid.UUID(request.path_params["run_id"])
    except ValueError:
        return console.pages.problem(request, 404, "no such run")
    reports = console.settings.reports
    if reports is None:
        return console.pages.problem(
            request,
            404,
            "this console serves no reports: start it with --reports-dir (the directory "
            "the reconciliation writes its runs into)",
        )
    named = await console.data.report_of(run_id)
    path = report_file(reports, named) if named else None
    if path is None:
        if named:
            log.warning(
                "console: the report of run %s (%r) is not a file inside %s: not served",
                run_id,
                named[:300],
                reports,
            )
        return console.pages.problem(
            request, 404, f"the report of run {run_id} is not in the console's reports directory"
        )
    return FileResponse(path, media_type="text/html")


routes = [Route("/runs/{run_id}/report", report)]
