"""The journal: every CloudEvent into SQL (SQLite or PostgreSQL), runs projected from them, a query API."""

from temporality_journal.api import create_app
from temporality_journal.database import Database, async_url
from temporality_journal.models import EventRecord, RunRecord, RunSnapshot
from temporality_journal.projection import PROJECTED_TYPES, project, run_id_of
from temporality_journal.recorder import Recorder
from temporality_journal.settings import DEFAULT_DATABASE_URL, Settings

__all__ = [
    "DEFAULT_DATABASE_URL",
    "PROJECTED_TYPES",
    "Database",
    "EventRecord",
    "Recorder",
    "RunRecord",
    "RunSnapshot",
    "Settings",
    "async_url",
    "create_app",
    "project",
    "run_id_of",
]
