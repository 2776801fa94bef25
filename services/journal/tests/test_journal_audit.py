"""``GET /audit`` (issue 11, AP-11): the critical actions, who did them and when; never a secret."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from journal_support import ADMIN, OPERATOR

from temporality_journal.audit import AUDIT_KINDS, REDACTED, redact
from temporality_protocol import (
    BusDeadLettered,
    Envelope,
    EventData,
    HumanRejected,
    RunCancelRequested,
    RunStarted,
    TriggerCreated,
    TriggerDisabled,
    derive_id,
    make_event,
)
from temporality_protocol.events import (
    AgentAskUndeliverable,
    AgentHandedOff,
    AgentMessageRefused,
    AgentPolicyChanged,
    AgentReadmitted,
    AgentTaskRefused,
    ExternalAgentGrant,
    HandoffDocument,
    HumanAnswerRefused,
    HumanDirectoryChanged,
    HumanNotificationFailed,
)

Journal = Any  # conftest.Journal
T0 = datetime(2026, 5, 4, 12, 0, tzinfo=UTC)


def _ev(data: EventData, at: int, *, actor: str | None = None, run_id: str | None = None) -> Any:
    return make_event(
        data,
        source="/temporality/test",
        id=derive_id("evt", "audit", data.EVENT_TYPE, str(at)),
        run_id=run_id,
        actor=actor,
        time=T0 + timedelta(minutes=at),
    )


def _lifecycle(reason: str, at: int) -> Envelope:
    """An external agent's lifecycle move (built as a plain envelope: the journal reads it as stored)."""
    return Envelope(
        id=derive_id("evt", "audit", "lifecycle", reason),
        source="/temporality/agent-collab",
        type="agent.lifecycle_changed",
        time=T0 + timedelta(minutes=at),
        actor="service:agent-collab",
        data={"agent_id": "ext-1", "incarnation": 1, "seq": at, "from_state": "a", "to_state": "b", "reason": reason},
    )


def test_credential_like_values_are_redacted_and_flags_kept() -> None:
    data = {"after": {"inbox_token": "s3cret", "inbox_token_set": True, "name": "Alice"}, "items": [{"Password": "x"}]}
    assert redact(data) == {
        "after": {"inbox_token": REDACTED, "inbox_token_set": True, "name": "Alice"},
        "items": [{"Password": REDACTED}],
    }


async def test_audit_lists_the_critical_actions_with_who_and_when(journal: Journal) -> None:
    events = [
        _ev(
            TriggerCreated(trigger_id="ado-pr", revision=1, changed_by="root", agent="reviewer"), 1, actor="token:root"
        ),
        _ev(
            HumanDirectoryChanged(
                kind="user",
                entry_id="alice",
                action="updated",
                revision=7,
                changed_by="root",
                changed_fields=["inbox_token"],
                after={"id": "alice", "inbox_token_set": True, "inbox_token": "leaked-by-a-bug"},
            ),
            2,
            actor="token:root",
        ),
        _ev(RunCancelRequested(run_id="run-1", reason="PR closed", requested_by="oncall"), 3, run_id="run-1"),
        _ev(
            HumanRejected(
                request_id="h1", run_id="run-1", recipient="user:eve", reason="recipient_not_allowed", detail="no"
            ),
            4,
            run_id="run-1",
        ),
        _ev(  # not a permission refusal: not audited
            HumanRejected(request_id="h2", run_id="run-1", recipient="user:bob", reason="no_channel", detail="none"),
            5,
            run_id="run-1",
        ),
        _ev(
            AgentAskUndeliverable(
                request_id="req-1", asker_run_id="run-1", to="agent:ghost", reason="unknown_addressee", detail="no one"
            ),
            6,
            run_id="run-1",
        ),
        _ev(
            BusDeadLettered(
                consumer="journal",
                stream="TEMPORALITY_EVENTS",
                subject="temporality.events.x",
                stream_seq=9,
                deliveries=1,
                error="bad",
                dlq_subject="temporality.dlq.journal",
            ),
            7,
        ),
        _ev(RunStarted(run_id="run-1", agent="reviewer", role="r", title="t"), 8, run_id="run-1"),  # not audited
        _ev(TriggerDisabled(trigger_id="ado-pr", revision=2, changed_by="file:triggers.yaml"), 9),
        _lifecycle("heartbeat", 10),  # not audited: only a deregistration is
        _lifecycle("deregistered", 11),
    ]
    await journal.recorder.record_batch([(e, i + 1) for i, e in enumerate(events)])
    client = journal.client

    viewer = await client.get("/audit")
    assert viewer.status_code == 403
    assert viewer.json()["error"] == "forbidden"
    await journal.wait_type("api.access_refused")  # the refusal itself is audited (the newest entry)

    async def audit(**params: Any) -> list[tuple[str, str | None]]:
        response = await client.get("/audit", params=params, headers=OPERATOR)
        assert response.status_code == 200, response.text
        return [(e["type"], e["actor"]) for e in response.json()["entries"]]

    assert await audit() == [
        ("api.access_refused", "token:board"),
        ("agent.lifecycle_changed", "service:agent-collab"),
        ("trigger.disabled", "file:triggers.yaml"),
        ("bus.dead_lettered", None),
        ("agent.ask_undeliverable", None),
        ("human.rejected", None),
        ("run.cancel_requested", "oncall"),
        ("human.directory.changed", "root"),
        ("trigger.created", "root"),
    ]
    body = (await client.get("/audit", params={"kind": "directory_change"}, headers=ADMIN)).json()
    (entry,) = body["entries"]
    assert entry["target"] == "user:alice"
    assert entry["time"].startswith("2026-05-04T12:02")
    assert entry["details"]["after"]["inbox_token"] == REDACTED
    assert "leaked-by-a-bug" not in str(body)
    assert await audit(actor="root") == [("human.directory.changed", "root"), ("trigger.created", "root")]
    assert await audit(type="run.cancel_requested") == [("run.cancel_requested", "oncall")]
    assert await audit(kind="trigger_change", since=(T0 + timedelta(minutes=2)).isoformat()) == [
        ("trigger.disabled", "file:triggers.yaml")
    ]
    assert await audit(until=(T0 + timedelta(minutes=2)).isoformat()) == [("trigger.created", "root")]
    page = (await client.get("/audit", params={"limit": 4}, headers=OPERATOR)).json()
    assert len(page["entries"]) == 4
    rest = await audit(limit=5, before=page["next_before"])
    assert rest == [
        ("agent.ask_undeliverable", None),
        ("human.rejected", None),
        ("run.cancel_requested", "oncall"),
        ("human.directory.changed", "root"),
        ("trigger.created", "root"),
    ]
    body = (await client.get("/audit", params={"kind": "agent_registration"}, headers=OPERATOR)).json()
    (deregistered,) = body["entries"]
    assert deregistered["target"] == "ext-1"
    assert deregistered["details"]["reason"] == "deregistered"
    for params in ({"type": "run.started"}, {"kind": "gossip"}, {"before": "nope"}):
        bad = await client.get("/audit", params=params, headers=OPERATOR)
        assert bad.status_code == 422, params
        assert next(iter(params)) in bad.json()["detail"]
    assert set(AUDIT_KINDS) >= {"human.directory.changed", "trigger.created", "run.cancel_requested"}


async def test_refused_answers_agent_message_refusals_and_operator_decommissions_are_audited(
    journal: Journal,
) -> None:
    at = T0 + timedelta(minutes=1)
    events = [
        _ev(
            HumanAnswerRefused(
                request_id="h1", run_id="run-1", recipient="user:alice", responder="telegram:3003",
                channel="telegram", reason="not_recipient", received_at=at,
            ),
            1,
            run_id="run-1",
        ),
        _ev(  # a late answer by the recipient: recorded, not a permission refusal
            HumanAnswerRefused(
                request_id="h1", run_id="run-1", recipient="user:alice", responder="user:alice",
                channel="web", reason="expired", received_at=at,
            ),
            2,
            run_id="run-1",
        ),
        _ev(
            AgentMessageRefused(
                agent_id="ext-1", subject="temporality.rpc.agents.heartbeat", reason="replayed_nonce",
                detail="seen", body_sha256="0" * 64,
            ),
            3,
        ),
        _lifecycle("decommissioned", 4),
        _ev(AgentReadmitted(agent_id="ext-1", incarnation=1, requested_by="oncall"), 5),
        _ev(
            AgentHandedOff(
                handoff_id="req-" + "0" * 24, parent_run_id="run-1", parent_agent="reviewer",
                child_run_id="run-2", agent="triager", document=HandoffDocument(objective="Label the issue"),
            ),
            6,
            run_id="run-1",
        ),
    ]  # fmt: skip
    await journal.recorder.record_batch([(e, i + 1) for i, e in enumerate(events)])
    response = await journal.client.get("/audit", headers=OPERATOR)
    assert response.status_code == 200, response.text
    entries = response.json()["entries"]
    assert [(e["type"], e["kind"], e["target"]) for e in entries] == [
        ("agent.handed_off", "handoff", "run-2"),
        ("agent.readmitted", "agent_registration", "ext-1"),
        ("agent.lifecycle_changed", "agent_registration", "ext-1"),
        ("agent.message_refused", "agent_refusal", "ext-1"),
        ("human.answer_refused", "permission_refusal", "h1"),
    ]
    assert "handed its task to agent triager" in entries[0]["summary"]
    assert entries[1]["actor"] == "oncall"
    assert "replayed_nonce" in entries[3]["summary"]
    assert "telegram:3003" in entries[4]["summary"]


async def test_an_external_agent_s_refused_task_message_is_audited(journal: Journal) -> None:
    """AP-5/AP-11: a task message out of order for its dialogue (or a tool not granted) is a refusal on record."""
    refused = AgentTaskRefused(
        agent_id="ext-1", task_id="task-1", run_id="run-9", turn=2, action_id="act-1", kind="tool_calls",
        reason="tool_not_allowed", detail="ask_agent is not among ext-1's granted tools",
    )  # fmt: skip
    await journal.recorder.record_batch([(_ev(refused, 1, run_id="run-9"), 1)])
    body = (await journal.client.get("/audit", params={"kind": "agent_refusal"}, headers=OPERATOR)).json()
    (entry,) = body["entries"]
    assert (entry["type"], entry["target"]) == ("agent.task.refused", "task-1")
    assert "tool_calls of agent ext-1 for task task-1 refused: tool_not_allowed" == entry["summary"]


async def test_a_notification_to_someone_the_run_may_not_tell_is_audited_and_an_undelivered_one_is_not(
    journal: Journal,
) -> None:
    """SEC-1/HUM-9: an agent's ``notify`` to a person outside its run's allowed recipients is a permission refusal
    on record, like a refused question; a notification no channel carried is not a refusal."""
    refused, undelivered = (
        HumanNotificationFailed(
            notification_id=f"hn-{n}", run_id="run-9", recipient="user:mallory", reason=reason,
            detail="user:mallory may not be notified by run run-9 (SEC-1)", unreached=["user:mallory"],
        )
        for n, reason in ((1, "recipient_not_allowed"), (2, "no_channel"))
    )  # fmt: skip
    await journal.recorder.record_batch(
        [(_ev(refused, 1, run_id="run-9"), 1), (_ev(undelivered, 2, run_id="run-9"), 2)]
    )
    body = (await journal.client.get("/audit", params={"kind": "permission_refusal"}, headers=OPERATOR)).json()
    (entry,) = body["entries"]
    assert (entry["type"], entry["target"], entry["run_id"]) == ("human.notification_failed", "user:mallory", "run-9")
    assert entry["summary"] == "notification to user:mallory refused: recipient_not_allowed"


async def test_an_allow_list_change_is_a_policy_change_on_record(journal: Journal) -> None:
    """AP-11: agent-collab started with an allow-list that revokes a tool: ``agent.policy_changed`` is in the
    audit trail as a ``policy_change`` by the file, naming what was granted and revoked."""
    before = ExternalAgentGrant(allowed_tools=["get_input", "notify"], max_concurrent_tasks=1, heartbeat_interval_s=10)
    changed = AgentPolicyChanged(
        agent_id="ext-1", change="changed", before=before,
        after=before.model_copy(update={"allowed_tools": ["ask_agent", "get_input"]}),
        tools_granted=["ask_agent"], tools_revoked=["notify"], requested_by="file:/etc/temporality/external-agents.yaml",
    )  # fmt: skip
    unlisted = AgentPolicyChanged(
        agent_id="ext-2", change="unlisted", before=before, tools_revoked=before.allowed_tools, requested_by="file:x"
    )
    events = [_ev(changed, 1, actor="service:agent-collab"), _ev(unlisted, 2, actor="service:agent-collab")]
    await journal.recorder.record_batch([(e, i + 1) for i, e in enumerate(events)])
    body = (await journal.client.get("/audit", params={"kind": "policy_change"}, headers=OPERATOR)).json()
    assert [(e["type"], e["target"], e["actor"]) for e in body["entries"]] == [
        ("agent.policy_changed", "ext-2", "file:x"),
        ("agent.policy_changed", "ext-1", "file:/etc/temporality/external-agents.yaml"),
    ]
    assert body["entries"][0]["summary"] == "agent ext-2 no longer allowed"
    assert (
        body["entries"][1]["summary"] == "agent ext-1 policy changed: tools granted ['ask_agent'], revoked ['notify']"
    )
