"""The notify tool redacts like ask_human: a secret the agent writes never reaches the bus (SEC-1)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from executor_support import REVIEWER

from temporality_protocol import EventData, HumanNotifyRequested, HumanPolicy, LaunchSource, RunState
from temporality_run_executor.records import RunRecord
from temporality_run_executor.tools import BUILTIN_TOOLS, ToolContext, ToolRegistry


async def test_a_secret_in_a_notification_is_redacted_before_it_is_published() -> None:
    now = datetime.now(UTC)
    run = RunRecord(
        run_id="run-notify-1",
        state=RunState.RUNNING,
        agent=REVIEWER.id,
        title="Rotate password=hunter2hunter2 for orders",
        launch=LaunchSource(kind="webhook", trigger_id="ado-pr-review", delivery_id="dlv-1"),
        correlation_id="run-notify-1",
        created_at=now,
        updated_at=now,
        human=HumanPolicy(allowed_recipients=["user:alice"]),
    )
    published: list[EventData] = []

    async def publish(data: EventData, id_parts: tuple[str, ...]) -> None:
        published.append(data)

    notify = ToolRegistry(BUILTIN_TOOLS).get("notify")
    assert notify is not None
    ctx = ToolContext(run=run, turn=1, index=0, call_id="call-1", publish=publish)
    message = "Done. The new DB_PASSWORD=s3cr3t-value-123 is in the vault; token=abcdefabcdef0123"
    result = json.loads(await notify.invoke({"recipient": "user:alice", "message": message}, ctx))
    assert result["status"] == "queued"
    (sent,) = published
    assert isinstance(sent, HumanNotifyRequested)
    for secret in ("hunter2hunter2", "s3cr3t-value-123", "abcdefabcdef0123"):
        assert secret not in sent.model_dump_json()
    assert "[REDACTED:" in sent.message
    assert sent.message.startswith("Done. The new DB_PASSWORD=")  # the readable part stays
