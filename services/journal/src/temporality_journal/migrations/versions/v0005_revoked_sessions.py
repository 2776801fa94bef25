"""``revoked_sessions``: the sign-in sessions signed out before they expired (:mod:`temporality_journal.revocation`).

A new table, nothing rewritten. It is not part of the read model (the streams hold no sign-outs), so
``temporality-journal rebuild`` keeps it while it drops the rest: when the migrations run again after a
rebuild the table is already there and this revision leaves it as it is.

Revision ID: 0005_revoked
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_revoked"
down_revision: str | None = "0004_trace"
branch_labels: str | None = None
depends_on: str | None = None

#: What :func:`downgrade` loses (``temporality-journal downgrade`` says so; ``None``: nothing).
DOWNGRADE_LOSES: str | None = (
    "the console sign-outs (revoked_sessions, in no stream): a copy of a cookie signed out before is accepted again "
    "until it expires (also while the older journal, which does not check sign-outs, runs)"
)


def upgrade() -> None:
    if sa.inspect(op.get_bind()).has_table("revoked_sessions"):
        return  # kept across a rebuild (see the docstring)
    op.create_table(
        "revoked_sessions",
        sa.Column("session_id", sa.String(length=64), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("session_id"),
    )
    op.create_index("ix_revoked_sessions_expires_at", "revoked_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_revoked_sessions_expires_at", table_name="revoked_sessions")
    op.drop_table("revoked_sessions")
