"""Duplicated code across the packages does not grow.

A pair is two places (two files, or two places of one file) that share a run of six or more
identical lines, blank lines, comments, imports and lone punctuation aside and white space
folded; a pair of files counts once however many runs they share. Generated modules (``*_sync.py``
from ``tools/async_to_sync.py``) are left out, and so is a run that stands in more than eight
places (the shape of a definition, not logic). The ``duplicates`` tool (not installed in CI) counts
the same way, plus pairs alike only in shape.

``MAX_PAIRS`` is the count when this test was written: lower it as pairs are folded into one
piece of code; a change that copies code again fails here. Several pairs left are the relay's broker
adapters' connect and send loops (``relay/brokers/<broker>.py``).
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("outbox", "inbox", "relay", "spark_ingest", "outbox_console")
RUN = 6
TOO_COMMON = 8
MAX_PAIRS = 20

_SKIP = re.compile(r"^(#.*|from \S+ import .*|import \S.*|[()\[\]{},:;]*)$")


def _lines(path: Path) -> list[tuple[int, str]]:
    kept = []
    in_import = False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        text = " ".join(line.split())
        if in_import:
            in_import = not text.startswith(")")
        elif re.match(r"from \S+ import \($", text):
            in_import = True
        elif text and not _SKIP.match(text):
            kept.append((n, text))
    return kept


def duplicated_pairs(paths: list[Path]) -> set[tuple[str, int, str, int]]:
    """Pairs of places sharing an identical run: (file, first line, file, first line), one
    row per pair of files (per pair of distinct places within one file)."""
    places: dict[tuple[str, ...], list[tuple[str, int]]] = defaultdict(list)
    for path in paths:
        lines = _lines(path)
        where = str(path.relative_to(ROOT))
        for i in range(len(lines) - RUN + 1):
            window = tuple(text for _, text in lines[i : i + RUN])
            places[window].append((where, lines[i][0]))
    pairs: dict[tuple[str, str], tuple[str, int, str, int]] = {}
    for found in places.values():
        if len(found) < 2 or len(found) > TOO_COMMON:
            continue
        for a in range(len(found)):
            for b in range(a + 1, len(found)):
                (fa, la), (fb, lb) = sorted((found[a], found[b]))
                if fa == fb and abs(la - lb) < RUN:
                    continue  # one run overlapping itself
                pairs.setdefault((fa, fb), (fa, la, fb, lb))
    return set(pairs.values())


def _sources() -> list[Path]:
    return [
        path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if not path.name.endswith("_sync.py")
    ]


def test_duplicated_code_does_not_grow() -> None:
    pairs = sorted(duplicated_pairs(_sources()))
    assert len(pairs) <= MAX_PAIRS, "\n".join(f"{a}:{la} ~ {b}:{lb}" for a, la, b, lb in pairs)


def test_the_count_sees_a_copied_function(tmp_path: Path) -> None:
    body = "".join(f"    total = total + {i} * factor\n" for i in range(RUN))
    first, second = ROOT / "tests" / "_dup_a.py", ROOT / "tests" / "_dup_b.py"
    try:
        first.write_text(f"def a(total, factor):\n{body}    return total\n")
        second.write_text(f"def b(total, factor):\n{body}    return total\n")
        assert duplicated_pairs([first, second]) == {("tests/_dup_a.py", 2, "tests/_dup_b.py", 2)}
        second.write_text(f"def b(total, factor):\n{body[: len(body) // 2]}    return total\n")
        assert duplicated_pairs([first, second]) == set()
    finally:
        first.unlink(missing_ok=True)
        second.unlink(missing_ok=True)
