"""Alembic's environment for the journal: always run on the connection the journal hands over.

:func:`temporality_journal.database.upgrade` puts a synchronous connection (``AsyncConnection.run_sync``)
into ``config.attributes["connection"]``; there is no ``alembic.ini`` and no offline (SQL script) mode.
SQLite gets batch mode (``ALTER TABLE`` through table copies) for future migrations.
"""

from __future__ import annotations

from alembic import context

from temporality_journal.models import JournalModel

VERSION_TABLE = "journal_schema_version"

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=JournalModel.metadata,
    version_table=VERSION_TABLE,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
