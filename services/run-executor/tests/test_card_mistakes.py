"""Agent-card mistakes that used to surface only at run time, with vague errors, now stop the start (the real
process exits 2 naming the agent, the field and what to change) or, where only a run can tell, say what to check:

- ``api_key_env`` naming an unset or empty variable (requests went out with no key: "refused (401)");
- ``base_url`` without an http(s) scheme or a host (every run failed with ``UnsupportedProtocol``);
- ``sandbox.network: false`` where the sandbox's ``unshare`` is refused (the MCP servers never listed);
- a ``tools`` pattern no built-in tool and no MCP server of the card could match (``gh__*`` with no ``gh``);
- a 401/403 names the variable that holds the key; a connection error names the endpoint, never the key.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import structlog
from executor_support import REVIEWER, RunExecutor, run_requested
from pydantic import ValidationError

from temporality_bus import Bus, NatsSettings
from temporality_embedded.processes import free_port
from temporality_run_executor.__main__ import configure
from temporality_run_executor.agents import ProviderConfig, network_off_problem
from temporality_run_executor.providers import OpenAICompatible, PermanentProviderError
from temporality_run_executor.providers.factory import ProviderCache, ProviderConfigError
from temporality_run_executor.records import Message
from temporality_run_executor.settings import Settings
from temporality_run_executor.tools import BUILTIN_TOOLS, ToolPolicy, ToolRegistry, may_match_prefix
from temporality_service import ConfigError
from temporality_testing.events import EventLog
from temporality_testing.openai_emulator import OpenAIEmulator, error_reply

HI = [Message(role="user", content="hi")]
SECRET = "sk-mistakes-secret-789"

CARD = """
agents:
  - id: coder
    role: Coder
    system_prompt: You write code.
    tools: {tools}
    provider: {{kind: openai, base_url: "{base_url}", model: m, api_key_env: CODER_KEY, max_retries: 0}}
    mcp_servers: [{{name: files, command: {python}, args: ["-c", ""]}}]
    sandbox: {{network: {network}}}
"""


def _start(
    tmp_path: Path,
    *,
    env: dict[str, str | None],
    base_url: str = "http://127.0.0.1:9/v1",
    tools: str = "[get_input, ask_human]",
    network: str = "true",
) -> subprocess.CompletedProcess[str]:
    """Start the executor as the service runtime does (``python -m``), with the card and ``env`` (``None``: unset);
    a card mistake stops it in ``configure``, before it connects to anything."""
    path = tmp_path / "agents.yaml"
    card = CARD.format(tools=tools, base_url=base_url, network=network, python=sys.executable)
    path.write_text(card, encoding="utf-8")
    environment = {**os.environ, "TEMPORALITY_EXECUTOR_AGENTS_FILE": str(path), "TEMPORALITY_LOG_FORMAT": "json"}
    for name, value in env.items():
        if value is None:
            environment.pop(name, None)
        else:
            environment[name] = value
    return subprocess.run(
        [sys.executable, "-m", "temporality_run_executor"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _refused(done: subprocess.CompletedProcess[str], *says: str) -> str:
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    for text in says:
        assert text in output, output
    return output


# --------------------------------------------------------------------------- the process refuses to start
# One real process per kind of mistake (exit status 2 and the message are the process's); the variants in-process,
# through the same configure.
def test_an_unset_api_key_variable_stops_the_process_naming_it(tmp_path: Path) -> None:
    done = _start(tmp_path, env={"CODER_KEY": None})
    _refused(done, "agents.yaml: agent coder: provider.api_key_env: the variable CODER_KEY is not set")


def test_a_base_url_without_a_scheme_stops_the_process(tmp_path: Path) -> None:
    done = _start(tmp_path, env={"CODER_KEY": SECRET}, base_url="127.0.0.1:9299/v1")
    output = _refused(
        done,
        "agents[0] (coder): provider.base_url: Value error, base_url needs an http:// or https:// scheme and a host",
        "(it has no scheme and no host)",
    )
    assert SECRET not in output


def test_network_off_where_unshare_is_refused_stops_the_process_saying_what_to_change(tmp_path: Path) -> None:
    """``unshare`` is installed but refused, as under a container's default seccomp profile without CAP_SYS_ADMIN:
    an ``unshare`` earlier on PATH that fails the way util-linux's does there."""
    fake = tmp_path / "bin"
    fake.mkdir()
    unshare = fake / "unshare"
    unshare.write_text("#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n")
    unshare.chmod(0o755)
    path = f"{fake}{os.pathsep}{os.environ.get('PATH', '')}"
    done = _start(tmp_path, env={"CODER_KEY": SECRET, "PATH": path}, network="false")
    _refused(
        done,
        "agents[0] (coder): sandbox: Value error, network: false cannot work in this environment",
        "unshare: unshare failed: Operation not permitted",
        "seccomp",
        "docs/agents.md#network-off",
        "network: true",
    )


def test_a_tools_pattern_no_tool_could_match_stops_the_process(tmp_path: Path) -> None:
    done = _start(tmp_path, env={"CODER_KEY": SECRET}, tools='{allow: [get_input, "gh__*"]}')
    _refused(done, "agent coder: tools patterns ['gh__*'] can match no tool", "its mcp_servers: files")


def _configure(tmp_path: Path, **card: str) -> None:
    values = {"tools": "[get_input, ask_human]", "base_url": "http://127.0.0.1:9/v1", "network": "true"} | card
    path = tmp_path / "agents.yaml"
    path.write_text(CARD.format(python=sys.executable, **values), encoding="utf-8")
    configure(Settings(agents_file=path))


@pytest.mark.parametrize(("value", "state"), [("", "is empty"), ("  ", "is empty"), ("sk-x", None)])
def test_an_empty_api_key_variable_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str, state: str | None
) -> None:
    monkeypatch.setenv("CODER_KEY", value)
    if state is None:
        _configure(tmp_path)
        return
    with pytest.raises(ConfigError, match=f"the variable CODER_KEY {state}"):
        _configure(tmp_path)


@pytest.mark.parametrize(
    ("base_url", "has"),
    [
        ("localhost:9299/v1", "scheme 'localhost' and no host"),
        ("ftp://models.example.com/v1", "scheme 'ftp'"),
        ("http:///v1", "no host"),
        ("/v1", "no scheme and no host"),
    ],
)
def test_a_base_url_without_http_scheme_or_host_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, base_url: str, has: str
) -> None:
    monkeypatch.setenv("CODER_KEY", SECRET)
    with pytest.raises(ConfigError, match=r"provider\.base_url: .*needs an http:// or https:// scheme") as info:
        _configure(tmp_path, base_url=base_url)
    assert f"(it has {has})" in str(info.value)


@pytest.mark.skipif(network_off_problem() is not None, reason="unprivileged user namespaces are refused here")
def test_network_off_where_unshare_works_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CODER_KEY", SECRET)
    _configure(tmp_path, network="false")


@pytest.mark.parametrize(
    ("tools", "never"),
    [
        ('{allow: ["files__*"], deny: ["file__del*"]}', "['file__del*']"),  # a typo in deny denies nothing
        ('{allow: ["ask_humans?"]}', "['ask_humans?']"),
        (None, None),
        ('{allow: ["ask_*", "files__*", "*__read", "*"], deny: ["notif?"]}', None),
    ],
)
def test_a_tools_pattern_no_tool_could_match_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tools: str | None, never: str | None
) -> None:
    monkeypatch.setenv("CODER_KEY", SECRET)
    card = {"tools": tools} if tools is not None else {}
    if never is None:
        _configure(tmp_path, **card)
        return
    with pytest.raises(ConfigError) as info:
        _configure(tmp_path, **card)
    assert f"agent coder: tools patterns {never} can match no tool" in str(info.value)


# --------------------------------------------------------------------------- the checks themselves
@pytest.mark.parametrize(
    ("pattern", "prefix", "may"),
    [
        ("gh__*", "files__", False),
        ("files__*", "files__", True),
        ("f*", "files__", True),
        ("*", "files__", True),
        ("*__read", "files__", True),
        ("files__read_?", "files__", True),
        ("[fg]*", "files__", True),  # a class: may match anything (over-approximated)
        ("file__*", "files__", False),
    ],
)
def test_a_pattern_may_match_a_server_s_tools_by_its_literal_start(pattern: str, prefix: str, may: bool) -> None:
    assert may_match_prefix(pattern, prefix) is may


def test_patterns_matching_a_built_in_tool_or_a_server_are_kept() -> None:
    registry = ToolRegistry(BUILTIN_TOOLS)
    policy = ToolPolicy(allow=["ask_*", "files__*", "gh__*", "*"], deny=["notif?", "zz*"])
    assert registry.unmatched(policy, ("files__",)) == ["gh__*", "zz*"]
    assert registry.unmatched(policy) == ["files__*", "gh__*", "zz*"]


@pytest.mark.parametrize("base_url", ["http://127.0.0.1:8000/v1", "https://api.openai.com/v1", "http://[::1]:80/v1"])
def test_http_base_urls_are_accepted(base_url: str) -> None:
    assert ProviderConfig(kind="openai", base_url=base_url, model="m").base_url == base_url


def test_a_bad_base_url_is_refused_by_the_card_model() -> None:
    with pytest.raises(ValidationError, match="needs an http:// or https:// scheme"):
        ProviderConfig(kind="openai", base_url="127.0.0.1:9299/v1", model="m")


def test_validate_refuses_an_unset_key_variable_only_for_openai_cards(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CODER_KEY", raising=False)
    card = REVIEWER.model_copy(
        update={
            "provider": ProviderConfig(
                kind="openai", base_url="http://127.0.0.1:9/v1", model="m", api_key_env="CODER_KEY"
            )
        }
    )
    with pytest.raises(ProviderConfigError, match=r"agent reviewer: provider\.api_key_env: the variable CODER_KEY"):
        ProviderCache().validate([card])
    ProviderCache().validate([REVIEWER])  # scripted: no key
    monkeypatch.setenv("CODER_KEY", SECRET)
    ProviderCache().validate([card])


# --------------------------------------------------------------------------- what a run says
@pytest.mark.parametrize("status", [401, 403])
async def test_a_refused_key_names_the_variable_that_holds_it(status: int) -> None:
    async with OpenAIEmulator().serve() as emulator:
        emulator.replies.append(
            error_reply(status, f"Incorrect API key provided: {SECRET}", kind="invalid_request_error")
        )
        provider = OpenAICompatible(base_url=emulator.base_url, model="m", api_key=SECRET, api_key_env="CODER_KEY")
        try:
            with pytest.raises(PermanentProviderError) as info:
                await provider.complete(HI, [])
        finally:
            await provider.aclose()
    text = str(info.value)
    assert f"chat completion refused ({status})" in text
    assert "check the API key in the variable CODER_KEY (provider.api_key_env)" in text
    assert emulator.base_url in text
    assert SECRET not in text


async def test_a_refusal_without_a_key_says_none_was_sent() -> None:
    async with OpenAIEmulator().serve() as emulator:
        emulator.replies.append(error_reply(401, "You didn't provide an API key.", kind="invalid_request_error"))
        provider = OpenAICompatible(base_url=emulator.base_url, model="m", api_key=None)
        try:
            with pytest.raises(PermanentProviderError, match=r"no API key was sent \(the card sets no provider"):
                await provider.complete(HI, [])
        finally:
            await provider.aclose()
    assert emulator.authorizations == [None]


async def test_a_404_says_nothing_about_the_key() -> None:
    async with OpenAIEmulator().serve() as emulator:
        emulator.replies.append(error_reply(404, "The model `m` does not exist", kind="invalid_request_error"))
        provider = OpenAICompatible(base_url=emulator.base_url, model="m", api_key=SECRET, api_key_env="CODER_KEY")
        try:
            with pytest.raises(PermanentProviderError) as info:
                await provider.complete(HI, [])
        finally:
            await provider.aclose()
    assert "CODER_KEY" not in str(info.value)


async def test_a_connection_error_names_the_endpoint_in_the_error_and_the_log_never_the_key() -> None:
    port = free_port()  # nothing listens there
    base_url = f"http://ci:{SECRET}@127.0.0.1:{port}/v1?api-key={SECRET}"
    provider = OpenAICompatible(base_url=base_url, model="m", api_key=SECRET, api_key_env="CODER_KEY", max_retries=0)
    try:
        with structlog.testing.capture_logs() as logs, pytest.raises(PermanentProviderError) as info:
            await provider.complete(HI, [])
    finally:
        await provider.aclose()
    text = str(info.value)
    assert f"chat completion request to http://127.0.0.1:{port}/v1 failed: ConnectError" in text
    assert SECRET not in text
    (failed,) = [entry for entry in logs if entry["event"] == "provider.failed"]
    assert failed["endpoint"] == f"http://127.0.0.1:{port}/v1"
    assert f"http://127.0.0.1:{port}/v1" in failed["error"]
    assert SECRET not in repr(logs)


async def test_a_run_whose_endpoint_is_down_fails_naming_it(
    bus: Bus, event_log: EventLog, executor: RunExecutor
) -> None:
    base_url = f"http://127.0.0.1:{free_port()}/v1"
    provider = ProviderConfig(kind="openai", base_url=base_url, model="m", max_retries=0)
    await executor(cards=[REVIEWER.model_copy(update={"provider": provider})])
    event = run_requested()
    await bus.publish(event)
    (failed,) = await event_log.wait_for("run.failed", run_id=event.runid)
    assert failed.data["reason"] == "provider_error"
    assert f"chat completion request to {base_url} failed: ConnectError" in failed.data["error"]


async def test_a_pattern_a_listed_server_has_no_tool_for_is_logged_not_refused(
    bus: Bus, nats_settings: NatsSettings, tmp_path: Path
) -> None:
    """``notes__wrte*`` could match the ``notes`` server's tools, so the start accepts it; once the server is listed
    (it has none such) the real process logs ``agents.tool_pattern_matches_nothing`` and becomes ready."""
    (tmp_path / "work").mkdir()
    notes = str(Path(__file__).with_name("mcp_notes_server.py"))
    card = {
        "id": "reviewer",
        "role": "Note reader",
        "system_prompt": "Read the note.",
        "tools": {"allow": ["notes__read_note", "notes__wrte*"]},
        "mcp_servers": [{"name": "notes", "command": sys.executable, "args": [notes]}],
        "sandbox": {"working_dir": "work"},
        "provider": {"kind": "scripted", "script": "reviewer"},
    }
    path = tmp_path / "agents.yaml"
    path.write_text(json.dumps({"agents": [card]}), encoding="utf-8")  # JSON is YAML
    port = free_port()
    env = {
        **os.environ,
        "TEMPORALITY_EXECUTOR_AGENTS_FILE": str(path),
        "TEMPORALITY_EXECUTOR_PORT": str(port),
        "TEMPORALITY_NATS_URL": nats_settings.url,
        "TEMPORALITY_LOG_FORMAT": "json",
    }
    output = tmp_path / "executor.log"
    with output.open("w", encoding="utf-8") as sink:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "temporality_run_executor", env=env, stdout=sink, stderr=asyncio.subprocess.STDOUT
        )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http, asyncio.timeout(120):
            while True:
                assert process.returncode is None, output.read_text(encoding="utf-8")
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get("/readyz")).status_code == 200:
                        break
                await asyncio.sleep(0.2)
    finally:
        if process.returncode is None:
            process.terminate()
        await asyncio.wait_for(process.wait(), 60)
    lines = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines() if line.startswith("{")]
    warned = [line for line in lines if line.get("event") == "agents.tool_pattern_matches_nothing"]
    assert [(line["agent"], line["pattern"], line["level"]) for line in warned] == [
        ("reviewer", "notes__wrte*", "warning")
    ]
