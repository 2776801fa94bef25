"""``temporality up`` says when its nats-server hangs without exiting (an on-call review SIGSTOPped it: every service's
/readyz went 503 and webhooks got 503, but ``up`` printed nothing for minutes), and says when it answers again.

The supervisor asks the running nats-server for its INFO greeting every 10 s; three failures in a row are one
warning, the next greeting one line that it is back (RestartPolicy.nats_probe_*). Real processes: the stack, and
the nats-server stopped with SIGSTOP and continued with SIGCONT."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from test_embedded_supervision import Up

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(300)
def test_a_stopped_nats_server_is_reported_once_and_its_return_too(tmp_path: Path) -> None:
    up = Up(tmp_path / "data")
    stopped = False
    try:
        after = len(up.ready().splitlines())
        pid = up.nats_pid()
        os.kill(pid, signal.SIGSTOP)
        stopped = True
        warned = up.wait_for(f"nats-server (pid {pid}) has not answered for", timeout_s=120, after=after)
        assert "though it is running" in up.lines[warned]
        assert "webhooks get 503" in up.lines[warned]
        os.kill(pid, signal.SIGCONT)
        stopped = False
        back = up.wait_for(f"nats-server answers again (pid {pid})", timeout_s=60, after=warned)
        # one warning for the whole hang, and nothing restarted: it never exited
        assert sum("has not answered for" in line for line in up.lines[after:back]) == 1
        assert not any("exited unexpectedly" in line for line in up.lines[after:])
    finally:
        if stopped:
            os.kill(up.nats_pid(), signal.SIGCONT)
        assert up.interrupt() == 0, up.output
