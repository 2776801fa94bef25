"""docs/journal.md's "Which events" table names every event type a subscriber can receive.

A subscriber filters on the families and types that table lists; a journal-subscriber review found 15 of the 60
types missing (``api.access_refused``, ``bus.permission_refused``, ``agent.task.*`` ...), so a subscriber built from
the docs silently missed them. The types are the published schemas' (``schemas/events/<type>.schema.json``, made from
the protocol's event models by ``make schemas``).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _documented() -> set[str]:
    text = (ROOT / "docs" / "journal.md").read_text(encoding="utf-8")
    table = text[text.index("**Which events**") : text.index("**How**: create a durable")]
    found: set[str] = set()
    for row in table.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        family = re.fullmatch(r"`([a-z_]+)\.[*>]`", cells[0]) if len(cells) == 3 else None
        if family is not None:
            found |= {f"{family[1]}.{t}" for t in re.findall(r"`([a-z_.]+)`", cells[1])}
    return found


def test_the_table_lists_every_published_event_type() -> None:
    published = {p.name.removesuffix(".schema.json") for p in (ROOT / "schemas" / "events").glob("*.schema.json")}
    assert len(published) > 50
    documented = _documented()
    assert published - documented == set(), "add them to docs/journal.md's 'Which events' table"
    assert documented - published == set(), "the table names types no schema publishes"
