#!/usr/bin/env python3
"""Build the API reference of outbox-inbox from its docstrings (pdoc), then check it.

    python tools/api_reference.py                 # writes build/api/ (index.html)
    python tools/api_reference.py --out DIR

Documented: every module of :data:`MODULES`, each with the names of its ``__all__`` (the public
API: ``outbox``, ``inbox``, ``relay`` and their public modules). The build fails (exit 1) when

* a public name has no entry on its module's page, or a public class or function has no
  docstring of its own;
* a link of the reference leads nowhere: a page that was not written, or an anchor that is not
  on its page (links to other sites are not followed: the build runs offline).

CI runs it (.ci/run); docs/reference/api.md says how to read the result.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import shutil
import sys
import warnings
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parent.parent

#: the modules whose ``__all__`` is the public API, in the order of the index
MODULES = (
    "outbox",
    "outbox.envelope",
    "outbox.exceptions",
    "outbox.schema",
    "outbox.trace",
    "outbox.wire",
    "outbox.amqp1_reactor",
    "outbox.kit",
    "outbox.fastapi",
    "inbox",
    "inbox.admin",
    "inbox.exceptions",
    "inbox.testing",
    "relay",
    "relay.admin",
    "relay.fleet",
    "relay.exceptions",
    "relay.brokers",
    "relay.brokers.base",
)


class _Page(HTMLParser):
    """The ids a page defines and the links it holds."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name == "id" and value:
                self.ids.add(value)
            if name == "href" and value is not None and tag == "a":
                self.links.append(value)


def _read(page: Path) -> _Page:
    parsed = _Page()
    parsed.feed(page.read_text(encoding="utf-8"))
    return parsed


def build(out: Path) -> None:
    import pdoc
    import pdoc.render

    if out.exists():
        shutil.rmtree(out)
    pdoc.render.configure(docformat="restructuredtext", show_source=False, search=True)
    with warnings.catch_warnings():
        # annotations named only under TYPE_CHECKING (SQLAlchemy's Session in Target, say)
        # are shown as written: pdoc warns that it cannot import them, and that is all
        warnings.filterwarnings("ignore", "Error parsing type annotation", UserWarning)
        pdoc.pdoc(*MODULES, output_directory=out)


def page_of(module: str, out: Path) -> Path:
    return out.joinpath(*module.split(".")).with_suffix(".html")


def missing_entries(out: Path) -> list[str]:
    """Public names without an entry on their page, or without a docstring of their own."""
    problems = []
    for name in MODULES:
        module = importlib.import_module(name)
        page = page_of(name, out)
        if not page.is_file():
            problems.append(f"{name}: no page ({page.relative_to(out)})")
            continue
        ids = _read(page).ids
        for public in getattr(module, "__all__", ()):
            obj = getattr(module, public)
            if inspect.ismodule(obj):  # a submodule: a page of its own
                if not page_of(obj.__name__, out).is_file():
                    problems.append(f"{name}.{public}: no page for module {obj.__name__}")
                continue
            if public not in ids:
                problems.append(f"{name}.{public}: no entry on {page.relative_to(out)}")
            own = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
            if (inspect.isclass(obj) or inspect.isroutine(obj)) and not (own or "").strip():
                problems.append(f"{name}.{public}: no docstring")
    return problems


def broken_links(out: Path) -> list[str]:
    """Links between the pages that lead to no page, or to no anchor on it."""
    pages = {page: _read(page) for page in out.rglob("*.html")}
    broken = []
    for page, parsed in pages.items():
        for link in parsed.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith("mailto:"):
                continue  # another site: not followed offline
            target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            if target not in pages:
                broken.append(f"{page.relative_to(out)}: {link} (no such page)")
            elif parts.fragment and unquote(parts.fragment) not in pages[target].ids:
                broken.append(f"{page.relative_to(out)}: {link} (no such anchor)")
    return sorted(set(broken))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "api")
    args = parser.parse_args(argv)
    out = args.out.resolve()  # the link check compares resolved paths
    build(out)
    problems = missing_entries(out) + broken_links(out)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"API reference: {page_of(MODULES[0], out).parent / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
