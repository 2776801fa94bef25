"""``runs.usage_*``: what each finished run used (turns, tool calls, tokens, samplings), from its terminal event.

``run.completed``, ``run.failed`` and ``run.cancelled`` carry ``usage`` (the run-executor's totals over the whole
run); the journal keeps them on the run's row, six nullable bigint columns (no rewrite of the table: PostgreSQL
and SQLite add them in place), shown as ``usage`` by ``GET /runs/{run_id}`` and ``GET /runs``.

The runs already projected are back-filled from their stored terminal events (one pass over the events of those
three types that carry a ``usage``), so an upgraded journal shows the totals of its finished runs without a
rebuild. A database whose ``runs`` has the columns already (made by ``create_all`` of this day and stamped at an
older revision) gets only the back-fill of the rows still blank.

Revision ID: 0007_usage
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_usage"
down_revision: str | None = "0006_reruns"
branch_labels: str | None = None
depends_on: str | None = None

#: Nothing: the next upgrade back-fills the columns from the stored terminal events (as at the first upgrade).
DOWNGRADE_LOSES: str | None = None

#: The ``usage`` fields, each kept in ``runs.usage_<field>``.
_FIELDS = ("turns", "tool_calls", "prompt_tokens", "completion_tokens", "total_tokens", "samplings")

#: The back-fill: each finished run's totals from its stored terminal event (a run has one; should a stream hold
#: two, the larger count of each field). ``{value:<field>}`` are the dialect's JSON path expressions on
#: ``events.data``, as integers.
_BACKFILL = """
UPDATE runs SET {assignments}
FROM (
    SELECT run_id, {maxima}
    FROM events
    WHERE type IN ('run.completed', 'run.failed', 'run.cancelled') AND run_id IS NOT NULL
      AND {usage} IS NOT NULL
    GROUP BY run_id
) AS found
WHERE runs.run_id = found.run_id AND runs.usage_turns IS NULL
"""


def _json_int(dialect: str, *path: str) -> str:
    if dialect == "postgresql":
        return f"CAST(events.data #>> '{{{','.join(path)}}}' AS BIGINT)"
    return f"CAST(json_extract(events.data, '$.{'.'.join(path)}') AS INTEGER)"


def _json_object(dialect: str, key: str) -> str:
    if dialect == "postgresql":
        return f"(events.data -> '{key}')"
    return f"json_extract(events.data, '$.{key}')"


def upgrade() -> None:
    bind = op.get_bind()
    columns = {column["name"] for column in sa.inspect(bind).get_columns("runs")}
    for field in _FIELDS:
        if f"usage_{field}" not in columns:
            op.add_column("runs", sa.Column(f"usage_{field}", sa.BigInteger(), nullable=True))
    dialect = bind.dialect.name
    usage = _json_object(dialect, "usage")
    if dialect == "postgresql":  # JSON null (``"usage": null``) is not SQL NULL there
        usage = f"NULLIF({usage}, 'null'::jsonb)"
    op.execute(
        _BACKFILL.format(
            assignments=", ".join(f"usage_{f} = COALESCE(found.{f}, 0)" for f in _FIELDS),
            maxima=", ".join(f"MAX({_json_int(dialect, 'usage', f)}) AS {f}" for f in _FIELDS),
            usage=usage,
        )
    )


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        for field in reversed(_FIELDS):
            batch.drop_column(f"usage_{field}")
