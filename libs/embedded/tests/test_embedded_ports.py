"""``temporality up`` checks its ports the way the servers bind them: TIME_WAIT is free, a listener is not."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from temporality_embedded.cli import _remember_port, _remembered_port, port_free
from temporality_embedded.processes import free_port


def _listener() -> socket.socket:
    """A server socket as uvicorn (asyncio's create_server) and nats-server open theirs: SO_REUSEADDR."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    return server


def _plain_bind_fails(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def test_a_port_whose_server_just_stopped_is_free_despite_time_wait() -> None:
    server = _listener()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # the server side closes first, so its end of the connection sits in TIME_WAIT
    assert client.recv(1) == b""
    client.close()
    server.close()  # the server is gone; only the TIME_WAIT connection is left on the port
    assert _plain_bind_fails(port), "precondition: a bind without SO_REUSEADDR trips over the TIME_WAIT"
    assert port_free(port)
    again = _listener()  # and a server can indeed listen there again
    again.close()


def test_a_listening_port_is_still_taken() -> None:
    with _listener() as server:
        assert not port_free(server.getsockname()[1])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as plain:  # a server without SO_REUSEADDR too
        plain.bind(("127.0.0.1", 0))
        plain.listen()
        assert not port_free(plain.getsockname()[1])


def test_free_port_is_outside_the_range_outgoing_connections_take_their_ports_from() -> None:
    """A port from the ephemeral range could be taken by any client connecting before the server binds it."""
    try:
        ephemeral_from = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pytest.skip("this kernel does not say where its ephemeral ports start")
    if ephemeral_from < 21000:
        pytest.skip(f"the ephemeral range starts at {ephemeral_from}: no room below it, bind(0) is used")
    ports = {free_port() for _ in range(20)}
    assert all(20000 <= port < ephemeral_from for port in ports), sorted(ports)
    assert len(ports) > 1  # picked at random, not one fixed port
    for port in ports:  # and free indeed: a server listens there
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("127.0.0.1", port))
            server.listen()


def test_up_reuses_the_nats_port_of_its_last_start_while_it_is_free(tmp_path: Path) -> None:
    """``--nats-port -1`` (the default) keeps the printed NATS URLs true across restarts: the port is kept in the
    data dir and taken again, unless something else listens there now (then a new one, -1)."""
    kept = tmp_path / "nats-port"
    assert _remembered_port(kept) == -1  # the first start: nothing kept
    with _listener() as server:
        port = server.getsockname()[1]
        _remember_port(kept, port)
        assert _remembered_port(kept) == -1, "a port in use now is not taken again"
    assert _remembered_port(kept) == port
    kept.write_text("not a port\n", encoding="utf-8")
    assert _remembered_port(kept) == -1
    kept.write_text("70000\n", encoding="utf-8")
    assert _remembered_port(kept) == -1
