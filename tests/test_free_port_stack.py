"""The e2e stack on free ports starts again on new ones when a port was taken between its pick and its bind."""

from __future__ import annotations

import dataclasses
import socket
from pathlib import Path

import httpx
from e2e_support import make_stack


def test_a_port_taken_before_the_bind_is_replaced_and_the_stack_starts(tmp_path: Path) -> None:
    stack = make_stack(tmp_path)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()  # another test's server on the journal's port, between its pick and the journal's bind
        port = taken.getsockname()[1]
        stack.config = dataclasses.replace(stack.config, journal_port=port)
        stack.start()
        try:
            assert stack.config.journal_port != port
            assert httpx.get(f"{stack.journal_url}/healthz", timeout=10).status_code == 200
        finally:
            stack.stop()
