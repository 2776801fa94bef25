"""``events.traceparent`` and ``events.tracestate``: the trace context each event was published with.

The CloudEvents Distributed Tracing extension of the envelope (W3C Trace Context) is kept with the
event, so whoever reads the journal (the event API, the console, the live tail) can go from an event
to its trace. Two nullable text columns: no rewrite of existing rows (PostgreSQL adds them in place;
SQLite's ``ALTER TABLE … ADD COLUMN`` too), which keep ``NULL`` -- their context was not stored.

Revision ID: 0004_trace
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_trace"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None

#: What :func:`downgrade` loses (``temporality-journal downgrade`` says so; ``None``: nothing).
DOWNGRADE_LOSES: str | None = (
    "every stored event's traceparent and tracestate: events keep null there after the next upgrade, until a "
    "rebuild (`temporality-journal rebuild`) restores them from the stream"
)


def upgrade() -> None:
    op.add_column("events", sa.Column("traceparent", sa.String(), nullable=True))
    op.add_column("events", sa.Column("tracestate", sa.String(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.drop_column("tracestate")
        batch.drop_column("traceparent")
