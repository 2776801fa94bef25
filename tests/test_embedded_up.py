"""The README's first command: ``temporality up`` starts everything, prints the URLs, Ctrl-C stops it all,
and what it stored survives the next start."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import nats
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from e2e_support import CONFIG, EXAMPLE_PR, HOOK_AUTH

from temporality_embedded import SERVICES, free_port
from temporality_embedded.cli import build_parser
from temporality_protocol.catalog import EVENTS_STREAM

pytestmark = pytest.mark.e2e
SCRIPT = Path(sys.executable).parent / "temporality"
AGENT = Path(__file__).resolve().parents[1] / "examples" / "external-agent" / "agent.py"
README = Path(__file__).resolve().parents[1] / "README.md"


def free_ports() -> dict[str, int]:
    """A free port each for the gateway, human-interaction and the journal."""
    return {"gateway": free_port(), "human": free_port(), "journal": free_port()}


def start_up(data_dir: Path, config_dir: Path, ports: dict[str, int], *extra: str) -> subprocess.Popen[str]:
    """``temporality up`` as a child process on ``data_dir``, ``config_dir`` and ``ports`` (see :func:`free_ports`),
    its stdout and stderr one text pipe."""
    return subprocess.Popen(
        [
            str(SCRIPT), "up",
            "--data-dir", str(data_dir),
            "--config-dir", str(config_dir),
            "--gateway-port", str(ports["gateway"]),
            "--human-port", str(ports["human"]),
            "--journal-port", str(ports["journal"]),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip


class Up:
    def __init__(self, data_dir: Path, ports: dict[str, int] | None = None) -> None:
        self.ports = ports or free_ports()
        self.proc = start_up(data_dir, CONFIG, self.ports)
        self.lines: list[str] = []

    def read_until(self, marker: str, timeout_s: float = 90) -> list[str]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line.rstrip())
            if marker in line:
                return self.lines
        raise AssertionError(f"no {marker!r} in the output: {self.lines}")

    def interrupt(self) -> int:
        self.proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        self.read_until("Stopped.")
        return self.proc.wait(60)


def _admin_token(out: str) -> str:
    """The admin token ``temporality up`` printed (the line names the file it lives in)."""
    for line in out.splitlines():
        if "Admin API token" in line:
            return line.split()[3]
    raise AssertionError(f"no admin token printed: {out}")


def _subscriber(out: str) -> tuple[str, str, str]:
    """The journal subscriber ``temporality up`` printed: (URL with credentials, durable, inbox prefix)."""
    for line in out.splitlines():
        if "NATS journal subscriber" in line:
            words = line.split()
            return words[3], words[words.index("durable") + 1], words[words.index("prefix") + 1].rstrip(")")
    raise AssertionError(f"no journal subscriber printed: {out}")


def _external_agent(out: str) -> str:
    """The external agent's NATS URL (with its user and password) ``temporality up`` printed."""
    for line in out.splitlines():
        if "NATS external agent" in line:
            assert "inbox prefix _INBOX.example-agent" in line, line
            return line.split()[3]
    raise AssertionError(f"no external agent printed: {out}")


def _example_agent(out: str) -> list[str]:
    """The example agent's command line ``temporality up`` printed (the line after "Example external agent"),
    its ``<the interpreter running temporality up> examples/external-agent/agent.py`` made this checkout's agent (the
    interpreter printed is the project's environment's, the one with the example's dependencies: this one)."""
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if "Example external agent" in line:
            command = next(c for c in lines[i + 1 :] if "examples/external-agent/agent.py" in c)
            words = shlex.split(command)
            assert words[1] == "examples/external-agent/agent.py", command
            assert Path(words[0]).absolute() == Path(sys.executable).absolute(), command  # (run from this cwd)
            return [words[0], str(AGENT), *words[2:]]
    raise AssertionError(f"no example agent command printed: {out}")


def _example_agent_lines(banner: list[str]) -> list[str]:
    """The banner's lines about the example agent: from its key to its command."""
    start = next(i for i, line in enumerate(banner) if line.startswith("  example-agent key "))
    end = next(i for i, line in enumerate(banner) if "examples/external-agent/agent.py" in line)
    return banner[start : end + 1]


def _readme_agrees_on_the_example_agent(out: str) -> None:
    """README's ``make up`` banner shows the example agent's lines as ``temporality up`` prints them: the same
    labels and wording (values aside), the command with the same options in the same order."""
    text = README.read_text(encoding="utf-8")
    block = text.split("`make up` prints where everything is:", 1)[1].split("```", 2)[1].splitlines()
    documented, printed = _example_agent_lines(block), _example_agent_lines(out.splitlines())
    assert len(documented) == len(printed), (documented, printed)
    for doc_line, line in zip(documented[:-1], printed[:-1], strict=True):
        if doc_line.startswith("                            "):
            assert doc_line == line, "README's banner says it otherwise"
        else:  # label, value, (explanation): the label as printed
            assert doc_line[:29] == line[:29], (doc_line, line)
    options = [[w for w in shlex.split(c) if w.startswith("--")] for c in (documented[-1], printed[-1])]
    assert options[0] == options[1], f"README's example agent command has other options: {documented[-1]}"
    assert "--key-file ./.temporality/example-agent.key" in documented[-1]


def _banner_labels(lines: list[str]) -> list[str]:
    """The labels of a ``make up`` banner (its lines ``  <label padded to 27> value``), from "Temporality is up."
    to the first line that is not part of it; continuation lines (indented further) have no label."""
    start = next(i for i, line in enumerate(lines) if line.strip() == "Temporality is up.")
    labels = []
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        if line[2] != " ":
            labels.append(line[2:29].strip())
    return labels


def _readme_banner_agrees(out: str) -> None:
    """README's ``make up`` banner has the lines ``temporality up`` prints, in its order (values aside)."""
    text = README.read_text(encoding="utf-8")
    block = text.split("`make up` prints where everything is:", 1)[1].split("```", 2)[1].splitlines()
    assert _banner_labels(block) == _banner_labels(out.splitlines()), "README's banner block lists other lines"


def _reply_public_key(out: str) -> str:
    """agent-collab's reply public key ``temporality up`` printed."""
    for line in out.splitlines():
        if "agent-collab reply key" in line:
            return line.split()[3]
    raise AssertionError(f"no reply key printed: {out}")


def _example_agent_key(out: str) -> str:
    """The example agent's public key ``temporality up`` printed."""
    for line in out.splitlines():
        if "example-agent key" in line:
            return line.split()[2]
    raise AssertionError(f"no example agent key printed: {out}")


async def _read_journal(url: str, durable: str, inbox: str, until: str) -> list[dict[str, object]]:
    """As the printed subscriber, with a plain nats-py pull consumer: fetch and ack events until one whose
    JSON contains ``until``; every event read, in order."""
    nc = await nats.connect(url, inbox_prefix=inbox, allow_reconnect=False)
    try:
        sub = await nc.jetstream(timeout=5).pull_subscribe(
            "temporality.events.>", durable=durable, stream=EVENTS_STREAM.name
        )
        events: list[dict[str, object]] = []
        async with asyncio.timeout(60):
            while not any(until in json.dumps(event) for event in events):
                try:
                    batch = await sub.fetch(20, timeout=2)
                except nats.errors.TimeoutError:
                    continue  # nothing yet
                for msg in batch:
                    events.append(json.loads(msg.data))
                    await msg.ack_sync(timeout=5)
        return events
    finally:
        await nc.close()


def _pids(run_dir: Path) -> list[int]:
    return [int(p.read_text().split()[0]) for p in run_dir.glob("*.ready")]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# Two starts of the whole stack (each waited for up to 90 s) and four runs of the example agent: past the
# suite's 120 s per test on a loaded machine (a clean-clone CI at load ~10 timed out at 127 s, mid-way).
@pytest.mark.timeout(300)
def test_up_prints_the_urls_serves_the_webhook_stops_on_ctrl_c_and_keeps_its_state(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    up = Up(data_dir)
    # a keep-alive connection still open at Ctrl-C: the server closes it, so the gateway's end of it
    # lingers in TIME_WAIT on the gateway port after the stop
    keep_alive = httpx.Client(timeout=10)
    try:
        out = "\n".join(up.read_until("Press Ctrl-C to stop."))
        hook = f"http://127.0.0.1:{up.ports['gateway']}/hooks/ado-pr-review"
        assert f"POST {hook}" in out
        assert f"http://127.0.0.1:{up.ports['human']}/inbox" in out
        assert f"http://127.0.0.1:{up.ports['journal']}/runs" in out
        assert f"http://127.0.0.1:{up.ports['journal']}/console/" in out
        assert f"http://127.0.0.1:{up.ports['gateway']}/triggers" in out
        assert "nats://127.0.0.1:" in out
        assert "nats.connected" not in out, "a log line in the banner"
        assert "[debug" not in out, "a log line in the banner"
        token = _admin_token(out)
        tokens_file = data_dir / "api-tokens.json"
        assert token in tokens_file.read_text(encoding="utf-8")
        assert tokens_file.stat().st_mode & 0o077 == 0, "the tokens file is readable by others"
        # the journal holds every payload and answer: the data dir and what the services write are private
        assert data_dir.stat().st_mode & 0o777 == 0o700, oct(data_dir.stat().st_mode)
        assert (data_dir / "journal.db").stat().st_mode & 0o077 == 0, "the journal is readable by others"
        logs = list((data_dir / "run").iterdir())
        assert logs, "no service log in <data-dir>/run"
        assert all(log.stat().st_mode & 0o077 == 0 for log in logs), "a log is readable by others"
        nats_log = data_dir / "nats" / "nats-server.log"
        assert nats_log.is_file(), "no nats-server log in <data-dir>/nats"
        assert f"nats-server's in {nats_log}" in out, "the banner does not name nats-server's log"
        body = EXAMPLE_PR.read_bytes()
        headers = {"Authorization": HOOK_AUTH, "Content-Type": "application/json"}
        accepted = keep_alive.post(hook, content=body, headers=headers)
        assert accepted.status_code == 202, accepted.text
        run_id = accepted.json()["run_id"]
        console = keep_alive.get(f"http://127.0.0.1:{up.ports['journal']}/console/")
        assert console.status_code == 200, "the printed console URL serves the console"
        assert "text/html" in console.headers["content-type"]
        # the console's directory sign-in is on: the demo operator of config/users.yaml signs in (the session
        # cookie is not Secure on this plain-http loopback) and reads the runs with that cookie alone
        with httpx.Client(base_url=f"http://127.0.0.1:{up.ports['journal']}", timeout=30) as person:
            signed = person.post(
                "/auth/password",
                json={"user": "alice", "password": "alice-demo-password"},
                headers={"X-Temporality-Console": "1"},
            )
            assert signed.status_code == 200, signed.text
            assert person.get("/runs").status_code == 200, "the operator's session reads the runs"
            wrong = person.post(
                "/auth/password",
                json={"user": "alice", "password": "not-her-password"},
                headers={"X-Temporality-Console": "1"},
            )
            assert wrong.status_code == 401, wrong.text
        assert (data_dir / "signin" / "session-secret").stat().st_mode & 0o077 == 0
        pids = _pids(data_dir / "run")
        assert len(pids) == len(SERVICES)
        # the workers' APIs it prints answer: agent-collab's agents, the run-executor's agent cards
        printed = re.findall(r"(http://127\.0\.0\.1:\d+)/agents ", out)
        assert len(printed) == 2, out
        for base in printed:
            agents = keep_alive.get(f"{base}/agents", headers={"Authorization": f"Bearer {token}"})
            assert agents.status_code == 200, (base, agents.text)
        cards = keep_alive.get(f"{printed[1]}/agents", headers={"Authorization": f"Bearer {token}"}).json()
        assert "reviewer" in json.dumps(cards), cards
        # NATS auth is on: the services run as their own users, and the printed subscriber reads the journal
        assert "NATS user (full access)" in out
        passwords = data_dir / "nats-users.json"
        assert passwords.stat().st_mode & 0o077 == 0, "the NATS passwords file is readable by others"
        url, durable, inbox = _subscriber(out)
        assert url.split("@")[0].split(":")[-1] in passwords.read_text(encoding="utf-8")
        first = asyncio.run(_read_journal(url, durable, inbox, until=run_id))
        assert any(e["type"] == "trigger.received" for e in first), first
        # the printed external agent user: the example agent registers, heartbeats and deregisters with it alone
        # (its replies arrive below _INBOX.example-agent, the one inbox prefix that user may subscribe to)
        agent_url = _external_agent(out)
        # agent-collab signs its replies with the key up made (0600 in the data dir, public key next to it): the
        # printed example agent command carries that public key and checks every reply against it
        public_key = _reply_public_key(out)
        key_file = data_dir / "collab-reply-key.pem"
        key_pem = key_file.read_bytes()
        assert key_file.stat().st_mode & 0o077 == 0, "the reply key is readable by others"
        assert (data_dir / "collab-reply-key.pub").read_text(encoding="utf-8").strip() == public_key
        command = _example_agent(out)
        _readme_agrees_on_the_example_agent(out)
        _readme_banner_agrees(out)
        assert command[command.index("--nats-url") + 1] == agent_url
        assert command[command.index("--collab-public-key") + 1] == public_key
        # the example agent signs (AP-11): up made its key (0600 in the data dir) and gave agent-collab the config
        # dir's allow-list with its public key; the printed command signs with it; config/ itself is unchanged
        agent_key = data_dir / "example-agent.key"
        assert Path(command[command.index("--key-file") + 1]) == agent_key.resolve()
        assert agent_key.stat().st_mode & 0o077 == 0, "the example agent's key is readable by others"
        agent_key_pem = agent_key.read_bytes()
        agent_public = _example_agent_key(out)
        assert (data_dir / "example-agent.pub").read_text(encoding="utf-8").strip() == agent_public
        assert "allow_unsigned" not in (CONFIG / "external-agents.yaml").read_text(encoding="utf-8").replace(
            "`allow_unsigned", ""
        ), "the shipped allow-list accepts an unsigned agent"
        agent = subprocess.run(
            [*command, "--beats", "1", "--period-s", "0.2"], capture_output=True, text=True, timeout=60
        )
        assert agent.returncode == 0, (agent.stdout, agent.stderr)
        assert "heartbeat 1" in agent.stderr, agent.stderr
        assert "replies are not checked" not in agent.stderr, agent.stderr
        assert "sending unsigned requests" not in agent.stderr, agent.stderr
        # unsigned, the same agent is refused at registration (exit 3): nobody is allow_unsigned by default
        keyless = [*command[: command.index("--key-file")], *command[command.index("--key-file") + 2 :]]
        unsigned = subprocess.run([*keyless, "--beats", "1"], capture_output=True, text=True, timeout=60)
        assert unsigned.returncode == 3, (unsigned.stdout, unsigned.stderr)
        assert "registration refused (unsigned)" in unsigned.stderr, unsigned.stderr
        # signed with another key it is refused too (the listed public key is the one up made)
        stranger = tmp_path / "stranger.key"
        keygen = subprocess.run(
            [sys.executable, str(AGENT), "keygen", "--out", str(stranger)], capture_output=True, text=True, timeout=30
        )
        assert keygen.returncode == 0, keygen.stderr
        other_key = [*keyless, "--key-file", str(stranger)]
        impostor = subprocess.run([*other_key, "--beats", "1"], capture_output=True, text=True, timeout=60)
        assert impostor.returncode == 3, (impostor.stdout, impostor.stderr)
        assert "registration refused (bad_signature)" in impostor.stderr, impostor.stderr
        # the replies really are signed: checked against another key, the first reply stops the agent (exit 8)
        other = base64.b64encode(Ed25519PrivateKey.generate().public_key().public_bytes_raw()).decode()
        forged = [*command[: command.index("--collab-public-key") + 1], other]
        refused = subprocess.run([*forged, "--beats", "1"], capture_output=True, text=True, timeout=60)
        assert refused.returncode == 8, (refused.stdout, refused.stderr)
    finally:
        code = up.interrupt()
        keep_alive.close()
    assert code == 0, up.lines
    assert not [pid for pid in pids if _alive(pid)], "services left running after Ctrl-C"

    # the next start, right away on the same ports (TIME_WAIT is not "in use"), finds the same run and
    # still recognises the delivery (JetStream file store + SQLite)
    again = Up(data_dir, up.ports)
    try:
        out_again = "\n".join(again.read_until("Press Ctrl-C to stop."))
        assert _admin_token(out_again) == token, "the admin token must survive a restart"
        url_again, *rest_again = _subscriber(out_again)
        assert url_again == url, "the NATS passwords and port must survive a restart (the printed URLs stay true)"
        assert rest_again == [durable, inbox]
        assert _reply_public_key(out_again) == public_key, "the reply key must survive a restart"
        assert key_file.read_bytes() == key_pem
        # the restarted agent-collab signs with that same key: the agent checking against the first start's key
        # registers and heartbeats
        command_again = _example_agent(out_again)
        assert command_again[command_again.index("--collab-public-key") + 1] == public_key
        assert _example_agent_key(out_again) == agent_public, "the example agent's key must survive a restart"
        assert agent_key.read_bytes() == agent_key_pem
        assert command_again[command_again.index("--key-file") + 1] == str(agent_key.resolve())
        agent_again = subprocess.run(
            [*command_again, "--beats", "1", "--period-s", "0.2"], capture_output=True, text=True, timeout=60
        )
        assert agent_again.returncode == 0, (agent_again.stdout, agent_again.stderr)
        assert "heartbeat 1" in agent_again.stderr, agent_again.stderr
        hook = f"http://127.0.0.1:{again.ports['gateway']}/hooks/ado-pr-review"
        duplicate = httpx.post(hook, content=body, headers=headers, timeout=10)
        assert duplicate.status_code == 200, duplicate.text
        assert duplicate.json()["run_id"] == run_id
        # the subscriber's durable resumed where it acknowledged: the rest and the duplicate's rejection, once
        rest = asyncio.run(_read_journal(url_again, durable, inbox, until='"reason": "duplicate"'))
        assert not {e["id"] for e in first} & {e["id"] for e in rest}, "an acknowledged event came again"
        run = httpx.get(
            f"http://127.0.0.1:{again.ports['journal']}/runs/{run_id}",
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )
        assert run.status_code == 200
        assert run.json()["agent"] == "reviewer"
    finally:
        assert again.interrupt() == 0


def test_nats_auth_is_on_unless_turned_off() -> None:
    assert build_parser().parse_args(["up"]).nats_auth is True
    assert build_parser().parse_args(["up", "--no-nats-auth"]).nats_auth is False


def _run_up(*args: str) -> subprocess.CompletedProcess[str]:
    """``temporality up`` with ``args`` run to its exit (a refusal exits at once), its output captured."""
    return subprocess.run([str(SCRIPT), "up", *args], capture_output=True, text=True, timeout=30, check=False)


def test_up_refuses_a_bad_subscriber_name(tmp_path: Path) -> None:
    result = _run_up("--data-dir", str(tmp_path / "d"), "--config-dir", str(CONFIG), "--nats-subscriber", "a.b")
    assert result.returncode == 2, result.stdout
    assert "error: subscriber name 'a.b'" in result.stdout


def test_up_refuses_a_missing_config_dir(tmp_path: Path) -> None:
    result = _run_up("--data-dir", str(tmp_path / "d"), "--config-dir", str(tmp_path / "nope"))
    assert result.returncode == 2
    assert "triggers.yaml not found" in result.stdout


def test_up_refuses_an_invalid_tokens_file(tmp_path: Path) -> None:
    bad = tmp_path / "tokens.yaml"
    bad.write_text("- {name: x, role: root, token: short}\n", encoding="utf-8")
    result = _run_up(
        "--data-dir", str(tmp_path / "d"),
        "--config-dir", str(CONFIG),
        "--gateway-port", str(free_port()),
        "--human-port", str(free_port()),
        "--journal-port", str(free_port()),
        "--api-tokens-file", str(bad),
    )  # fmt: skip
    assert result.returncode == 2, result.stdout
    assert f"error: {bad}: entry 0.role" in result.stdout


def test_up_names_a_port_that_is_taken(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _run_up("--data-dir", str(tmp_path / "d"), "--config-dir", str(CONFIG), "--gateway-port", str(port))
    assert result.returncode == 2
    assert f"127.0.0.1:{port} is already in use; pick another with --gateway-port" in result.stdout
