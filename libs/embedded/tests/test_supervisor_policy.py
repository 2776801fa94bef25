"""The restart policy of ``temporality up`` (backoff, crash loop), without processes: an injected clock."""

from __future__ import annotations

import pytest

from temporality_embedded.supervisor import CrashTracker, RestartPolicy, describe_exit


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _crash_after(tracker: CrashTracker, clock: Clock, ran_s: float) -> float | None:
    """The child ran ``ran_s`` since its last start, then crashed: the delay before its restart."""
    clock.now += ran_s
    delay = tracker.crashed()
    if delay is not None:
        clock.now += delay
        tracker.started()
    return delay


def test_the_backoff_grows_1_2_5_10_and_a_fifth_crash_within_two_minutes_is_a_crash_loop() -> None:
    clock = Clock()
    tracker = CrashTracker(RestartPolicy(), clock)
    assert [_crash_after(tracker, clock, 3) for _ in range(4)] == [1, 2, 5, 10]
    assert tracker.recent == 4
    assert _crash_after(tracker, clock, 3) is None  # 5 crashes within 120 s (at most 3+1+3+2+3+5+3+10+3 = 33 s)


def test_crashes_further_apart_than_the_window_never_loop_and_the_backoff_stays_at_its_last_step() -> None:
    clock = Clock()
    tracker = CrashTracker(RestartPolicy(stable_s=1000), clock)
    delays = [_crash_after(tracker, clock, 40) for _ in range(8)]  # every 40 s + the delay: 3 or 4 within 120 s
    assert delays == [1, 2, 5, 10, 30, 30, 30, 30]
    assert tracker.recent < 5


def test_a_child_that_ran_long_enough_starts_over_at_the_first_delay() -> None:
    clock = Clock()
    tracker = CrashTracker(RestartPolicy(), clock)
    assert [_crash_after(tracker, clock, 1) for _ in range(3)] == [1, 2, 5]
    assert _crash_after(tracker, clock, 120) == 1  # ran stable_s: a new incident, not the same crash loop
    assert _crash_after(tracker, clock, 1) == 2


def test_the_window_slides() -> None:
    clock = Clock()
    policy = RestartPolicy(delays_s=(0,), max_crashes=3, window_s=10, stable_s=1000)
    tracker = CrashTracker(policy, clock)
    assert _crash_after(tracker, clock, 0) == 0
    assert _crash_after(tracker, clock, 6) == 0
    assert _crash_after(tracker, clock, 6) == 0  # the first fell out of the window: 2 within 10 s
    assert _crash_after(tracker, clock, 1) is None  # 3 within 10 s


def test_a_crash_at_start_counts_like_any_other() -> None:
    clock = Clock()
    tracker = CrashTracker(RestartPolicy(), clock)
    assert [_crash_after(tracker, clock, 0) for _ in range(4)] == [1, 2, 5, 10]
    assert _crash_after(tracker, clock, 0) is None


@pytest.mark.parametrize(
    "policy",
    [{"delays_s": ()}, {"delays_s": (-1.0,)}, {"max_crashes": 0}, {"window_s": 0}],
)
def test_a_policy_that_cannot_work_is_refused(policy: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="restart policy"):
        RestartPolicy(**policy)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("returncode", "text"),
    [
        (-9, "SIGKILL"),
        (-15, "SIGTERM"),
        (-6, "SIGABRT"),
        (1, "exit 1"),
        (0, "exit 0"),
        (-200, "signal 200"),
        (None, "running"),
    ],
)
def test_an_exit_is_named_by_its_code_or_signal(returncode: int | None, text: str) -> None:
    assert describe_exit(returncode) == text
