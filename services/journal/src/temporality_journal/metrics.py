"""The journal's own metrics, on the process's registry (``/metrics``, next to the runtime's).

==================================  ======================================================================
``temporality_runs``                gauge by ``state``: the runs in each state that is not final
                                    (``pending``, ``running``, ``waiting_for_human``,
                                    ``waiting_for_agent``, ``resuming``), as the journal's ``runs`` table
                                    holds them; every such state is reported, 0 when no run is in it
``temporality_runs_finished_total`` counter by ``outcome`` (``completed``, ``failed``, ``timed_out``,
                                    ``cancelled``) and ``reason`` (a failed run's ``run.failed`` reason,
                                    one of :data:`FAILURE_REASONS` or ``other``; ``none`` otherwise): runs
                                    the projection moved into a final state, counted by the replica whose
                                    transaction did it, after its commit (``sum()`` across replicas)
==================================  ======================================================================

``timed_out`` is a failure whose reason is a time limit (:data:`TIMEOUT_REASONS`: the run's compute time,
the watchdog's ``stalled``, a question that expired with the ``fail`` policy), so an alert on "failed" can
leave out, or add, the runs that ran out of time.

Read from the database every ``STATE_REFRESH_S`` seconds by every replica (one indexed ``GROUP BY`` over
the runs not finished): a whole-system number, so aggregate it with ``max()`` across replicas, never
``sum()``. Finished runs (``completed``, ``failed``, ``cancelled``) are not counted here: their number only
grows (up to the retention) and counting them would scan the whole table at every refresh: the counter
``temporality_runs_finished_total`` says how many finish, and how.
"""

from __future__ import annotations

from sqlalchemy import func, select

from temporality_journal.database import Database
from temporality_journal.models import RUNS_TABLE
from temporality_protocol import RUN, RUN_FAILURE_REASONS, Envelope, RunState
from temporality_service import ServiceMetrics

__all__ = ["FAILURE_REASONS", "OPEN_STATES", "OUTCOMES", "TIMEOUT_REASONS", "JournalMetrics", "finished_as"]

#: The run states the gauge reports, in the state machine's order.
OPEN_STATES: tuple[RunState, ...] = tuple(state for state in RunState if state not in RUN.terminal)


#: The ``outcome`` label of :data:`temporality_runs_finished_total`.
OUTCOMES = ("completed", "failed", "timed_out", "cancelled")
#: The ``run.failed`` reasons the run-executor gives (the counter's ``reason``; any other is ``other``).
FAILURE_REASONS = RUN_FAILURE_REASONS
#: Failures that are a time limit reached: counted as ``timed_out``.
TIMEOUT_REASONS = frozenset({"compute_timeout", "stalled", "human_request_expired"})


def finished_as(state: RunState, event: Envelope) -> tuple[str, str]:
    """``(outcome, reason)`` of a run that ``event`` moved into the final ``state``."""
    if state is not RunState.FAILED:
        return state.value, "none"
    declared = event.data.get("reason") if event.type == "run.failed" else None
    reason = declared if isinstance(declared, str) and declared in FAILURE_REASONS else "other"
    return ("timed_out" if reason in TIMEOUT_REASONS else "failed"), reason


class JournalMetrics:
    """The journal's instruments on the process's :class:`~temporality_service.ServiceMetrics`."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self._service = metrics.service
        self._runs = metrics.gauge(
            "temporality_runs", "Runs in each state that is not final (the journal's view)", ["state"]
        )
        self._finished = metrics.counter(
            "temporality_runs_finished",
            "Runs that reached a final state, by outcome and (failed, timed_out) reason",
            ["outcome", "reason"],
        )
        for outcome, reason in (("completed", "none"), ("cancelled", "none"), ("failed", "other")):
            self._finished.labels(self._service, outcome, reason)  # 0 from the start: rate() and ratios work
        for reason in FAILURE_REASONS:
            self._finished.labels(self._service, "timed_out" if reason in TIMEOUT_REASONS else "failed", reason)

    def finished(self, outcomes: list[tuple[str, str]]) -> None:
        """Count runs that finished (``(outcome, reason)`` of :func:`finished_as`), after their commit."""
        for outcome, reason in outcomes:
            self._finished.labels(self._service, outcome, reason).inc()

    async def refresh(self, database: Database) -> None:
        """Count the runs in each open state (one query)."""
        column = RUNS_TABLE.c.state
        query = select(column, func.count()).where(column.in_([state.value for state in OPEN_STATES])).group_by(column)
        async with database.engine.connect() as conn:
            counts = {str(state): int(count) for state, count in (await conn.execute(query)).all()}
        for state in OPEN_STATES:
            self._runs.labels(self._service, state.value).set(counts.get(state.value, 0))
