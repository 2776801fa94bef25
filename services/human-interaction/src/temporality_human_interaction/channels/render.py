"""The question a person sees and the outcome it is edited to, rendered once for every chat transport (HUM-5).

Compact and self-contained: the task (title), a link to its source (the PR's web page, when the
run's launch event had one), why the agent asks (the context, truncated), the
question, the options numbered with what each leads to, the deadline and what happens if nobody
answers. Never the run's technical context beyond that. The adapters' public methods hand these functions
a record the egress policy already redacted and truncated for their channel (:mod:`..egress`). Plain text (Telegram) and HTML with a plain
fallback (Matrix ``formatted_body``).
"""

from __future__ import annotations

import html

from temporality_human_interaction.records import HumanRequestRecord
from temporality_protocol import HumanOption, HumanRequestState, OptionAnswer, TextAnswer

__all__ = [
    "if_nobody_answers",
    "option_named",
    "option_number",
    "outcome_html",
    "outcome_text",
    "question_html",
    "question_text",
]

#: A free-text answer quoted in an outcome line is cut to this many characters. (The question's own text is
#: redacted and truncated per channel by the egress policy before it gets here: :mod:`..egress`.)
MAX_QUOTED_ANSWER = 200


def option_number(text: str) -> int | None:
    """``text`` as an option's number (ASCII digits, a few of them), else None: ``"²".isdigit()`` and a 5,000-digit
    string are digits too, but ``int()`` raises on both."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 6 else None


def option_named(record: HumanRequestRecord, text: str) -> HumanOption | None:
    """The option a chat message names: its number (``2``, ``2.``), its id or its label (any case); else None."""
    said = text.strip().rstrip(".").strip().casefold()
    number = option_number(said)
    if number is not None and 1 <= number <= len(record.options):
        return record.options[number - 1]
    return next((o for o in record.options if said in (o.id.casefold(), o.label.casefold())), None)


def _clip(text: str, limit: int = MAX_QUOTED_ANSWER) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _deadline(record: HumanRequestRecord) -> str:
    return record.expires_at.strftime("%Y-%m-%d %H:%M UTC")


def if_nobody_answers(record: HumanRequestRecord) -> str:
    """``no answer by <deadline> -> <what happens>``."""
    on_timeout = record.policy.on_timeout
    if on_timeout.action == "default" and on_timeout.default_option is not None:
        option = record.option(on_timeout.default_option)
        outcome = f"I go with “{option.label if option else on_timeout.default_option}”"
    elif on_timeout.action == "cancel":
        outcome = "the task is cancelled"
    else:
        outcome = "the task stops without your answer"
    return f"No answer by {_deadline(record)} → {outcome}."


def _how_to_answer(record: HumanRequestRecord, channel_hint: str) -> str:
    parts = []
    if record.options:
        parts.append(channel_hint)
    if record.allow_free_text:
        parts.append("reply to this message with your own answer")
    return "; ".join(parts)


def question_text(record: HumanRequestRecord, *, hint: str = "tap an option", banner: str | None = None) -> str:
    """The question as plain text; ``banner`` (a reminder, an escalation) is its first line when given."""
    lines = [banner, ""] if banner else []
    lines += [f"❓ {record.title}", ""]
    if record.source_link is not None:
        lines += [f"🔗 {record.source_link.label or 'Source'}: {record.source_link.href}", ""]
    if record.context.strip():
        lines += [record.context.strip(), ""]
    lines.append(record.question)
    for number, option in enumerate(record.options, start=1):
        consequence = f" — {option.consequence}" if option.consequence else ""
        lines.append(f"{number}. {option.label}{consequence}")
    lines += ["", if_nobody_answers(record)]
    how = _how_to_answer(record, hint)
    if how:
        lines.append(f"To answer: {how}.")
    return "\n".join(lines)


def question_html(
    record: HumanRequestRecord, *, hint: str = "react with an option's number", banner: str | None = None
) -> str:
    esc = html.escape
    out = [f"<p><i>{esc(banner)}</i></p>"] if banner else []
    out.append(f"<p><b>❓ {esc(record.title)}</b></p>")
    if record.source_link is not None:
        link = record.source_link
        out.append(f'<p>🔗 <a href="{esc(link.href, quote=True)}">{esc(link.label or link.href)}</a></p>')
    if record.context.strip():
        out.append(f"<p>{esc(record.context.strip())}</p>")
    out.append(f"<p>{esc(record.question)}</p>")
    if record.options:
        items = "".join(
            f"<li><b>{esc(o.label)}</b>{' — ' + esc(o.consequence) if o.consequence else ''}</li>"
            for o in record.options
        )
        out.append(f"<ol>{items}</ol>")
    out.append(f"<p><i>{esc(if_nobody_answers(record))}</i></p>")
    how = _how_to_answer(record, hint)
    if how:
        out.append(f"<p>To answer: {esc(how)}.</p>")
    return "".join(out)


def _answer_words(record: HumanRequestRecord) -> str:
    answer = record.answer
    if isinstance(answer, OptionAnswer):
        return f"“{answer.label or answer.option_id}”"
    if isinstance(answer, TextAnswer):
        return f"“{_clip(answer.value)}”"
    return "an answer"


def outcome_text(record: HumanRequestRecord, *, responder_name: str | None = None) -> str:
    """One line saying how the request ended, for the edited message."""
    if record.status is HumanRequestState.ANSWERED:
        who = responder_name or record.responder or "someone"
        when = record.answered_at.strftime("%H:%M UTC") if record.answered_at else ""
        return f"✅ Answered by {who}: {_answer_words(record)} {when}".rstrip()
    if record.status is HumanRequestState.EXPIRED:
        return f"⌛ Expired at {_deadline(record)} without an answer."
    if record.status is HumanRequestState.CANCELLED:
        return "🚫 Cancelled: the task no longer needs an answer."
    return "⏳ Waiting for an answer."


def outcome_html(record: HumanRequestRecord, *, responder_name: str | None = None) -> str:
    return f"<p><b>{html.escape(record.title)}</b></p><p>{html.escape(outcome_text(record, responder_name=responder_name))}</p>"
