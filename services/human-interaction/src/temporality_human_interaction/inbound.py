"""The one inbound side: every channel's answers go through :class:`AnswerRouter` (HUM-3, HUM-4).

An adapter (or the web inbox API) hands over an :class:`~.channels.InboundAnswer`: the request id,
the option id or free text, and the channel identity of who answered. The router

1. maps the identity to a person through the directory (``Directory.user_for_identity``); an
   identity nobody in the directory owns answers as ``<channel>:<identity>``, which is never a
   recipient, so the binding refuses it as ``not_recipient``;
2. binds through :func:`~.answers.bind_answer_outcome` (the channel-neutral compare-and-set, exactly
   one ``human.answered``; the identical answer again from the same person is ``already_recorded``);
3. on success, edits every sent copy of the question (on every channel it went out on) to show who
   answered and what (:meth:`AnswerRouter.show_outcome`, best effort: a failed edit is logged, never
   undoes the answer).

A refusal for an existing request (late: answered, expired, cancelled; or not the responder's to give) is
journaled as ``human.answer_refused`` by the binding (HUM-7, HUM-9), then comes back as :class:`~.channels.InboundResult` (``refused``) for the adapter to tell the
responder; bus failures propagate (the web API answers 503, a chat adapter says "try again").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import structlog

from temporality_bus import Bus
from temporality_human_interaction.answers import DEFAULT_REPAIR_AFTER_S, AnswerRefused, bind_answer_outcome
from temporality_human_interaction.channels.base import ChannelAdapter, ChannelError, InboundAnswer, InboundResult
from temporality_human_interaction.directory import Directory, recipient_for, user_id_of
from temporality_human_interaction.egress import EgressPolicy
from temporality_human_interaction.records import HumanRequestRecord, RecentRecords
from temporality_human_interaction.traces import answering

if TYPE_CHECKING:
    from temporality_human_interaction.metrics import RequestObserver
    from temporality_human_interaction.mirror import ChannelMirror

__all__ = ["AnswerRouter"]

log = structlog.get_logger(__name__)


class AnswerRouter:
    """Binds answers from any channel and shows outcomes on every channel that carried the question."""

    def __init__(
        self,
        bus: Bus,
        directory: Directory,
        adapters: Mapping[str, ChannelAdapter] | None = None,
        *,
        repair_after_s: float = DEFAULT_REPAIR_AFTER_S,
        egress: EgressPolicy | None = None,
        observer: RequestObserver | None = None,
        mirror: ChannelMirror | None = None,
        recent: RecentRecords | None = None,
    ) -> None:
        self._egress = egress
        #: ``human-channels`` as this replica's watch sees it, and the records it wrote last: what the binding
        #: may start from instead of reading (:func:`~.answers.bind_answer_outcome`).
        self._mirror = mirror
        self._recent = recent
        #: Told each request this replica's binding answered (the wait-time histogram).
        self._observer = observer
        self._bus = bus
        self._directory = directory
        self._adapters: Mapping[str, ChannelAdapter] = adapters if adapters is not None else {}
        self._repair_after_s = repair_after_s

    def responder_for(self, channel: str, identity: str) -> str:
        user_id = self._directory.user_for_identity(channel, identity)
        return recipient_for(user_id) if user_id is not None else f"{channel}:{identity}"

    async def __call__(self, answer: InboundAnswer) -> InboundResult:
        responder = self.responder_for(answer.channel, answer.identity)
        with structlog.contextvars.bound_contextvars(request_id=answer.request_id, channel=answer.channel):
            async with answering(self._bus, answer.channel, answer.request_id):  # the question's trace
                return await self._bind(answer, responder)

    async def _bind(self, answer: InboundAnswer, responder: str) -> InboundResult:
        try:
            record, already = await bind_answer_outcome(
                self._bus,
                request_id=answer.request_id,
                responder=responder,
                responder_name=self.display_name(responder),
                submission=answer.submission,
                channel=answer.channel,
                repair_after_s=self._repair_after_s,
                egress=self._egress,
                observer=self._observer,
                mirror=self._mirror,
                recent=self._recent,
            )
        except AnswerRefused as refused:
            log.info("answer.refused", code=refused.code, responder=responder, detail=refused.detail)
            return InboundResult(refused=refused, responder=responder)
        if not already:
            await self.show_outcome(record)
        return InboundResult(record=record, already_recorded=already, responder=responder)

    def display_name(self, responder: str | None) -> str | None:
        user_id = user_id_of(responder) if responder else None
        profile = self._directory.get(user_id) if user_id else None
        return profile.display_name if profile is not None else responder

    async def show_outcome(self, record: HumanRequestRecord) -> None:
        """Edit every sent copy of ``record``'s question to show how it ended (best effort, logged)."""
        for copy in record.deliveries:
            adapter = self._adapters.get(copy.channel)
            if adapter is None or not adapter.available:
                log.info("outcome.not_shown", channel=copy.channel, reason="channel not running here")
                continue
            try:
                await adapter.update(record, copy, responder_name=self.display_name(record.responder))
            except ChannelError as exc:
                log.warning("outcome.update_failed", channel=copy.channel, error=str(exc))
            else:
                log.info("outcome.shown", channel=copy.channel, status=record.status.value)
