"""The bus catalogue is data; the README documents it (DC-6: services subscribe to journal subjects)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator
from pydantic import BaseModel

from temporality_protocol import EVENT_MODELS
from temporality_protocol.catalog import (
    ALL_BUCKETS,
    ALL_STREAMS,
    CONSUMERS,
    EVENTS_STREAM,
    RPC_AGENTS_CONFORMANCE,
    RPC_AGENTS_DEREGISTER,
    RPC_AGENTS_HEARTBEAT,
    RPC_AGENTS_LIST,
    RPC_AGENTS_REGISTER,
    RPC_AGENTS_TASKS_ACT,
    RPC_AGENTS_TASKS_POLL,
    RPC_GET_COLLABORATORS,
    RPC_HUMAN_CONSOLE_ROLE,
    RPC_HUMAN_VERIFY_PASSWORD,
    RPC_SUBJECTS,
    RPCS,
    SERVICES,
    TRIGGERABLE_EVENTS,
    ConsumerSpec,
    ServiceSpec,
    check_services,
    service_problems,
    subject_for,
    subject_matches,
)
from temporality_protocol.events import (
    AgentLimits,
    AgentPolicy,
    AgentRefusal,
    AgentsReply,
    AgentTask,
    CollaboratorsReply,
    ConformanceReply,
    ConformanceResult,
    ConsoleRoleReply,
    DeregistrationReply,
    HeartbeatAck,
    PasswordCheckReply,
    RegistrationReply,
    TaskActionReply,
    TaskAssignment,
    TaskPollReply,
    TaskRefusal,
)
from temporality_protocol.schemagen import rpc_file, rpc_schema
from temporality_protocol.states import AgentLifecycleState

README = Path(__file__).resolve().parents[3] / "README.md"
SCHEMAS = README.parent / "schemas"


def test_readme_documents_every_stream_consumer_bucket_and_rpc_subject() -> None:
    text = README.read_text(encoding="utf-8")
    names = [s.name for s in ALL_STREAMS] + list(CONSUMERS) + [b.name for b in ALL_BUCKETS] + list(RPC_SUBJECTS)
    missing = [name for name in names if f"`{name}`" not in text]
    assert not missing, f"README.md's bus catalogue lacks {missing}"


def test_every_consumer_filter_lies_inside_its_stream() -> None:
    streams = {s.name: s for s in ALL_STREAMS}
    for spec in CONSUMERS.values():
        prefixes = [p.removesuffix(">") for p in streams[spec.stream].subjects]
        for subject in spec.filter_subjects:
            assert any(subject.startswith(p) for p in prefixes), (spec.durable, subject)


def test_every_event_type_has_a_subject_in_the_events_stream() -> None:
    prefix = EVENTS_STREAM.subjects[0].removesuffix(">")
    for event_type in EVENT_MODELS:
        assert subject_for(event_type).startswith(prefix)
        assert "*" not in event_type
        assert ">" not in event_type


# --------------------------------------------------------------------------- the services
def test_the_service_table_is_consistent() -> None:
    assert service_problems() == []
    check_services()
    assert [s.script for s in SERVICES.values()] == [f"temporality-{name}" for name in SERVICES]
    assert {s.name: s.port_env for s in SERVICES.values() if s.http_port is not None} == {
        "trigger-gateway": "TEMPORALITY_GATEWAY_PORT",
        "human-interaction": "TEMPORALITY_HUMAN_PORT",
        "journal": "TEMPORALITY_JOURNAL_PORT",
    }


def test_receives_is_what_the_consumers_filter() -> None:
    # event triggers (TRG-5): the event types a trigger may listen to, never the whole journal
    assert set(SERVICES["trigger-gateway"].receives) == set(TRIGGERABLE_EVENTS)
    assert not SERVICES["trigger-gateway"].receives_all
    assert set(SERVICES["run-executor"].receives) == {
        "run.requested",
        "human.answered",
        "human.expired",
        "human.rejected",
        "run.cancel_requested",
        # run-executor-agents: what agent-collab routes to runs (COL-2..COL-4)
        "agent.message.received",
        "agent.answer.received",
        "agent.ask_expired",
        "agent.ask_undeliverable",
        "agent.reply_undeliverable",
        "agent.task.acted",  # AP-5: an external agent's action wakes the run parked on it
    }
    # its timer consumer is internal; run endings (and withdrawals) cancel pending requests; notifications go out;
    # run.requested feeds its own projection of each run's policy (SEC-1)
    assert set(SERVICES["human-interaction"].receives) == {
        "run.requested",
        "human.requested",
        "human.notify_requested",
        "run.completed",
        "run.failed",
        "run.cancelled",
        "human.cancel_requested",  # HUM-7: a run withdraws questions it no longer needs
    }
    assert SERVICES["journal"].receives_all
    assert set(SERVICES["journal"].receives) == set(EVENT_MODELS)


@pytest.mark.parametrize(
    ("pattern", "subject", "matches"),
    [
        ("a.b", "a.b", True),
        ("a.b", "a.b.c", False),
        ("a.*", "a.b", True),
        ("a.*", "a.b.c", False),
        ("a.>", "a.b.c", True),
        ("a.>", "a", False),
        ("a.*.c", "a.b.c", True),
        ("a.*.c", "a.b.d", False),
    ],
)
def test_subject_matches(pattern: str, subject: str, matches: bool) -> None:
    assert subject_matches(pattern, subject) is matches


def _with(name: str, **changes: object) -> dict[str, ServiceSpec]:
    return {**SERVICES, name: replace(SERVICES[name], **changes)}  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("services", "consumers", "problem"),
    [
        (_with("journal", consumers=("journal", "jornal")), CONSUMERS, "names consumer 'jornal'"),
        (_with("agent-collab", consumers=("agent-collab-runs", "journal")), CONSUMERS, "consumer journal belongs to 2"),
        (_with("agent-collab", consumers=(), sends=()), CONSUMERS, "consumer agent-collab-runs belongs to 0"),
        (_with("agent-collab", responders=("temporality.rpc.nope",)), CONSUMERS, "answers 'temporality.rpc.nope'"),
        (_with("agent-collab", responders=()), CONSUMERS, "is answered by 0 services"),
        (_with("run-executor", requests=("temporality.rpc.nope",)), CONSUMERS, "requests 'temporality.rpc.nope'"),
        (
            _with("trigger-gateway", consumers=(), timers=()),  # still sends bus.dead_lettered
            CONSUMERS,
            "exactly when",
        ),
        (_with("journal", sends=()), CONSUMERS, "exactly when"),
        (
            _with("journal", sends=("bus.dead_lettered", "journal.nope")),
            CONSUMERS,
            "'journal.nope', which has no model",
        ),
        (_with("trigger-gateway", sends=("trigger.received",)), CONSUMERS, "no service sends"),
        (_with("human-interaction", timers=()), CONSUMERS, "timer namespaces []"),
        (_with("run-executor", timers=("human",)), CONSUMERS, "timer namespaces ['human']"),
        (_with("journal", package="journal"), CONSUMERS, "is not temporality_<name>"),
        (_with("journal", env_prefix="JOURNAL_"), CONSUMERS, "is not TEMPORALITY_<WORD>_"),
        (_with("journal", http_port=8080), CONSUMERS, "is also trigger-gateway's"),
        ({**SERVICES, "jrnl": SERVICES["journal"]}, CONSUMERS, "keyed under another name"),
        (
            SERVICES,
            {**CONSUMERS, "journal": replace(CONSUMERS["journal"], filter_subjects=(subject_for("nope.x"),))},
            "no modelled event matches",
        ),
    ],
)
def test_an_inconsistent_service_table_is_refused(
    services: dict[str, ServiceSpec], consumers: dict[str, ConsumerSpec], problem: str
) -> None:
    problems = service_problems(services, consumers)
    assert any(problem in p for p in problems), problems
    with pytest.raises(ValueError, match="SERVICES is inconsistent"):
        check_services(services, consumers)


# --------------------------------------------------------------------------- request/reply as data
def test_every_rpc_subject_has_one_row_and_its_responder_answers_it() -> None:
    assert tuple(RPCS) == RPC_SUBJECTS
    for subject, spec in RPCS.items():
        assert spec.subject == subject
        assert subject.startswith("temporality.rpc.")
        assert subject in SERVICES[spec.responder].responders
    assert {s for s, spec in RPCS.items() if spec.external} == {
        "temporality.rpc.agents.*.register",
        "temporality.rpc.agents.*.heartbeat",
        "temporality.rpc.agents.*.deregister",
        "temporality.rpc.agents.*.list",
        "temporality.rpc.agents.*.conformance",
        "temporality.rpc.agents.*.tasks",
        "temporality.rpc.agents.*.act",
    }


def test_an_rpc_answered_by_another_service_than_its_row_names_is_refused() -> None:
    collab = SERVICES["agent-collab"]
    services = {
        **SERVICES,
        "agent-collab": replace(collab, responders=tuple(s for s in collab.responders if s != RPC_AGENTS_LIST)),
        "journal": replace(SERVICES["journal"], responders=(RPC_AGENTS_LIST,)),
    }
    problems = service_problems(services, CONSUMERS)
    assert any("answered by journal, but RPCS names agent-collab" in p for p in problems), problems


@pytest.fixture(scope="module")
def asyncapi() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((SCHEMAS / "asyncapi.yaml").read_text(encoding="utf-8"))
    return doc


def _message(doc: dict[str, Any], ref: str) -> dict[str, Any]:
    """Follow ``ref`` (and the refs it lands on) inside the document."""
    node: Any = doc
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    if "$ref" in node:
        return _message(doc, node["$ref"])
    message: dict[str, Any] = node
    return message


@pytest.mark.parametrize("subject", RPC_SUBJECTS)
def test_every_rpc_subject_is_in_the_asyncapi_document_with_its_schemas(asyncapi: dict[str, Any], subject: str) -> None:
    spec = RPCS[subject]
    (channel_id,) = [k for k, ch in asyncapi["channels"].items() if ch["address"] == spec.address]
    if spec.per_agent:  # each agent's own subject: the agent id is the channel's parameter
        assert spec.address == subject.replace(".*.", ".{agent_id}.")
        assert set(asyncapi["channels"][channel_id]["parameters"]) == {"agent_id"}
    channel = asyncapi["channels"][channel_id]
    (request_ref,) = channel["messages"].values()
    request = _message(asyncapi, request_ref["$ref"])
    assert request["name"] == f"{spec.name}.request"
    assert request["payload"] == {"$ref": f"./{rpc_file(spec, 'request')}"}
    # the responder's receive operation names the request and the reply
    (operation,) = [
        o
        for o in asyncapi["operations"].values()
        if o["channel"]["$ref"] == f"#/channels/{channel_id}" and o["action"] == "receive"
    ]
    assert operation["tags"] == [{"name": spec.responder}]
    (reply_ref,) = operation["reply"]["messages"]
    reply = _message(asyncapi, reply_ref["$ref"])
    assert reply["name"] == f"{spec.name}.reply"
    assert reply["payload"] == {"$ref": f"./{rpc_file(spec, 'reply')}"}
    for kind, model in (("request", spec.request), ("reply", spec.reply)):
        path = SCHEMAS / rpc_file(spec, kind)
        schema = json.loads(path.read_text(encoding="utf-8"))
        assert schema == rpc_schema(spec, kind), f"{path} is stale: make schemas"
        Draft202012Validator.check_schema(schema)
        assert schema["title"] == model.__name__
        assert schema["x-nats-subject"] == spec.address
        assert schema["x-rpc-responder"] == spec.responder
    # PRO-3: requests ignore unknown fields (open schema); our replies are exactly the negotiated shape
    request_schema = json.loads((SCHEMAS / rpc_file(spec, "request")).read_text(encoding="utf-8"))
    assert request_schema.get("additionalProperties", True) is not False
    if spec.external:
        reply_schema = json.loads((SCHEMAS / rpc_file(spec, "reply")).read_text(encoding="utf-8"))
        assert reply_schema["additionalProperties"] is False


_BODIES: dict[str, tuple[dict[str, Any], BaseModel]] = {
    RPC_AGENTS_REGISTER: (
        {
            "agent_id": "triage-bot", "protocol_version": "1.0", "protocol_versions": ["1.1", "0.9"],
            "provider": "acme", "model": "acme-large", "capabilities": ["triage"], "supported_tools": ["shell"],
            "max_context_size": 64000, "a_field_from_a_newer_version": {"x": 1},
        },
        RegistrationReply(
            agent_id="triage-bot", outcome="registered", protocol_version="1.0", supported_versions=["1.0"],
            state=AgentLifecycleState.REGISTERED, incarnation=1, heartbeat_interval_s=10, offline_after_s=12,
            policy=AgentPolicy(allowed_tools=[], limits=AgentLimits(max_context_size=64000, max_concurrent_tasks=1)),
        ),
    ),
    RPC_AGENTS_HEARTBEAT: (
        {
            "agent_id": "triage-bot", "timestamp": "2026-01-02T03:04:05Z", "current_state": "busy",
            "active_run_id": "run-1", "resource_usage": {"cpu": 0.4}, "protocol_version": "1.0", "extra": True,
        },
        HeartbeatAck(
            agent_id="triage-bot", accepted=False,
            refusal=AgentRefusal(reason="not_registered", detail="triage-bot is not registered"),
        ),
    ),
    RPC_AGENTS_DEREGISTER: (
        {"agent_id": "triage-bot", "protocol_version": "1.0", "reason": "shutting down"},
        DeregistrationReply(agent_id="triage-bot", outcome="decommissioned", state=AgentLifecycleState.DECOMMISSIONED),
    ),
    RPC_AGENTS_LIST: ({"protocol_versions": ["1.0"]}, AgentsReply(protocol_version="1.0")),
    RPC_AGENTS_CONFORMANCE: (
        {"agent_id": "triage-bot", "protocol_version": "1.0", "round": 1, "answers": [{"probe_id": "prb-1", "answer": "x"}]},
        ConformanceReply(
            agent_id="triage-bot", accepted=True, round=1,
            results=[ConformanceResult(capability="echo", verified=True, outcome="verified")],
        ),
    ),
    RPC_GET_COLLABORATORS: ({"run_id": "run-1"}, CollaboratorsReply(run_id="run-1", error="unknown run 'run-1'")),
    RPC_HUMAN_VERIFY_PASSWORD: (
        {"user_id": "alice", "password": "correct horse battery staple", "protocol_versions": ["1.0"]},
        PasswordCheckReply(ok=True, user_id="alice", display_name="Alice Example", role="operator", protocol_version="1.0"),
    ),
    RPC_HUMAN_CONSOLE_ROLE: ({"user_id": "dana"}, ConsoleRoleReply(user_id="dana", role="admin", protocol_version="1.0")),
    RPC_AGENTS_TASKS_POLL: (
        {"agent_id": "example-agent", "protocol_version": "1.0", "session_id": "s-1"},
        TaskPollReply(
            agent_id="example-agent", accepted=True,
            tasks=[TaskAssignment(
                task=AgentTask(
                    run_id="run-1", task_id="task-1", objective="Triage", context={}, constraints={},
                    acceptance_criteria=[], timeout_s=600, priority="normal",
                ),
                state="working", turn=1, inputs=[], acted=False,
            )],
        ),
    ),
    RPC_AGENTS_TASKS_ACT: (
        {
            "agent_id": "example-agent", "protocol_version": "1.0", "task_id": "task-1", "turn": 1,
            "action_id": "task-1:1:act", "kind": "tool_calls",
            "calls": [{"name": "ask_human", "arguments": {"recipient": "user:alice", "question": "Go?"}}],
        },
        TaskActionReply(
            agent_id="example-agent", task_id="task-1", accepted=False,
            refusal=TaskRefusal(reason="wrong_turn", detail="task task-1 is at turn 2, not 1"),
        ),
    ),
}  # fmt: skip


@pytest.mark.parametrize("subject", RPC_SUBJECTS)
def test_rpc_schemas_validate_real_bodies(subject: str) -> None:
    spec = RPCS[subject]
    request, reply = _BODIES[subject]
    Draft202012Validator(json.loads((SCHEMAS / rpc_file(spec, "request")).read_text(encoding="utf-8"))).validate(
        request
    )
    spec.request.model_validate(request)  # unknown fields ignored, not fatal (PRO-3)
    Draft202012Validator(json.loads((SCHEMAS / rpc_file(spec, "reply")).read_text(encoding="utf-8"))).validate(
        json.loads(reply.model_dump_json())
    )
