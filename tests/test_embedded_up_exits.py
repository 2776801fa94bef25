"""What ``temporality up`` says when a service dies, for the operator reading it at 2 a.m.: a service killed by a
signal from outside is reported as killed by that signal (SIGKILL: often the OOM killer or an operator), not with an
error it logged earlier (a poison message's ``message.dead_lettered``) put first as if it were the cause; and the
service's own log says where it exited and was restarted, instead of a silent gap between two starts."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from pathlib import Path

import nats
import pytest
from test_embedded_supervision import Up

from temporality_testing.waiting import eventually

pytestmark = pytest.mark.e2e


async def _publish_poison(data_dir: Path) -> None:
    """A JSON message that is no valid CloudEvent (no ``protocolversion``) on ``run.requested``: the run-executor
    dead-letters it and logs ``message.dead_lettered`` at error level."""
    port = int((data_dir / "nats-port").read_text().strip())
    password = json.loads((data_dir / "nats-users.json").read_text())["temporality-admin"]
    nc = await nats.connect(f"nats://127.0.0.1:{port}", user="temporality-admin", password=password)
    try:
        poison = {"id": "evt-poison-1", "type": "run.requested", "source": "/test", "specversion": "1.0", "data": {}}
        await nc.jetstream().publish("temporality.events.run.requested", json.dumps(poison).encode())
    finally:
        await nc.close()


@pytest.mark.timeout(300)
def test_a_service_killed_by_a_signal_is_not_blamed_on_an_earlier_error(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    up = Up(data_dir)
    try:
        up.ready()
        log = data_dir / "run" / "run-executor.log"
        asyncio.run(_publish_poison(data_dir))

        async def dead_lettered() -> bool:
            return "message.dead_lettered" in log.read_text(errors="replace")

        asyncio.run(eventually(dead_lettered, timeout_s=30, what="the run-executor dead-lettering the poison"))
        mark = len(up.lines)
        os.kill(up.pid("run-executor"), signal.SIGKILL)
        at = up.wait_for("run-executor exited unexpectedly (SIGKILL)", 30, mark)
        restarting = up.wait_for("restarting run-executor in 1s", 10, at)
        said = up.lines[at]
        assert "killed by signal 9" in said, said
        assert "OOM killer" in said
        report = up.lines[at + 1 : restarting]
        # the tail is shown as it is (it may hold the dead-lettering), but no earlier error is singled out
        assert not any("--- the last lines of" in line or "earlier error" in line for line in report), report
        up.wait_for("run-executor restarted (pid", 120, restarting)

        # the service's own log says what happened between its two starts
        text = log.read_text(errors="replace")
        marks = re.findall(r"^--- exited \(SIGKILL\) at (\S+); restarted by temporality up after 1 s ---$", text, re.M)
        assert len(marks) == 1, text[-3000:]
        before, after = text.split(f"--- exited (SIGKILL) at {marks[0]}", 1)
        assert "message.dead_lettered" in before
        assert "service.ready" in after or "ready" in after, after[:2000]
    finally:
        code = up.interrupt()
    assert code == 0, up.output
