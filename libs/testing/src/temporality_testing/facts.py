"""Event data the suites build again and again: one builder each, so a field added to the protocol changes one place."""

from __future__ import annotations

from temporality_protocol import HumanAnswered, OptionAnswer

__all__ = ["answered_by"]


def answered_by(
    user: str, run_id: str, request_id: str, option: str = "approve", *, waited_s: float = 1.0, channel: str = "web"
) -> HumanAnswered:
    """``user`` (a directory id: ``alice``), asked directly, chose ``option`` on ``channel`` after ``waited_s``."""
    return HumanAnswered(
        request_id=request_id,
        run_id=run_id,
        recipient=f"user:{user}",
        responder=f"user:{user}",
        answer=OptionAnswer(option_id=option),
        channel=channel,
        waited_s=waited_s,
    )
