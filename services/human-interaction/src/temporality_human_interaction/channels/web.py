"""The web inbox adapter: delivery means the request is visible in the person's inbox.

``GET /inbox`` lists the recipient's pending stored records, so there is nothing to send: delivering
checks the person can sign in to the inbox at all (has an inbox token) and records that the web channel
carried it. When the web inbox is the first channel with an adapter in the person's order, the intake
makes this delivery before the record is stored and stores it with the record, in its create
(:attr:`delivered_by_store`): the question is in the inbox from that create on, so it is delivered and
announced (``human.notified``) even when the request is cancelled right after. Otherwise (a fallback after
a channel that sends, a reminder, a group member) it is delivered once the record is stored. Its
inbound side is the API's ``POST /requests/{id}/answer``, which hands the answer to the same
:class:`~temporality_human_interaction.inbound.AnswerRouter` as every chat adapter. Updating a
sent copy needs nothing (``GET /requests/{id}`` shows the outcome); the inbox carries no
notifications, so :meth:`notify` fails and routing moves on to the next channel.
"""

from __future__ import annotations

from typing import ClassVar

from temporality_human_interaction.channels.base import ChannelAdapter, DeliveryFailed, DeliveryReceipt
from temporality_human_interaction.directory import UserProfile
from temporality_human_interaction.records import HumanRequestRecord, SentCopy

__all__ = ["WebInboxAdapter"]


class WebInboxAdapter(ChannelAdapter):
    name: ClassVar[str] = "web"
    #: The inbox lists the stored pending records: the intake records this delivery in the record it creates.
    delivered_by_store: ClassVar[bool] = True

    def __init__(self) -> None:
        self._open = False

    async def initialize(self) -> None:
        self._open = True

    async def shutdown(self) -> None:
        self._open = False

    @property
    def available(self) -> bool:
        return self._open

    def delivers_with_record(self, profile: UserProfile) -> bool:
        return super().delivers_with_record(profile) and profile.has_inbox_token

    async def do_deliver(
        self, request: HumanRequestRecord, profile: UserProfile, *, banner: str | None = None, tag: str = ""
    ) -> DeliveryReceipt:
        # A reminder or an escalation changes nothing here: the inbox lists every pending request it may answer.
        if not profile.has_inbox_token:
            raise DeliveryFailed(f"{request.recipient} has no inbox token and could never open the inbox")
        return DeliveryReceipt(channel=self.name, reference=request.request_id)

    async def do_update(self, request: HumanRequestRecord, copy: SentCopy, responder_name: str | None) -> None:
        return None  # the inbox reads the record: its outcome is already what GET /requests/{id} shows

    async def do_notify(self, profile: UserProfile, text: str, key: str) -> DeliveryReceipt:
        raise DeliveryFailed("the web inbox carries questions only, no notifications")
