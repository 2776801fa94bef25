"""``asks``: one row per ``ask_agent`` request, projected from the ``agent.*`` events (COL-9).

Created empty: the events are in ``events`` already, but this revision does not back-fill from them
(``temporality-journal rebuild`` replays the stream and fills it, docs/journal.md).

Revision ID: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None

#: What :func:`downgrade` loses (``temporality-journal downgrade`` says so; ``None``: nothing).
DOWNGRADE_LOSES: str | None = (
    "the asks table (agent asks, COL-9) and the index on runs.finished_at: after the next upgrade the table is "
    "empty until a rebuild (`temporality-journal rebuild`) fills it from the stream"
)


def upgrade() -> None:
    op.create_table(
        "asks",
        sa.Column("request_id", sa.String(), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("correlation_id", sa.String(), nullable=True),
        sa.Column("asker_run_id", sa.String(), nullable=True),
        sa.Column("asker_agent", sa.String(), nullable=True),
        sa.Column("to_address", sa.String(), nullable=True),
        sa.Column("mode", sa.String(), nullable=True),
        sa.Column("timeout_s", sa.Integer(), nullable=True),
        sa.Column("message", sa.String(), nullable=True),
        sa.Column("truncated", sa.Boolean(), nullable=True),
        sa.Column("resolved_run_id", sa.String(), nullable=True),
        sa.Column("resolved_agent", sa.String(), nullable=True),
        sa.Column("recipient_run_id", sa.String(), nullable=True),
        sa.Column("relay", sa.Boolean(), nullable=True),
        sa.Column("relay_run", sa.String(), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("replier_run_id", sa.String(), nullable=True),
        sa.Column("replier_agent", sa.String(), nullable=True),
        sa.Column("outcome", sa.String(), nullable=True),
        sa.Column("answer", sa.String(), nullable=True),
        sa.Column("late", sa.Boolean(), nullable=True),
        sa.Column("waited_s", sa.Float(), nullable=True),
        sa.Column("reason", sa.String(), nullable=True),
        sa.Column("detail", sa.String(), nullable=True),
        sa.Column("asked_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("expired_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("replied_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_event_seq", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("request_id"),
    )
    op.create_index("ix_asks_state", "asks", ["state"])
    op.create_index("ix_asks_correlation_id", "asks", ["correlation_id"])
    op.create_index("ix_asks_asker_run_id", "asks", ["asker_run_id"])
    op.create_index("ix_asks_recipient_run_id", "asks", ["recipient_run_id"])
    op.create_index("ix_asks_asked_at", "asks", ["asked_at"])
    # Retention (temporality_journal.retention) looks up finished runs by when they finished.
    op.create_index("ix_runs_finished_at", "runs", ["finished_at"])


def downgrade() -> None:
    op.drop_index("ix_runs_finished_at", table_name="runs")
    op.drop_table("asks")
