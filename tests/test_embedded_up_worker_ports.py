"""``temporality up`` keeps the ports the OS picked for the run-executor's agent cards and agent-collab's agents API
(and their ``/metrics``) in ``<data-dir>/executor-port`` and ``collab-port``, like the NATS port: the next start on
the same data dir takes them again while they are free, so the printed "Agent cards" and "Agents API" URLs (and a
scrape config) stay true; ``--executor-port`` / ``--collab-port`` set them, and a kept port taken meanwhile is
replaced by a new one with a note."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest
from e2e_support import CONFIG
from test_embedded_supervision import Up

from temporality_embedded import free_port

pytestmark = pytest.mark.e2e


def _url(out: str, label: str) -> str:
    (line,) = [line for line in out.splitlines() if line.strip().startswith(label)]
    return next(word for word in line.split() if word.startswith("http://"))


def _answers(url: str, token: str) -> None:
    response = httpx.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert response.status_code == 200, (url, response.status_code, response.text[:300])


def _start(data_dir: Path, *extra: str) -> tuple[str, str]:
    up = Up(data_dir, CONFIG, *extra)
    try:
        out = up.ready()
        urls = _url(out, "Agent cards (run-executor)"), _url(out, "Agents API (agent-collab)")
        for url in urls:  # the printed lines are true
            _answers(url, up.token())
        return urls
    finally:
        assert up.interrupt() == 0, up.output


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


@pytest.mark.timeout(400)
def test_worker_ports_are_kept_across_restarts_and_set_by_flags(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    executor, collab = _start(data_dir)
    assert int((data_dir / "executor-port").read_text()) == _port(executor)
    assert int((data_dir / "collab-port").read_text()) == _port(collab)

    assert _start(data_dir) == (executor, collab), "a restart of the stack moved the workers' ports"

    # a kept port taken by someone else meanwhile: a new one, and the file follows it
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (our own requests left it in TIME_WAIT)
        squatter.bind(("127.0.0.1", _port(executor)))
        squatter.listen()
        moved, same = _start(data_dir)
    assert same == collab
    assert _port(moved) != _port(executor)
    assert int((data_dir / "executor-port").read_text()) == _port(moved)

    # the flags set them
    wanted = free_port(), free_port()
    executor, collab = _start(data_dir, "--executor-port", str(wanted[0]), "--collab-port", str(wanted[1]))
    assert (_port(executor), _port(collab)) == wanted
