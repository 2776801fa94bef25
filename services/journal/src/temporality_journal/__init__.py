"""The journal: every CloudEvent into SQL (SQLite or PostgreSQL), runs projected from them, a query API.

Modules: :mod:`.recorder` (the batched, idempotent ingest), :mod:`.projection` (runs from events, pure),
:mod:`.asks` (agent asks from the ``agent.*`` events, pure), :mod:`.audit` (the audit trail's kinds, pure),
:mod:`.retention` (the purge of finished runs),
:mod:`.api` (the JSON API behind role tokens, the cancel request, the console's static files),
:mod:`.tail` (the live tail over Server-Sent Events), :mod:`.insights` (trigger and human analytics,
pure); ``console/`` holds the web console (docs/console.md). docs/journal.md documents the API.
"""

from temporality_journal.api import create_app
from temporality_journal.database import Database, async_url
from temporality_journal.models import EventRecord, RunRecord, RunSnapshot
from temporality_journal.projection import PROJECTED_TYPES, project, run_id_of
from temporality_journal.recorder import Recorder
from temporality_journal.settings import DEFAULT_DATABASE_URL, Settings
from temporality_journal.tail import Changes, Tail

__all__ = [
    "DEFAULT_DATABASE_URL",
    "PROJECTED_TYPES",
    "Changes",
    "Database",
    "EventRecord",
    "Recorder",
    "RunRecord",
    "RunSnapshot",
    "Settings",
    "Tail",
    "async_url",
    "create_app",
    "project",
    "run_id_of",
]
