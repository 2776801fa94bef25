"""Typed results of the tool calls a run parks on: what the model gets back when the wait ends.

A parked call (``ask_human``) has no result when its turn ends; the outcome that ends the wait (an
answer, an expiry, a rejection) becomes its tool message, applied at the next turn boundary. Each
outcome is one model here, serialized by :func:`tool_content` to the JSON the model (and the scripted
provider) reads::

    {"request_id": ..., "status": "answered", "responder": ..., "channel": ..., "answer": {...}}
    {"request_id": ..., "status": "expired", "note": ..., "answer": {...} | null}
    {"request_id": ..., "status": "rejected", "error": "<reason>: <detail>"}
    {"request_id": ..., "status": "not_needed", "note": ..., "answered": "<request id answered first>"}

The last is HUM-7's: a turn that asked several questions with ``wait_for: "first"`` resumes on the first
answer, and each question still open then gets ``not_needed``.

Keys sorted, exactly as the executor wrote them before these models existed, so a checkpoint saved by
an older executor reads the same. ``ask_agent`` in ``wait`` mode ends the same way, with one of
:data:`AgentResult`::

    {"request_id": ..., "status": "answered", "outcome": "answer" | "refusal", "replier": ..., "answer": ...}
    {"request_id": ..., "status": "timed_out", "note": ...}
    {"request_id": ..., "status": "undeliverable", "reason": ..., "error": ...}
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from temporality_protocol import HumanAnswer, HumanAnswered, HumanExpired, HumanRejected, OptionAnswer

__all__ = [
    "AGENT_TIMED_OUT_NOTE",
    "EXPIRED_NOTE",
    "NOT_NEEDED_NOTE",
    "AgentAnsweredResult",
    "AgentResult",
    "AgentTimedOutResult",
    "AgentUndeliverableResult",
    "HumanAnsweredResult",
    "HumanExpiredResult",
    "HumanNotNeededResult",
    "HumanRejectedResult",
    "HumanResult",
    "human_result",
    "parse_result",
    "tool_content",
]

#: What an expired request tells the model besides the default answer (if the policy has one).
EXPIRED_NOTE = "nobody answered in time; the timeout policy's default applies"


class _Result(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    request_id: str


class HumanAnsweredResult(_Result):
    status: Literal["answered"] = "answered"
    responder: str
    channel: str
    answer: HumanAnswer


class HumanExpiredResult(_Result):
    status: Literal["expired"] = "expired"
    note: str = EXPIRED_NOTE
    #: The timeout policy's default option; ``None`` when it has none (the model decides).
    answer: OptionAnswer | None = None


class HumanRejectedResult(_Result):
    status: Literal["rejected"] = "rejected"
    #: ``"<reason>: <detail>"`` of the ``human.rejected``.
    error: str


#: What a question of a ``wait_for: "first"`` turn that was still open when another was answered tells the model.
NOT_NEEDED_NOTE = (
    "not needed: another question of this turn was answered first (wait_for=first); "
    "an answer to this one is not applied"
)


class HumanNotNeededResult(_Result):
    status: Literal["not_needed"] = "not_needed"
    note: str = NOT_NEEDED_NOTE
    #: The request whose answer resumed the run.
    answered: str


_AnyHuman = HumanAnsweredResult | HumanExpiredResult | HumanRejectedResult | HumanNotNeededResult
HumanResult = Annotated[_AnyHuman, Field(discriminator="status")]
_RESULT: TypeAdapter[_AnyHuman] = TypeAdapter(HumanResult)


def human_result(data: HumanAnswered | HumanExpired | HumanRejected) -> HumanResult:
    """The tool result a ``human.*`` outcome gives the ``ask_human`` call it answers."""
    if isinstance(data, HumanAnswered):
        return HumanAnsweredResult(
            request_id=data.request_id, responder=data.responder, channel=data.channel, answer=data.answer
        )
    if isinstance(data, HumanExpired):
        return HumanExpiredResult(request_id=data.request_id, answer=data.default_answer)
    return HumanRejectedResult(request_id=data.request_id, error=f"{data.reason}: {data.detail}")


#: What a wait that timed out tells the model (COL-2: the request stays open).
AGENT_TIMED_OUT_NOTE = "no answer yet; it may still arrive later as a message"


class AgentAnsweredResult(_Result):
    status: Literal["answered"] = "answered"
    #: ``refusal``: the other agent declined, ``answer`` says why (PRO-1).
    outcome: Literal["answer", "refusal"]
    replier: str
    replier_run_id: str
    answer: str
    truncated: bool = False


class AgentTimedOutResult(_Result):
    status: Literal["timed_out"] = "timed_out"
    note: str = AGENT_TIMED_OUT_NOTE
    timeout_s: int


class AgentUndeliverableResult(_Result):
    status: Literal["undeliverable"] = "undeliverable"
    reason: str
    error: str


AgentResult = AgentAnsweredResult | AgentTimedOutResult | AgentUndeliverableResult


def tool_content(result: HumanResult | AgentResult) -> str:
    """The tool message content of ``result``: its JSON, keys sorted."""
    return json.dumps(result.model_dump(mode="json"), sort_keys=True)


def parse_result(content: str) -> HumanResult:
    """A tool message content written by :func:`tool_content` (by this executor or an older one)."""
    return _RESULT.validate_json(content)
