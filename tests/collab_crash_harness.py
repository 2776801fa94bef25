"""agent-collab as its own process, killed at one point of its work (a helper run as a script, not a test module).

``python tests/collab_crash_harness.py`` is ``python -m temporality_agent_collab`` -- the same settings, start-up,
consumers and responders -- with the test seam :attr:`~temporality_agent_collab.tasks.TaskBoard.crash_point` armed:
when the task board passes the point named by ``TEMPORALITY_TEST_COLLAB_CRASH_AT`` (``act:committed``: an agent's
action stored, its ``agent.task.acted`` not yet published) the process ends at once with ``os._exit(137)``, as
kill -9 or the OOM killer would end it: no reply, no publish, no drain. The service itself never arms the seam.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from temporality_agent_collab.__main__ import run
from temporality_agent_collab.tasks import TaskBoard

#: The point to die at (unset: the harness is agent-collab as it is).
CRASH_AT_ENV = "TEMPORALITY_TEST_COLLAB_CRASH_AT"
#: The exit status of the crash (the status a SIGKILL'ed process reports is 128 + 9).
CRASH_EXIT_STATUS = 137


def arm(point: str) -> None:
    """Every task board the process opens dies at ``point``."""
    opened = TaskBoard.open

    async def crash(at: str) -> None:
        if at == point:
            sys.stderr.write(f"collab_crash_harness: dying at {at}\n")
            sys.stderr.flush()
            os._exit(CRASH_EXIT_STATUS)

    async def open_armed(*args: Any, **kwargs: Any) -> TaskBoard:
        board = await opened(*args, **kwargs)
        board.crash_point = crash
        return board

    setattr(TaskBoard, "open", open_armed)  # noqa: B010 - the class's opener, replaced in this process only


if __name__ == "__main__":
    point = os.environ.get(CRASH_AT_ENV)
    if point:
        arm(point)
    run()
