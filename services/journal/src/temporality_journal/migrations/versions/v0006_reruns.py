"""``runs.rerun_of`` and ``runs.rerun_requested_by``: which runs are reruns, of what, asked by whom.

A rerun (the trigger-gateway's ``POST …/deliveries/{d}/redrive`` with ``{"rerun": n}``) is a new run whose
``run.requested`` (and ``run.created``) carry ``launch.rerun_of`` (the run it runs again) and
``launch.requested_by`` (who asked). Two nullable text columns (no rewrite of the table: PostgreSQL and
SQLite add them in place) and an index on ``rerun_of`` (the reruns of a run: ``GET /runs?rerun_of=``).

The runs already projected are back-filled from their stored ``run.requested`` / ``run.created`` events (one
pass over the events of those two types that name a ``rerun_of``: few), so an upgraded journal shows its
existing reruns without a rebuild. A database whose ``runs`` has the columns already (made by ``create_all``
of this day and stamped at an older revision) is left as it is.

Revision ID: 0006_reruns
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_reruns"
down_revision: str | None = "0005_revoked"
branch_labels: str | None = None
depends_on: str | None = None

#: Nothing: the next upgrade back-fills both columns from the stored run events (as at the first upgrade).
DOWNGRADE_LOSES: str | None = None

#: The back-fill: each run's ``launch.rerun_of`` / ``launch.requested_by`` from its stored run events.
#: ``{rerun_of}`` and ``{requested_by}`` are the dialect's JSON path expressions on ``events.data``.
_BACKFILL = """
UPDATE runs SET rerun_of = found.rerun_of, rerun_requested_by = found.requested_by
FROM (
    SELECT run_id, MAX({rerun_of}) AS rerun_of, MAX({requested_by}) AS requested_by
    FROM events
    WHERE type IN ('run.requested', 'run.created') AND run_id IS NOT NULL AND {rerun_of} IS NOT NULL
    GROUP BY run_id
) AS found
WHERE runs.run_id = found.run_id AND runs.rerun_of IS NULL
"""


def _json_text(dialect: str, *path: str) -> str:
    if dialect == "postgresql":
        return f"(events.data #>> '{{{','.join(path)}}}')"
    return f"json_extract(events.data, '$.{'.'.join(path)}')"


def upgrade() -> None:
    bind = op.get_bind()
    columns = {column["name"] for column in sa.inspect(bind).get_columns("runs")}
    if "rerun_of" not in columns:
        op.add_column("runs", sa.Column("rerun_of", sa.String(), nullable=True))
    if "rerun_requested_by" not in columns:
        op.add_column("runs", sa.Column("rerun_requested_by", sa.String(), nullable=True))
    indexes = {index["name"] for index in sa.inspect(bind).get_indexes("runs")}
    if "ix_runs_rerun_of" not in indexes:
        op.create_index("ix_runs_rerun_of", "runs", ["rerun_of"])
    dialect = bind.dialect.name
    op.execute(
        _BACKFILL.format(
            rerun_of=_json_text(dialect, "launch", "rerun_of"),
            requested_by=_json_text(dialect, "launch", "requested_by"),
        )
    )


def downgrade() -> None:
    op.drop_index("ix_runs_rerun_of", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("rerun_requested_by")
        batch.drop_column("rerun_of")
