"""The example agent signs in the embedded stack (AP-11): ``temporality up`` makes its key once (mode 0600) and gives
agent-collab the configured allow-list with its public key in place of ``allow_unsigned``, never changing the
configured file; a file that lists it with a key of its own, or not at all, is agent-collab's as it is."""

from __future__ import annotations

import base64
import shutil
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from temporality_agent_collab.external import load_allow_list
from temporality_embedded.stack import EXAMPLE_AGENT_ID, Stack, StackConfig, sign_listed_agent

CONFIG = Path(__file__).resolve().parents[3] / "config"
SETTING = "TEMPORALITY_COLLAB_EXTERNAL_AGENTS_FILE"


def _public(key: Ed25519PrivateKey) -> str:
    return base64.b64encode(key.public_key().public_bytes_raw()).decode()


def _stack(tmp_path: Path, allow_list: str | None = None, *, on: bool = True) -> Stack:
    config = tmp_path / "config"
    shutil.copytree(CONFIG, config)
    if allow_list is not None:
        (config / "external-agents.yaml").write_text(allow_list, encoding="utf-8")
    return Stack(StackConfig(data_dir=tmp_path / "data", config_dir=config, example_agent_key=on))


def test_the_shipped_allow_list_signs_nobody_unsigned() -> None:
    allow = load_allow_list(CONFIG / "external-agents.yaml")
    example = allow.get(EXAMPLE_AGENT_ID)
    assert example is not None
    assert not [a.id for a in allow.agents if a.allow_unsigned], "the shipped allow-list accepts an unsigned agent"
    assert example.public_key is None  # temporality up gives it its key; anywhere else the operator does


def test_up_makes_the_key_once_and_gives_agent_collab_the_list_with_it(tmp_path: Path) -> None:
    stack = _stack(tmp_path)
    configured = (tmp_path / "config" / "external-agents.yaml").read_bytes()
    assert stack.env_for("agent-collab")[SETTING] == str(stack.configured_allow_list)  # nothing made before start
    stack._prepare()
    key_file = tmp_path / "data" / "example-agent.key"
    assert stack.example_agent_key_file == key_file.resolve()
    assert key_file.stat().st_mode & 0o077 == 0, "the example agent's key is readable by others"
    assert key_file.with_suffix(".pub").read_text(encoding="utf-8").strip() == stack.example_agent_public_key
    # PEM PKCS#8, as agent.py keygen writes it
    key = load_pem_private_key(key_file.read_bytes(), password=None)
    assert isinstance(key, Ed25519PrivateKey)
    assert _public(key) == stack.example_agent_public_key
    derived = Path(stack.env_for("agent-collab")[SETTING])
    assert derived != stack.configured_allow_list
    assert derived.parent == stack.data_dir
    assert derived.stat().st_mode & 0o077 == 0
    allow = load_allow_list(derived)  # what agent-collab reads: valid, the agent keyed, nothing else changed
    example = allow.get(EXAMPLE_AGENT_ID)
    assert example is not None
    assert example.public_key == stack.example_agent_public_key
    assert not example.allow_unsigned
    shipped = load_allow_list(stack.configured_allow_list)
    assert allow.model_dump(exclude={"agents"}) == shipped.model_dump(exclude={"agents"})
    assert example.model_dump(exclude={"public_key"}) == shipped.agents[0].model_dump(exclude={"public_key"})
    assert (tmp_path / "config" / "external-agents.yaml").read_bytes() == configured, "the user's file changed"
    assert not stack.example_agent_was_unsigned
    # the next start reuses the key (the printed --key-file stays true)
    pem = key_file.read_bytes()
    again = Stack(stack.config)
    again._prepare()
    assert key_file.read_bytes() == pem
    assert again.example_agent_public_key == stack.example_agent_public_key


def test_a_user_s_list_keeps_its_other_agents_and_loses_the_example_s_allow_unsigned(tmp_path: Path) -> None:
    other = _public(Ed25519PrivateKey.generate())
    stack = _stack(
        tmp_path,
        "heartbeat_interval_s: 3\n"
        "agents:\n"
        f"  - id: triage-bot\n    allowed_tools: [notify]\n    public_key: {other}\n"
        "  - id: dev-bot\n    allow_unsigned: true\n"
        f"  - id: {EXAMPLE_AGENT_ID}\n    allowed_tools: [get_input]\n    allow_unsigned: true\n",
    )
    stack._prepare()
    assert stack.example_agent_was_unsigned, "up says the file's allow_unsigned is not used"
    allow = load_allow_list(stack.allow_list_file)
    assert allow.heartbeat_interval_s == 3
    assert [a.id for a in allow.agents] == ["triage-bot", "dev-bot", EXAMPLE_AGENT_ID]
    triage, dev, example = allow.agents
    assert (triage.public_key, triage.allowed_tools) == (other, ["notify"])
    assert dev.allow_unsigned, "another agent's own choice stands"
    assert (example.public_key, example.allow_unsigned) == (stack.example_agent_public_key, False)
    assert example.allowed_tools == ["get_input"]


@pytest.mark.parametrize(
    "allow_list",
    [
        pytest.param("agents:\n  - id: triage-bot\n    allow_unsigned: true\n", id="not-listed"),
        pytest.param(f"agents:\n  - id: {EXAMPLE_AGENT_ID}\n    public_key: OWN\n", id="own-key"),
        pytest.param("agents: [oops\n", id="not-yaml"),
        pytest.param("- just a list\n", id="not-a-mapping"),
    ],
)
def test_a_list_with_no_place_for_the_key_is_agent_collab_s_as_it_is(tmp_path: Path, allow_list: str) -> None:
    """No key is made, agent-collab reads the configured file (and says what is wrong with it, if anything)."""
    allow_list = allow_list.replace("OWN", _public(Ed25519PrivateKey.generate()))
    stack = _stack(tmp_path, allow_list)
    stack._prepare()
    assert stack.env_for("agent-collab")[SETTING] == str(stack.configured_allow_list)
    assert stack.example_agent_public_key is None
    assert not stack.example_agent_key_file.exists()


def test_off_agent_collab_reads_the_configured_file(tmp_path: Path) -> None:
    stack = _stack(tmp_path, on=False)
    stack._prepare()
    assert stack.env_for("agent-collab")[SETTING] == str(stack.configured_allow_list)
    assert stack.example_agent_public_key is None
    assert not stack.example_agent_key_file.exists()


def test_a_key_file_that_holds_no_key_is_refused_not_replaced(tmp_path: Path) -> None:
    stack = _stack(tmp_path)
    stack.data_dir.mkdir(parents=True)
    stack.example_agent_key_file.write_bytes(b"not a key")
    with pytest.raises(ValueError, match=r"example-agent\.key"):
        stack._prepare()
    assert stack.example_agent_key_file.read_bytes() == b"not a key"


def test_the_key_goes_in_place_of_allow_unsigned_alone() -> None:
    text = "# mine\nheartbeat_interval_s: 5\nagents:\n  - id: a\n  - {id: example-agent, allow_unsigned: true}\n"
    signed = sign_listed_agent(text, EXAMPLE_AGENT_ID, "KEY")
    assert signed is not None
    doc, unsigned = signed
    assert unsigned
    assert doc == {"heartbeat_interval_s": 5, "agents": [{"id": "a"}, {"id": "example-agent", "public_key": "KEY"}]}
    assert yaml.safe_load(text)["agents"][1] == {"id": "example-agent", "allow_unsigned": True}
    twice = "agents:\n  - id: example-agent\n  - id: example-agent\n"
    assert sign_listed_agent(twice, EXAMPLE_AGENT_ID, "KEY") is None  # agent-collab refuses that file itself
