"""schemas/ is generated from the models (DC-4): committed copy is fresh, schemas describe real events."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from jsonschema import Draft202012Validator, ValidationError
from pydantic import ValidationError as PydanticValidationError

from temporality_protocol import EVENT_MODELS, EventData, encode, make_event
from temporality_protocol.catalog import (
    CONSUMERS,
    EVENTS_PREFIX,
    EVENTS_STREAM,
    RPC_GET_COLLABORATORS,
    RPCS,
    SERVICES,
    TRIGGERABLE_EVENTS,
    subject_for,
    subject_matches,
)
from temporality_protocol.events import (
    Actor,
    AgentAnswerReceived,
    AgentAsked,
    AgentAskExpired,
    AgentAskUndeliverable,
    AgentConformanceChecked,
    AgentHandedOff,
    AgentLifecycleChanged,
    AgentMessageReceived,
    AgentMessageRefused,
    AgentPolicyChanged,
    AgentReadmitted,
    AgentRegistered,
    AgentRegistrationRefused,
    AgentReplied,
    AgentReplyUndeliverable,
    AgentSummary,
    AgentTask,
    AgentTaskActed,
    AgentTaskCheckpointed,
    AgentTaskEnded,
    AgentTaskOffered,
    AgentTaskRefused,
    AgentTaskStreamed,
    AgentTaskTaken,
    ApiAccessRefused,
    BusDeadLettered,
    BusPermissionRefused,
    Collaborator,
    CollaboratorsQuery,
    CollaboratorsReply,
    ConformanceResult,
    DeliveryAttempt,
    Escalate,
    ExternalAgentGrant,
    HandoffDocument,
    HumanAnswered,
    HumanAnswerRefused,
    HumanCancelRequested,
    HumanDirectoryChanged,
    HumanEscalated,
    HumanExpired,
    HumanNotificationDelivered,
    HumanNotificationFailed,
    HumanNotified,
    HumanNotifyRequested,
    HumanOption,
    HumanPolicy,
    HumanReasked,
    HumanRejected,
    HumanRejectReason,
    HumanRequested,
    HumanWithdrawn,
    LaunchSource,
    NormalizedEvent,
    OptionAnswer,
    RelayRequest,
    Renotify,
    RunCancelled,
    RunCancelRequested,
    RunCheckpointed,
    RunCompleted,
    RunCreated,
    RunFailed,
    RunInputAfterEnd,
    RunRequested,
    RunResumed,
    RunSampled,
    RunStarted,
    RunStreamed,
    RunToolCalled,
    RunUsage,
    SandboxSummary,
    SourceLink,
    TaskInput,
    TextAnswer,
    TimeoutPolicy,
    ToolFailed,
    TriggerAccepted,
    TriggerCreated,
    TriggerDeleted,
    TriggerDisabled,
    TriggerEnabled,
    TriggerReceived,
    TriggerRejected,
    TriggerUpdated,
)
from temporality_protocol.schemagen import build_asyncapi, check, main

SCHEMAS = Path(__file__).resolve().parents[3] / "schemas"
T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
_LAUNCH = LaunchSource(kind="webhook", trigger_id="trg-pr", delivery_id="dlv-1")
_POLICY = HumanPolicy(
    allowed_recipients=["user:alice"],
    on_timeout=TimeoutPolicy(
        action="default",
        default_option="keep-v1",
        renotify=Renotify(every_s=900, max=2),
        escalate=Escalate(to="group:api-owners", after_s=1800),
    ),
)

#: One realistic instance per event type, optional fields filled so nested shapes are exercised.
EXAMPLES: dict[str, EventData] = {
    m.EVENT_TYPE: m
    for m in (
        TriggerReceived(
            trigger_id="trg-pr", delivery_id="dlv-1", adapter="azure_devops.pull_request",
            source_event_id="ado-1", source_event_type="git.pullrequest.created", body_bytes=5120,
        ),
        TriggerAccepted(trigger_id="trg-pr", delivery_id="dlv-1", source_event_id="ado-1", run_id="run-1", agent="reviewer"),
        TriggerRejected(
            trigger_id="trg-pr", delivery_id="dlv-2", reason="duplicate", detail="already started run-1",
            source_event_id="ado-1", run_id="run-1",
        ),
        TriggerCreated(
            trigger_id="trg-pr", revision=1, changed_by="file:config/triggers.yaml", trigger_type="webhook",
            agent="reviewer", enabled=True,
        ),
        TriggerUpdated(trigger_id="trg-pr", revision=2, changed_by="ci-bot", trigger_type="webhook", agent="reviewer"),
        TriggerEnabled(trigger_id="trg-pr", revision=3, changed_by="on-call", enabled=True),
        TriggerDisabled(trigger_id="trg-pr", revision=4, changed_by="on-call", enabled=False),
        TriggerDeleted(trigger_id="trg-pr", revision=5, changed_by="ci-bot"),
        RunRequested(
            run_id="run-1", agent="reviewer", title="Review PR 42", launch=_LAUNCH,
            event=NormalizedEvent(
                id="ado-1", type="azure_devops.git.pullrequest.created", source="https://dev.azure.com/fabrikam",
                timestamp=T0, actor=Actor(id="alice", display_name="Alice"), tenant="fabrikam",
                payload={"pull_request": {"id": 42}}, metadata={"project": "web"},
                source_link=SourceLink(href="https://dev.azure.com/fabrikam/web/_git/web/pullrequest/42", label="PR #42"),
            ),
            input={"repository": "web"}, human=_POLICY, parent_run_id="run-0",
            relay=RelayRequest(request_id="req-1", asker_run_id="run-3", asker_agent="planner", target_run_id="run-0"),
        ),
        RunCreated(run_id="run-1", agent="reviewer", title="Review PR 42", launch=_LAUNCH),
        RunStarted(
            run_id="run-1", agent="reviewer", role="reviewer", title="Review PR 42", parent_run_id="run-0",
            agent_card=AgentSummary(
                provider="openai", model="gpt-4o-mini", skills=["api-contracts"], tools=["get_input", "ask_human"],
                mcp_servers=["files"], max_turns=20, max_tokens=200000, max_compute_s=900.0,
                system_prompt_sha256="ab" * 32, sandbox=SandboxSummary(network=False, working_dir_set=True),
            ),
        ),
        RunToolCalled(
            run_id="run-1", turn=1, call_id="call-1", tool="read_diff", arguments={"path": "a.py"}, result_preview="+x",
        ),
        ToolFailed(run_id="run-1", turn=1, call_id="call-1", tool="read_diff", error="RuntimeError: disk gone"),
        RunSampled(
            run_id="run-1",
            turn=1,
            call_id="call-1",
            tool="notes__summarize",
            sample=0,
            model="gpt-4o-mini",
            prompt_preview="user: Summarize: the PR",
            result_preview="It fixes a typo.",
            prompt_tokens=30,
            completion_tokens=5,
            total_tokens=35,
        ),
        RunStreamed(
            run_id="run-1", agent="reviewer", turn=1, kind="progress", correlation_id="saga-1", request_id="run-1",
            message="reading", data={"pct": 10}, call_id="call-2",
        ),
        RunCheckpointed(run_id="run-1", checkpoint_id="ckp-1", turn=1),
        RunResumed(run_id="run-1", reason="answer", from_turn=2, request_id="hr-1", waited_s=840.0),
        RunCompleted(
            run_id="run-1", result="Approved with one comment", turns=4,
            usage=RunUsage(turns=4, tool_calls=3, prompt_tokens=900, completion_tokens=120, total_tokens=1020),
        ),
        RunFailed(run_id="run-1", reason="timeout", error="nobody answered"),
        RunCancelRequested(run_id="run-1", reason="wrong PR", requested_by="on-call"),
        RunCancelled(run_id="run-1", reason="cancelled by user:alice", usage=RunUsage(turns=1)),
        RunInputAfterEnd(
            run_id="run-1", state="cancelled", input_type="human.answered", input_id="evt-ans-1", request_id="hr-1",
            sender="user:alice", detail="run run-1 is cancelled: the answer to hr-1 was not applied",
        ),
        HumanRequested(
            request_id="hr-1", run_id="run-1", agent="reviewer", title="Review PR 42", recipient="user:alice",
            question="Keep the v1 endpoint?", context="The PR removes /v1; two clients still call it.",
            options=[HumanOption(id="keep-v1", label="Keep v1", consequence="PR gets a change request")],
            timeout_s=3600, expires_at=T0 + timedelta(hours=1), policy=_POLICY, turn=2,
            source_link=SourceLink(href="https://dev.azure.com/fabrikam/web/_git/web/pullrequest/42", label="PR #42"),
        ),
        HumanNotified(
            request_id="hr-1", run_id="run-1", recipient="user:alice", channel="matrix", fallback_from="telegram",
            failed_attempts=[DeliveryAttempt(channel="telegram", error="Forbidden: bot was blocked by the user")],
        ),
        HumanNotifyRequested(
            notification_id="hn-1", run_id="run-1", agent="reviewer", title="Review PR 42", recipient="user:alice",
            message="Review finished: two comments.", policy=_POLICY, turn=3,
        ),
        HumanCancelRequested(run_id="run-1", request_ids=["hr-2", "hr-3"], answered="hr-1"),
        HumanRejected(
            request_id="hr-1", run_id="run-1", recipient="user:mallory", reason="recipient_not_allowed",
            detail="user:mallory is not in allowed_recipients",
        ),
        HumanAnswered(
            request_id="hr-1", run_id="run-1", recipient="user:alice", responder="user:alice",
            answer=TextAnswer(value="keep it one more release"), channel="web", waited_s=840.0,
        ),
        HumanAnswerRefused(
            request_id="hr-1", run_id="run-1", recipient="user:alice", responder="telegram:3003",
            channel="telegram", reason="not_recipient", detail="this question was not sent to you",
            received_at=datetime(2026, 12, 1, 9, 30, tzinfo=UTC),
            answer=OptionAnswer(option_id="keep-v1", label="Keep v1"),
        ),
        HumanExpired(
            request_id="hr-1", run_id="run-1", recipient="user:alice", action="default",
            default_answer=OptionAnswer(option_id="keep-v1", label="Keep v1"), waited_s=3600.0,
        ),
        HumanWithdrawn(
            request_id="hr-1", run_id="run-1", recipient="user:alice", channel="telegram", reason="run_failed",
            run_reason="compute_timeout", asked_at=datetime(2026, 12, 7, 9, 0, tzinfo=UTC),
            withdrawn_at=datetime(2026, 12, 7, 9, 30, tzinfo=UTC), waited_s=1800.0,
        ),
        HumanReasked(
            request_id="hr-1", run_id="run-1", recipient="user:alice", attempt=1, of=2, channels=["telegram"],
            failed_attempts=[DeliveryAttempt(channel="matrix", error="homeserver unreachable")],
        ),
        HumanEscalated(
            request_id="hr-1", run_id="run-1", recipient="user:alice", to="group:api-owners",
            members=["user:bob", "user:carol"], channels=["web", "telegram"],
        ),
        HumanDirectoryChanged(
            kind="user", entry_id="carol", action="updated", revision=7, changed_by="ci-bot", role="admin",
            changed_fields=["inbox_token", "preferred"],
            after={"id": "carol", "display_name": "Carol", "preferred": "telegram", "inbox_token_set": True},
        ),
        HumanNotificationDelivered(
            notification_id="hn-1", run_id="run-1", recipient="group:api-owners", person="user:bob",
            channel="web", fallback_from="telegram",
            failed_attempts=[DeliveryAttempt(channel="telegram", error="bot blocked by the user")],
            delivery=2, redacted={"token": 1},
        ),
        HumanNotificationFailed(
            notification_id="hn-2", run_id="run-1", recipient="user:alice", reason="no_channel",
            detail="every channel failed on 8 deliveries", unreached=["user:alice"],
            failed_attempts=[DeliveryAttempt(channel="telegram", error="bot blocked by the user")], deliveries=8,
        ),
        AgentAsked(
            request_id="req-1", asker_run_id="run-1", asker_agent="planner", to="agent:reviewer", mode="wait",
            timeout_s=600, message="Is PR 42 safe to merge?", turn=3,
        ),
        AgentMessageReceived(
            request_id="req-1", asker_run_id="run-1", asker_agent="planner", to="agent:reviewer",
            resolved_run_id="run-2", resolved_agent="reviewer", recipient_run_id="run-2/ask/01", mode="wait",
            timeout_s=600, expires_at=T0 + timedelta(minutes=10), message="Is PR 42 safe to merge?", relay=True,
            relay_run="run-2/ask/01",
        ),
        AgentReplied(
            request_id="req-1", replier_run_id="run-2/ask/01", replier_agent="reviewer", outcome="refusal",
            answer="I only review code, ask the release manager", turn=1,
        ),
        AgentHandedOff(
            handoff_id="ho-1", parent_run_id="run-1", parent_agent="planner", child_run_id="run-3",
            agent="reviewer", call_id="call-1", turn=2,
            document=HandoffDocument(
                objective="Review PR 42", current_status="planned", completed_steps=["read the PR"],
                remaining_steps=["review the API change"], acceptance_criteria=["a verdict with reasons"],
            ),
        ),
        AgentAnswerReceived(
            request_id="req-1", asker_run_id="run-1", replier_run_id="run-2/ask/01", replier_agent="reviewer",
            outcome="answer", answer="Yes", mode="wait", late=True, relay=True, relay_run="run-2/ask/01",
            waited_s=700.0,
        ),
        AgentAskExpired(request_id="req-1", asker_run_id="run-1", recipient_run_id="run-2", timeout_s=600, waited_s=600.0),
        AgentAskUndeliverable(
            request_id="req-1", asker_run_id="run-1", to="agent:ghost", reason="unknown_addressee",
            detail="no agent 'ghost' in this saga",
        ),
        AgentReplyUndeliverable(
            request_id="req-1", replier_run_id="run-2", asker_run_id="run-1", reason="asker_finished",
            detail="run-1 has finished: the reply is journaled, nowhere to deliver it",
        ),
        AgentRegistered(
            agent_id="triage-bot", incarnation=1, registration=1, protocol_version="1.0", provider="acme",
            model="acme-large", capabilities=["triage"], supported_tools=["get_input", "shell"],
            allowed_tools=["get_input"], max_context_size=64000, heartbeat_interval_s=10.0,
        ),
        AgentRegistrationRefused(
            agent_id="triage-bot", reason="no_common_version", detail="we speak 1.0, it speaks 9.0",
            declared_versions=["9.0"], supported_versions=["1.0"], provider="acme", model="acme-large",
        ),
        AgentLifecycleChanged(
            agent_id="triage-bot", incarnation=1, seq=3, from_state="idle", to_state="offline",
            reason="heartbeat_missed", detail="no heartbeat for 12 s",
        ),
        AgentMessageRefused(
            agent_id="triage-bot", subject="temporality.rpc.agents.heartbeat", reason="replayed_nonce",
            detail="nonce 'n0nce-0000000001' was already used by 'triage-bot'", key_id="triage-bot",
            nonce="n0nce-0000000001", signed_at=datetime(2026, 12, 1, tzinfo=UTC), body_sha256="0" * 64,
        ),
        AgentReadmitted(agent_id="triage-bot", incarnation=2, requested_by="on-call", reason="key rotated"),
        AgentPolicyChanged(
            agent_id="triage-bot", change="changed",
            before=ExternalAgentGrant(allowed_tools=["get_input", "notify"], max_concurrent_tasks=1,
                                      heartbeat_interval_s=10, public_key_sha256="a" * 64),
            after=ExternalAgentGrant(allowed_tools=["get_input"], max_concurrent_tasks=1, heartbeat_interval_s=10,
                                     public_key_sha256="a" * 64),
            tools_revoked=["notify"], requested_by="file:config/external-agents.yaml",
        ),
        AgentConformanceChecked(
            agent_id="triage-bot", incarnation=1, round=1, passed=False,
            results=[
                ConformanceResult(capability="echo", verified=True, outcome="verified"),
                ConformanceResult(capability="reverse", verified=False, outcome="wrong_answer", detail="got 'abc'"),
            ],
            started_at=datetime(2026, 12, 1, 9, 0, tzinfo=UTC), deadline=datetime(2026, 12, 1, 9, 0, 10, tzinfo=UTC),
            answered_at=datetime(2026, 12, 1, 9, 0, 1, tzinfo=UTC),
        ),
        AgentTaskOffered(
            run_id="run-1", task_id="task-1", agent_id="example-agent", turn=2,
            task=AgentTask(
                run_id="run-1", task_id="task-1", objective="Triage PR #42", context={"people": ["user:alice"]},
                constraints={"tools": ["ask_human"]}, acceptance_criteria=["a person decided"], timeout_s=600,
                priority="normal",
            ),
            inputs=[TaskInput(tool_call_id="ext-1-0", tool="ask_human", content='{"answer": "yes"}')],
        ),
        AgentTaskTaken(
            run_id="run-1", task_id="task-1", agent_id="example-agent", turn=1, take=2, session_id="s-2",
            resumed=True, checkpoint_id="ackpt-1",
        ),
        AgentTaskActed(
            run_id="run-1", task_id="task-1", agent_id="example-agent", turn=1, action_id="task-1:1:act",
            kind="tool_calls", tools=["ask_human"],
        ),
        AgentTaskCheckpointed(
            run_id="run-1", task_id="task-1", agent_id="example-agent", turn=1, checkpoint_id="ackpt-1",
            artifact_references=["s3://bucket/notes.md"], size_bytes=321,
        ),
        AgentTaskStreamed(
            run_id="run-1", task_id="task-1", agent_id="example-agent", turn=1, kind="progress",
            correlation_id="saga-1", request_id="task-1", message="reading", data={"pct": 10},
        ),
        AgentTaskEnded(
            run_id="run-1", task_id="task-1", agent_id="example-agent", turn=1, state="cancelled",
            cause="run.cancelled", taken=True,
        ),
        AgentTaskRefused(
            agent_id="example-agent", task_id="task-1", turn=2, action_id="task-1:2:act", kind="result",
            reason="wrong_turn", detail="task task-1 is at turn 1, not 2",
        ),
        ApiAccessRefused(
            service="journal", status=403, reason="forbidden", method="POST", path="/runs/run-1/cancel",
            address="10.0.0.9", principal="board", role_needed="operator", count=3, first_at=T0, window_s=60,
        ),
        BusPermissionRefused(
            service="trigger-gateway", operation="publish", subject="temporality.events.human.answered", count=2,
            first_at=T0, window_s=60,
        ),
        BusDeadLettered(
            consumer="journal", stream="TEMPORALITY_EVENTS", subject="temporality.events.run.started", stream_seq=7,
            deliveries=8, error="bad data", dlq_subject="temporality.dlq.journal", original_id="evt-1",
            original_type="run.started",
        ),
    )
}  # fmt: skip


def _load(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return loaded


def _validator(relative: str) -> Draft202012Validator:
    schema = _load(SCHEMAS / relative)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------- freshness
def test_committed_schemas_are_fresh(tmp_path: Path) -> None:
    assert main([str(tmp_path)]) == 0
    fresh, committed = _files(tmp_path), _files(SCHEMAS)
    stale = sorted(p for p in fresh.keys() | committed.keys() if fresh.get(p) != committed.get(p))
    assert not stale, f"schemas/ is stale ({', '.join(stale)}): run make schemas"


def test_check_lists_stale_and_extra_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path)]) == 0
    assert main([str(tmp_path), "--check"]) == 0
    (tmp_path / "events" / "run.started.schema.json").write_text("{}\n", encoding="utf-8")
    (tmp_path / "events" / "run.gone.schema.json").write_text("{}\n", encoding="utf-8")
    (tmp_path / "asyncapi.yaml").unlink()
    capsys.readouterr()
    assert main([str(tmp_path), "--check"]) == 1
    err = capsys.readouterr().err
    assert "make schemas" in err
    for name in ("events/run.started.schema.json", "events/run.gone.schema.json", "asyncapi.yaml"):
        assert name in err
    assert main([str(tmp_path)]) == 0  # rewriting repairs it and drops what is no longer generated
    assert check(tmp_path) == []
    assert not (tmp_path / "events" / "run.gone.schema.json").exists()


# --------------------------------------------------------------------------- schemas describe real events
def test_every_event_type_has_an_example() -> None:
    assert set(EXAMPLES) == set(EVENT_MODELS), "add an example for each new event type to EXAMPLES"


@pytest.mark.parametrize("event_type", sorted(EVENT_MODELS))
def test_event_schema_validates_encoded_example(event_type: str) -> None:
    wire = json.loads(
        encode(make_event(EXAMPLES[event_type], source="/temporality/test", run_id="run-1", actor="user:alice"))
    )
    _validator("envelope.schema.json").validate(wire)
    schema = _validator(f"events/{event_type}.schema.json")
    schema.validate(wire["data"])
    assert schema.schema["x-event-type"] == event_type
    assert schema.schema["x-nats-subject"] == subject_for(event_type)
    assert schema.schema["$id"].endswith(f":event:{event_type}")
    required = schema.schema["required"]
    broken = {k: v for k, v in wire["data"].items() if k != required[0]}
    with pytest.raises(ValidationError):
        schema.validate(broken)


@pytest.mark.parametrize("reason", get_args(HumanRejectReason))
def test_human_rejected_reads_every_reason_of_its_vocabulary(reason: str) -> None:
    """``human.rejected``'s reasons are a closed list (the committed schema's enum and the model agree); an intake
    human-interaction gave up on has its own, ``intake_failed`` (before: ``no_channel``, which says something else)."""
    data = {"request_id": "hr-1", "run_id": "run-1", "recipient": "user:alice", "reason": reason, "detail": "x"}
    _validator("events/human.rejected.schema.json").validate(data)
    assert HumanRejected.model_validate(data).reason == reason
    assert "intake_failed" in get_args(HumanRejectReason)
    with pytest.raises(ValidationError):
        _validator("events/human.rejected.schema.json").validate({**data, "reason": "bored"})


def test_trigger_rejected_schema_takes_every_reason_and_no_other() -> None:
    """Every ``TriggerRejected.reason`` the model takes (``launch_lost`` among them) is one the committed schema
    takes, so a consumer validating against schemas/ reads each; an unknown reason is refused by both."""
    schema = _validator("events/trigger.rejected.schema.json")
    reasons = get_args(TriggerRejected.model_fields["reason"].annotation)
    assert "launch_lost" in reasons
    for reason in reasons:
        data = TriggerRejected(trigger_id="trg-pr", delivery_id="dlv-3", reason=reason, detail="why")
        schema.validate(json.loads(data.model_dump_json(exclude_none=True)))
    with pytest.raises(ValidationError):
        schema.validate({"trigger_id": "trg-pr", "delivery_id": "dlv-3", "reason": "launch_misplaced", "detail": "?"})


def test_run_started_agent_card_reads_with_and_without_prompt_digest_and_sandbox() -> None:
    """RUN-1: the agent card's prompt digest and sandbox are optional (an older executor's run.started has neither);
    the digest is a lowercase SHA-256 hex digest, in the model and in the committed schema alike."""
    schema = _validator("events/run.started.schema.json")
    card = {"provider": "scripted", "max_turns": 3, "max_compute_s": 60.0}
    old = {"run_id": "run-1", "agent": "reviewer", "role": "reviewer", "title": "t", "agent_card": card}
    schema.validate(old)
    assert RunStarted.model_validate(old).agent_card == AgentSummary(
        provider="scripted", max_turns=3, max_compute_s=60.0
    )
    new = {**old, "agent_card": {**card, "system_prompt_sha256": "0f" * 32, "sandbox": {"network": False}}}
    schema.validate(new)
    parsed = RunStarted.model_validate(new).agent_card
    assert parsed is not None
    assert parsed.sandbox == SandboxSummary(kind="process", network=False, working_dir_set=False)
    for bad in ("0F" * 32, "0f" * 31, "not-a-digest"):
        broken = {**old, "agent_card": {**card, "system_prompt_sha256": bad}}
        with pytest.raises(ValidationError):
            schema.validate(broken)
        with pytest.raises(PydanticValidationError):
            RunStarted.model_validate(broken)


def test_envelope_schema_requires_our_attributes() -> None:
    envelope = _validator("envelope.schema.json")
    assert {"runid", "correlationid", "causationid", "actor", "tenant", "protocolversion"} <= set(
        envelope.schema["properties"]
    )
    wire = json.loads(encode(make_event(EXAMPLES["run.started"], source="/x")))
    envelope.validate(wire)
    for attribute in ("protocolversion", "specversion", "id", "type"):
        with pytest.raises(ValidationError):
            envelope.validate({k: v for k, v in wire.items() if k != attribute})


def test_rpc_schemas_validate_real_bodies() -> None:
    query = CollaboratorsQuery(run_id="run-1")
    reply = CollaboratorsReply(
        run_id="run-1", saga_id="run-0", protocol_version="1.0",
        collaborators=[Collaborator(id="agent:reviewer", kind="agent", role="reviewer", task="Review", status="running")],
    )  # fmt: skip
    _validator("rpc/collab.get_collaborators.request.schema.json").validate(query.model_dump(mode="json"))
    _validator("rpc/collab.get_collaborators.reply.schema.json").validate(reply.model_dump(mode="json"))


# --------------------------------------------------------------------------- AsyncAPI
@pytest.fixture(scope="module")
def asyncapi() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((SCHEMAS / "asyncapi.yaml").read_text(encoding="utf-8"))
    return doc


def test_asyncapi_parses_back_to_the_generated_document(asyncapi: dict[str, Any]) -> None:
    assert asyncapi == build_asyncapi()  # the hand-rolled YAML emitter round-trips through PyYAML
    assert asyncapi["asyncapi"] == "3.0.0"
    assert asyncapi["info"]["version"] == "1.0"
    assert asyncapi["servers"]["nats"]["protocol"] == "nats"


def test_asyncapi_lists_every_event_type(asyncapi: dict[str, Any]) -> None:
    addresses = {ch["address"]: ch for ch in asyncapi["channels"].values()}
    for event_type in EVENT_MODELS:
        channel = addresses[subject_for(event_type)]
        (ref,) = channel["messages"].values()
        message = asyncapi["components"]["messages"][ref["$ref"].rsplit("/", 1)[1]]
        assert message["name"] == event_type
        assert message["contentType"] == "application/cloudevents+json"
        assert {"$ref": f"./events/{event_type}.schema.json"} in (
            s.get("properties", {}).get("data") for s in message["payload"]["allOf"]
        )
    assert RPC_GET_COLLABORATORS in addresses


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def test_asyncapi_references_resolve(asyncapi: dict[str, Any]) -> None:
    for ref in _refs(asyncapi):
        if ref.startswith("#/"):
            node: Any = asyncapi
            for part in ref[2:].split("/"):
                node = node[part]
        else:
            assert (SCHEMAS / ref).is_file(), ref


def _operations_by_service(asyncapi: dict[str, Any]) -> dict[str, dict[str, set[str]]]:
    """service -> action -> channel addresses (``None`` for the reply channel)."""
    found: dict[str, dict[str, set[str]]] = {}
    for operation in asyncapi["operations"].values():
        channel = asyncapi["channels"][operation["channel"]["$ref"].rsplit("/", 1)[1]]
        (tag,) = operation["tags"]
        found.setdefault(tag["name"], {}).setdefault(operation["action"], set()).add(channel["address"])
    return found


def test_asyncapi_operations_match_consumer_catalogue(asyncapi: dict[str, Any]) -> None:
    """Receive operations are exactly the consumers' event filter subjects of the service that owns them."""
    received = {name: ops.get("receive", set()) for name, ops in _operations_by_service(asyncapi).items()}
    for spec in SERVICES.values():
        filters = {
            subject
            for durable in spec.consumers
            if CONSUMERS[durable].stream == EVENTS_STREAM.name  # timers are internal
            for subject in CONSUMERS[durable].filter_subjects
        }
        expected = {RPCS[s].address for s in spec.responders} | (
            {f"{EVENTS_PREFIX}.>"}
            if f"{EVENTS_PREFIX}.>" in filters
            else {subject_for(t) for t in EVENT_MODELS if any(subject_matches(f, subject_for(t)) for f in filters)}
        )
        assert received.get(spec.name, set()) == expected, spec.name


def test_asyncapi_operations_are_the_catalogue_s_and_no_more(asyncapi: dict[str, Any]) -> None:
    """Sends are the declared ``sends``; a service without consumers receives nothing; RPC roles as declared."""
    by_service = _operations_by_service(asyncapi)
    assert set(by_service) <= set(SERVICES)
    assert [t["name"] for t in asyncapi["info"]["tags"]] == list(SERVICES)
    for spec in SERVICES.values():
        ops = by_service.get(spec.name, {})
        requests = {RPCS[s].address for s in spec.requests}
        assert ops.get("send", set()) == {subject_for(t) for t in spec.sends} | requests, spec.name
        if not spec.consumers and not spec.responders:
            assert "receive" not in ops, f"{spec.name} subscribes to nothing, so it receives nothing"
    gateway = by_service["trigger-gateway"]
    assert set(gateway) == {"send", "receive"}
    # event triggers: it receives the event types a trigger may listen to, never the whole journal
    assert gateway["receive"] == {subject_for(t) for t in TRIGGERABLE_EVENTS}
    assert subject_for("bus.dead_lettered") in gateway["send"], "a consumer, so it dead-letters"
    replies = [o for o in asyncapi["operations"].values() if "reply" in o]
    assert {o["tags"][0]["name"] for o in replies} == {s.name for s in SERVICES.values() if s.responders or s.requests}
