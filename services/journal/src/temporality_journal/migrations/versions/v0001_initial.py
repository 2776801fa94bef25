"""The initial read model: ``events`` (every CloudEvent once) and ``runs`` (their projection).

The schema the journal created with ``create_all`` before migrations existed: such a database is
stamped with this revision, not re-created (:func:`temporality_journal.database.upgrade`).

Revision ID: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None

#: What :func:`downgrade` loses (``temporality-journal downgrade`` says so; ``None``: nothing).
DOWNGRADE_LOSES: str | None = "the whole read model (every table): not offered as a target, rebuild instead"


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("type", sa.String(), nullable=False),
        sa.Column("source", sa.String(), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("run_id", sa.String(), nullable=True),
        sa.Column("correlation_id", sa.String(), nullable=True),
        sa.Column("causation_id", sa.String(), nullable=True),
        sa.Column("actor", sa.String(), nullable=True),
        sa.Column("tenant", sa.String(), nullable=True),
        sa.Column("subject", sa.String(), nullable=True),
        sa.Column("stream_seq", sa.BigInteger(), nullable=False),
        sa.Column("data", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_events_run_id_stream_seq", "events", ["run_id", "stream_seq"])
    op.create_index("ix_events_type", "events", ["type"])
    op.create_index("ix_events_stream_seq", "events", ["stream_seq"])
    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("agent", sa.String(), nullable=True),
        sa.Column("title", sa.String(), nullable=True),
        sa.Column("trigger_id", sa.String(), nullable=True),
        sa.Column("launch_kind", sa.String(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("result", sa.String(), nullable=True),
        sa.Column("error", sa.String(), nullable=True),
        sa.Column("waiting_request_id", sa.String(), nullable=True),
        sa.Column("waiting_recipient", sa.String(), nullable=True),
        sa.Column("waiting_channel", sa.String(), nullable=True),
        sa.Column("waiting_since", sa.DateTime(timezone=True), nullable=True),
        sa.Column("waiting_question", sa.String(), nullable=True),
        sa.Column("last_event_seq", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("run_id"),
    )
    op.create_index("ix_runs_state", "runs", ["state"])
    op.create_index("ix_runs_created_at", "runs", ["created_at"])


def downgrade() -> None:
    op.drop_table("runs")
    op.drop_table("events")
