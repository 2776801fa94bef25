"""``events.commit_seq``: the journal's commit order (the live tail's cursor), and ``commit_counter``.

JetStream's ``stream_seq`` is not the order in which events become visible in the journal (a
redelivery keeps its sequence; two replicas commit concurrently), so the live tail positions itself
by a number the recorder hands out in commit order instead (:mod:`temporality_journal.tail`).

Existing rows are numbered in stream order (``stream_seq``, then ``id``) with ``commit_seq`` equal to
``stream_seq`` wherever the stream sequences are distinct and increasing (always, for events the
journal recorded from the stream): an SSE client's ``Last-Event-ID`` from before the upgrade (a
stream sequence then) resumes where it was. In general the number is ``rn + max(0, max(stream_seq -
rn))`` over the rows so far (``rn`` = the row's rank): at least 1, strictly increasing, never below
``stream_seq``. ``commit_counter`` starts at the highest number given. One pass over ``events``
(PostgreSQL rewrites every row; SQLite copies the table to make the column ``NOT NULL``): a large
journal takes a while to start once.

Revision ID: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None

#: What :func:`downgrade` loses (``temporality-journal downgrade`` says so; ``None``: nothing).
DOWNGRADE_LOSES: str | None = (
    "events.commit_seq and commit_counter (the live tail's commit positions): the next upgrade numbers the stored "
    "events again in stream order, so a live-tail client resuming with a Last-Event-ID from before may get events "
    "again or miss some"
)

#: Numbers the existing rows (``UPDATE … FROM``: PostgreSQL, and SQLite since 3.33).
_NUMBER_EXISTING = """
UPDATE events SET commit_seq = numbered.position
FROM (
    SELECT id, rn + CASE WHEN lift > 0 THEN lift ELSE 0 END AS position
    FROM (
        SELECT id, rn, MAX(stream_seq - rn) OVER (ORDER BY rn) AS lift
        FROM (SELECT id, stream_seq, ROW_NUMBER() OVER (ORDER BY stream_seq, id) AS rn FROM events) AS ranked
    ) AS lifted
) AS numbered
WHERE events.id = numbered.id
"""


def upgrade() -> None:
    op.add_column("events", sa.Column("commit_seq", sa.BigInteger(), nullable=True))
    op.execute(_NUMBER_EXISTING)
    with op.batch_alter_table("events") as batch:
        batch.alter_column("commit_seq", existing_type=sa.BigInteger(), nullable=False)
    op.create_index("ix_events_commit_seq", "events", ["commit_seq"], unique=True)
    op.create_table(
        "commit_counter",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.execute("INSERT INTO commit_counter (id, last_seq) SELECT 1, COALESCE(MAX(commit_seq), 0) FROM events")


def downgrade() -> None:
    op.drop_table("commit_counter")
    op.drop_index("ix_events_commit_seq", table_name="events")
    with op.batch_alter_table("events") as batch:
        batch.drop_column("commit_seq")
