"""The journal's own metrics, on the process's registry (``/metrics``, next to the runtime's).

==============================  ==========================================================================
``temporality_runs``            gauge by ``state``: the runs in each state that is not final (``pending``,
                                ``running``, ``waiting_for_human``, ``waiting_for_agent``, ``resuming``),
                                as the journal's ``runs`` table holds them; every such state is reported,
                                0 when no run is in it
==============================  ==========================================================================

Read from the database every ``STATE_REFRESH_S`` seconds by every replica (one indexed ``GROUP BY`` over
the runs not finished): a whole-system number, so aggregate it with ``max()`` across replicas, never
``sum()``. Finished runs (``completed``, ``failed``, ``cancelled``) are not counted here: their number only
grows (up to the retention), counting them would scan the whole table at every refresh, and the rate at
which runs finish is better read from the events (the journal's API, ``GET /insights``).
"""

from __future__ import annotations

from sqlalchemy import func, select

from temporality_journal.database import Database
from temporality_journal.models import RUNS_TABLE
from temporality_protocol import RUN, RunState
from temporality_service import ServiceMetrics

__all__ = ["OPEN_STATES", "JournalMetrics"]

#: The run states the gauge reports, in the state machine's order.
OPEN_STATES: tuple[RunState, ...] = tuple(state for state in RunState if state not in RUN.terminal)


class JournalMetrics:
    """The journal's instruments on the process's :class:`~temporality_service.ServiceMetrics`."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self._service = metrics.service
        self._runs = metrics.gauge(
            "temporality_runs", "Runs in each state that is not final (the journal's view)", ["state"]
        )

    async def refresh(self, database: Database) -> None:
        """Count the runs in each open state (one query)."""
        column = RUNS_TABLE.c.state
        query = select(column, func.count()).where(column.in_([state.value for state in OPEN_STATES])).group_by(column)
        async with database.engine.connect() as conn:
            counts = {str(state): int(count) for state, count in (await conn.execute(query)).all()}
        for state in OPEN_STATES:
            self._runs.labels(self._service, state.value).set(counts.get(state.value, 0))
