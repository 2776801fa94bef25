"""The question a person sees and the outcome it is edited to, rendered once for every chat transport (HUM-5).

Compact and self-contained: the task (title), a link to its source (the PR's web page, when the
run's launch event had one), the context (truncated), why the agent asks (its ``reason``, OBS-1: one line
``Why: <reason>``, whitespace collapsed, only when it gave one), which agent asks and the question, the options numbered with what each leads to, the deadline and what happens if nobody
answers. Never the run's technical context beyond that. The adapters' public methods hand these functions
a record the egress policy already redacted and truncated for their channel (:mod:`..egress`). Plain text (Telegram) and HTML with a plain
fallback (Matrix ``formatted_body``).

**The whole message fits the channel** (:func:`fitted`): the egress policy caps each field, but ten options
with long consequences still add up past what a transport takes (Telegram: 4,096 characters of text; Matrix: an
event of 64 KiB). The message is cut least important part first -- the context, then the options'
consequences, then the reason, then the question, then the source link, and only as a last resort the options' labels and the
title -- each cut part ending in ``…``, with one visible line saying so (and where the whole question is: the
web inbox, when :attr:`..channels.ChannelAdapter.inbox_url` is set). The options' numbers and the way to answer
are never cut. The edited outcome is fitted the same way (the outcome line counted in).

What a chat message names (:func:`option_choice`): an option by its id or label (any case, punctuation around it
ignored: first, so a label that is a number names its option), else by its number however typed (``2)``, ``#2``, a
keycap, a full-width digit, ``option 2``), or a number the question has no option for and no label or id says
(:class:`NoSuchOption`: refused, :func:`no_such_option_text`); anything else is free text. Each
question ends with its run in short (:func:`run_ref`), as each entry of a hint does.

Refusals and confirmations for chat (:func:`refusal_text`, :func:`question_name`) say things the way the
question does: times as ``05:05 UTC``, "you" for the person who answered, what was answered, and what the run
did when nobody answered.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from temporality_human_interaction.answers import AnswerRefused, NotPending, timeout_outcome
from temporality_human_interaction.egress import was_truncated
from temporality_human_interaction.records import HumanRequestRecord
from temporality_protocol import HumanOption, HumanRequestState, OptionAnswer, SourceLink, TextAnswer

__all__ = [
    "EDIT_IGNORED",
    "MATRIX_CONTENT_LIMIT",
    "NOT_GUESSED",
    "NOT_PLACED",
    "TELEGRAM_CALLBACK_TEXT_LIMIT",
    "TELEGRAM_TEXT_LIMIT",
    "NoSuchOption",
    "clip_message",
    "cut_note",
    "deadline_outcome",
    "fitted",
    "if_nobody_answers",
    "inbox_note",
    "matrix_content_size",
    "no_such_option_text",
    "option_choice",
    "option_named",
    "option_number",
    "outcome_html",
    "outcome_text",
    "question_html",
    "question_name",
    "question_text",
    "recorded_as",
    "refusal_text",
    "run_ref",
    "telegram_size",
    "timeout_outcome",
    "utf16_len",
    "why_line",
]

#: A free-text answer quoted in an outcome line is cut to this many characters. (The question's own text is
#: redacted and truncated per channel by the egress policy before it gets here: :mod:`..egress`.)
MAX_QUOTED_ANSWER = 200
#: Telegram's Bot API: a message's text (``sendMessage``, ``editMessageText``; with an inline keyboard too) is
#: 1-4,096 characters after entity parsing; counted here in UTF-16 code units (an emoji counts 2), which is never
#: fewer than Telegram's count, so a message that fits here fits there.
TELEGRAM_TEXT_LIMIT = 4096
#: ``answerCallbackQuery``'s ``text``: 0-200 characters.
TELEGRAM_CALLBACK_TEXT_LIMIT = 200
#: A Matrix event is at most 65,536 bytes as the homeserver stores it (the content plus the envelope, signatures
#: and hashes the server adds): the content (its JSON, UTF-8) is kept under this, an edit's twice-carried text
#: included.
MATRIX_CONTENT_LIMIT = 56_000
#: A question's title as a confirmation or a hint names it.
_SHORT_TITLE = 60
#: Why an edited message is not taken as an answer (then how to answer): every chat channel.
EDIT_IGNORED = (
    "Not recorded: an edited message is never taken as an answer, and editing does not change an answer already"
    " recorded."
)
#: Why a reply to a hint listing several questions is not bound to one of them.
NOT_GUESSED = "Not recorded: that message lists several questions; which one you mean is not guessed."
#: Why a reply to a message of the bot's that is about no question it knows is not bound.
NOT_PLACED = "Not recorded: the message you replied to is not a question I can place."


def utf16_len(text: str) -> int:
    """``text``'s length in UTF-16 code units (what Telegram's limits count, at most)."""
    return len(text.encode("utf-16-le")) // 2


def telegram_size(text: str) -> int:
    return utf16_len(text)


def matrix_content_size(content: dict[str, Any]) -> int:
    """The bytes ``content`` takes in a Matrix event (canonical JSON is UTF-8, no spaces)."""
    return len(json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode())


def clip_message(text: str, limit: int = TELEGRAM_TEXT_LIMIT, size: Callable[[str], int] = utf16_len) -> str:
    """``text`` cut to fit ``limit`` (by ``size``), ending in ``…`` when cut (a chat reply, a callback answer)."""
    if size(text) <= limit:
        return text
    lo, hi = 0, len(text)
    while lo < hi:  # the longest prefix that fits with the marker
        mid = (lo + hi + 1) // 2
        if size(text[:mid].rstrip() + "…") <= limit:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo].rstrip() + "…"


def option_number(text: str) -> int | None:
    """``text`` as an option's number (ASCII digits, a few of them), else None: ``"²".isdigit()`` and a 5,000-digit
    string are digits too, but ``int()`` raises on both."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 6 else None


#: The full-width ASCII forms (U+FF01-U+FF5E: a full-width one, number sign, letters) as ASCII: CJK keyboards type them.
_FULLWIDTH = {c: c - 0xFEE0 for c in range(0xFF01, 0xFF5F)}
#: A keycap emoji (``1️⃣``: the digit, an optional VS16, the combining keycap) is its digit.
_KEYCAP = re.compile("([0-9#])\ufe0f?\u20e3")
#: An option's number as a person types it: ``2``, ``2.``, ``2)``, ``(2)``, ``#2``, ``option 2``, ``choice #2``.
_NUMBERED = re.compile(r"(?:(?:option|opt|choice|number)\s*)?#?\s*\(?\s*([0-9]{1,6})\s*\)?\s*[.):!]*")
#: What a typed label may be wrapped in or end with and still name the option (``keep the v1 contract!``).
_AROUND = " \t\n.,;:!?…()[]\"'“”\u2018\u2019«»"


@dataclass(frozen=True)
class NoSuchOption:
    """A message that is an option's number the question does not have (``3`` on a two-option question)."""

    number: int
    options: int


def _normalized(text: str) -> str:
    text = text.translate(_FULLWIDTH).replace("🔟", "10")
    text = _KEYCAP.sub(r"\1", text).replace("\ufe0f", "")
    return " ".join(text.split()).casefold()


def option_choice(record: HumanRequestRecord, text: str) -> HumanOption | NoSuchOption | None:
    """What a chat message says about the question's options: the option it names -- its id or its label (any case,
    whitespace and punctuation around it ignored), else its number however typed (``2``, ``2.``, ``2)``, ``#2``,
    ``2️⃣``, a full-width 2, ``option 2``) --, :class:`NoSuchOption` for a number that is no option's label or id and
    no option's number (when the question has options and asks for no form), else None (free text).

    A label or id wins over a number: with options labelled ``3`` and ``5`` (replicas), ``5`` is the option labelled
    5, not a refusal; and with option 1 labelled ``2`` and option 2 labelled ``1``, ``1`` is the option labelled 1
    (option 2). A number that is no option's label or id is read as a position."""
    said = _normalized(text)
    bare = said.strip(_AROUND)
    if not bare:
        return None
    # an option's id or label, exactly: first, so options labelled with numbers ("3", "5" replicas) are named by them
    named = next((o for o in record.options if bare in (o.id.casefold(), _normalized(o.label).strip(_AROUND))), None)
    if named is not None:
        return named
    numbered = _NUMBERED.fullmatch(said)
    if numbered is None:
        return None
    number = int(numbered.group(1))
    if 1 <= number <= len(record.options):
        return record.options[number - 1]
    # a form's answer may be a bare number (a one-field form): read as the form's, not refused here
    return NoSuchOption(number, len(record.options)) if record.options and record.answer_schema is None else None


def option_named(record: HumanRequestRecord, text: str) -> HumanOption | None:
    """The option a chat message names (:func:`option_choice`); else None."""
    chosen = option_choice(record, text)
    return chosen if isinstance(chosen, HumanOption) else None


def no_such_option_text(record: HumanRequestRecord, missing: NoSuchOption) -> str:
    """Why a number that is no option of the question was not recorded, and what to write instead."""
    which = "its only option is 1" if missing.options == 1 else f"its options are 1\u2013{missing.options}"
    numeric = [o.label for o in record.options if option_number(_normalized(o.label).strip(_AROUND)) is not None]
    if numeric:  # labels that are numbers name their options too (option_choice): say which
        which += " (or by label: " + ", ".join(f"“{label}”" for label in numeric) + ")"
    own = " To answer in your own words, write more than a number." if record.allow_free_text else ""
    return f"Not recorded: there is no option {missing.number} for {question_name(record)}; {which}.{own}"


#: A free-text answer quoted in a confirmation is cut to this many characters.
_QUOTED_IN_CONFIRMATION = 120


def recorded_as(record: HumanRequestRecord, option: HumanOption | None, text: str) -> str:
    """How a chat answer was taken, for its confirmation: ``as option 2 “Drop v1”`` or ``in your own words:
    “…”`` (``text``: what was recorded, quoted, shortened when long)."""
    if option is not None:
        number = next((n for n, o in enumerate(record.options, start=1) if o.id == option.id), None)
        return f"as option {number} “{option.label}”" if number else f"as “{option.label}”"
    quoted = f"“{_clip(' '.join(text.split()), _QUOTED_IN_CONFIRMATION)}”"
    if record.answer_schema is not None:
        return f"as your form answer: {quoted}"
    return f"in your own words: {quoted}"


def _clip(text: str, limit: int = MAX_QUOTED_ANSWER) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _deadline(record: HumanRequestRecord) -> str:
    return record.expires_at.strftime("%Y-%m-%d %H:%M UTC")


def deadline_outcome(record: HumanRequestRecord) -> str:
    """What happens at ``record``'s deadline when nobody answered, as the question says it (``I go with “Keep
    v1”``, ``the task is cancelled``, ``the task stops without your answer``): from its policy's ``on_timeout``."""
    on_timeout = record.policy.on_timeout
    if on_timeout.action == "default" and on_timeout.default_option is not None:
        option = record.option(on_timeout.default_option)
        return f"I go with “{option.label if option else on_timeout.default_option}”"
    if on_timeout.action == "cancel":
        return "the task is cancelled"
    return "the task stops without your answer"


def if_nobody_answers(record: HumanRequestRecord) -> str:
    """``No answer by <deadline> → <what happens>.`` (:func:`deadline_outcome`): the chats' line, and the web
    inbox's ``at_deadline.text``."""
    return f"No answer by {_deadline(record)} → {deadline_outcome(record)}."


#: Said after the way to answer: a message that replies to nothing is bound to the chat's one open question.
PLAIN_MESSAGE_NOTE = "while it is your only open question here, a plain message works too"


def _how_to_answer(record: HumanRequestRecord, channel_hint: str) -> str:
    """``tap an option below, or reply to this message with your own answer (while it is ...)``: the channel's way
    to pick an option (``channel_hint``), the reply for free text, and that a plain message works too."""
    if record.options and record.allow_free_text:
        if "reply to this message" in channel_hint:  # Matrix: "..., or reply to this message with the number"
            how = f"{channel_hint} or your own answer"
        else:
            how = f"{channel_hint}, or reply to this message with your own answer"
    elif record.options:
        how = channel_hint
    elif record.allow_free_text:
        how = "reply to this message with your own answer"
    else:
        return ""
    return f"{how} ({PLAIN_MESSAGE_NOTE})"


def run_ref(record: HumanRequestRecord) -> str:
    """The run's id in short (``run 1a2b3c4d``): two runs asking about the same thing read differently."""
    _, _, rest = record.run_id.rpartition("-")  # ``run-<24 hex>``: its first 8 hex digits
    return f"run {(rest or record.run_id)[:8]}"


def why_line(record: HumanRequestRecord) -> str | None:
    """``Why: <reason>``: the agent's short phrase for why it asks (OBS-1), on one line (its whitespace, line breaks
    included, collapsed); None when it gave none (or :func:`fitted` cut it away)."""
    reason = " ".join((record.reason or "").split())
    return f"Why: {reason}" if reason else None


def _asker(record: HumanRequestRecord) -> str:
    """Who asks: the agent, by its card's display name with its id when the card has one, else by its id."""
    if record.agent_display_name and record.agent_display_name != record.agent:
        return f"🤖 {record.agent_display_name} (agent {record.agent}) asks:"
    return f"🤖 {record.agent} (agent) asks:"


def question_text(
    record: HumanRequestRecord, *, hint: str = "tap an option", banner: str | None = None, note: str | None = None
) -> str:
    """The question as plain text; ``banner`` (a reminder, an escalation) is its first line when given; ``note``
    (what :func:`fitted` cut) a line after the options."""
    lines = [banner, ""] if banner else []
    lines += [f"❓ {record.title}", ""]
    if record.source_link is not None:
        lines += [f"🔗 {record.source_link.label or 'Source'}: {record.source_link.href}", ""]
    if record.context.strip():
        lines += [record.context.strip(), ""]
    why = why_line(record)
    if why:
        lines += [why, ""]
    lines += [_asker(record), record.question]
    for number, option in enumerate(record.options, start=1):
        consequence = f" — {option.consequence}" if option.consequence else ""
        lines.append(f"{number}. {option.label}{consequence}")
    if note:
        lines += ["", note]
    lines += ["", if_nobody_answers(record)]
    how = _how_to_answer(record, hint)
    if how:
        lines.append(f"To answer: {how}.")
    lines.append(f"({run_ref(record)})")
    return "\n".join(lines)


def question_html(
    record: HumanRequestRecord,
    *,
    hint: str = "react with an option's number",
    banner: str | None = None,
    note: str | None = None,
) -> str:
    esc = html.escape
    out = [f"<p><i>{esc(banner)}</i></p>"] if banner else []
    out.append(f"<p><b>❓ {esc(record.title)}</b></p>")
    if record.source_link is not None:
        link = record.source_link
        out.append(f'<p>🔗 <a href="{esc(link.href, quote=True)}">{esc(link.label or link.href)}</a></p>')
    if record.context.strip():
        out.append(f"<p>{esc(record.context.strip())}</p>")
    why = why_line(record)
    if why:
        out.append(f"<p><b>Why:</b> {esc(why.removeprefix('Why: '))}</p>")
    out.append(f"<p>{esc(_asker(record))} {esc(record.question)}</p>")
    if record.options:
        items = "".join(
            f"<li><b>{esc(o.label)}</b>{' — ' + esc(o.consequence) if o.consequence else ''}</li>"
            for o in record.options
        )
        out.append(f"<ol>{items}</ol>")
    if note:
        out.append(f"<p><i>{esc(note)}</i></p>")
    out.append(f"<p><i>{esc(if_nobody_answers(record))}</i></p>")
    how = _how_to_answer(record, hint)
    if how:
        out.append(f"<p>To answer: {esc(how)}.</p>")
    out.append(f"<p><i>({esc(run_ref(record))})</i></p>")
    return "".join(out)


def _when(at: datetime, now: datetime | None = None) -> str:
    """A time as the question shows it: ``05:05 UTC`` today, else ``2026-12-07 05:05 UTC``."""
    at = at.astimezone(UTC)
    today = (now or datetime.now(UTC)).astimezone(UTC).date()
    return at.strftime("%H:%M UTC") if at.date() == today else at.strftime("%Y-%m-%d %H:%M UTC")


def question_name(record: HumanRequestRecord, *, with_run: bool = False) -> str:
    """The question in a confirmation or a hint: its title, short, quoted; ``with_run``: and its run in short (a
    hint's list: two runs may ask about the same PR)."""
    name = f"“{_clip(record.title, _SHORT_TITLE)}”"
    return f"{name} ({run_ref(record)})" if with_run else name


def refusal_text(refused: AnswerRefused, responder: str | None = None) -> str:
    """Why an answer was not recorded, for the person in a chat (``Not recorded: ...``): the request's state said
    the way the question says it (times as ``05:10 UTC``, "you" when ``responder`` (``user:<id>``) answered it
    themselves, what was answered, what the run did on a timeout). The API keeps the refusal's own ``detail``."""
    record = refused.record if isinstance(refused, NotPending) else None
    if record is None:
        return f"Not recorded: {refused.detail}."
    if record.status is HumanRequestState.ANSWERED:
        when = f", at {_when(record.answered_at)}" if record.answered_at else ""
        if responder is not None and record.responder == responder:
            return f"Not recorded: you already answered {question_name(record)}: {_answer_words(record)}{when}."
        who = record.responder_name or record.responder or "someone"
        return f"Not recorded: {question_name(record)} was already answered by {who}: {_answer_words(record)}{when}."
    if record.status is HumanRequestState.EXPIRED:
        return f"Not recorded: expired at {_when(record.expires_at)} without an answer — {timeout_outcome(record)}."
    if record.status is HumanRequestState.CANCELLED:
        return f"Not recorded: the request is cancelled, {question_name(record)} no longer needs an answer."
    return f"Not recorded: {refused.detail}."


def inbox_note(inbox_url: str | None) -> str | None:
    """The line a question the egress policy truncated a field of carries: where the whole question is."""
    return f"Full question in the inbox: {inbox_url}" if inbox_url else None


def cut_note(inbox_url: str | None) -> str:
    """The line a cut question carries."""
    if inbox_url:
        return f"…(cut; full question in the inbox: {inbox_url})"
    return "…(cut to fit this chat's message limit)"


def _cut(text: str, keep: int) -> str:
    return text if len(text) <= keep else (text[:keep].rstrip() + "…" if keep > 0 else "")


def _with_consequences(record: HumanRequestRecord, keep: int) -> HumanRequestRecord:
    options = [
        o.model_copy(update={"consequence": (_cut(o.consequence, keep) or None) if o.consequence else None})
        for o in record.options
    ]
    return record.model_copy(update={"options": options})


def _with_labels(record: HumanRequestRecord, keep: int) -> HumanRequestRecord:
    options = [o.model_copy(update={"label": _cut(o.label, keep)}) for o in record.options]
    return record.model_copy(update={"options": options})


def _without_link(record: HumanRequestRecord, keep: int) -> HumanRequestRecord:
    link: SourceLink | None = record.source_link if keep else None
    return record.model_copy(update={"source_link": link})


#: What :func:`fitted` cuts, least important first: ``(cut, the smallest it keeps, the most there is)``.
_STAGES: tuple[
    tuple[
        Callable[[HumanRequestRecord, int], HumanRequestRecord],
        int,
        Callable[[HumanRequestRecord], int],
    ],
    ...,
] = (
    (lambda r, n: r.model_copy(update={"context": _cut(r.context, n)}), 0, lambda r: len(r.context)),
    (_with_consequences, 0, lambda r: max((len(o.consequence or "") for o in r.options), default=0)),
    (lambda r, n: r.model_copy(update={"reason": _cut(r.reason or "", n) or None}), 0, lambda r: len(r.reason or "")),
    (lambda r, n: r.model_copy(update={"question": _cut(r.question, n)}), 40, lambda r: len(r.question)),
    (_without_link, 0, lambda r: 1 if r.source_link is not None else 0),
    (_with_labels, 12, lambda r: max((len(o.label) for o in r.options), default=0)),
    (lambda r, n: r.model_copy(update={"title": _cut(r.title, n)}), 20, lambda r: len(r.title)),
)

T = TypeVar("T")


def fitted(
    record: HumanRequestRecord,
    render: Callable[[HumanRequestRecord, str | None], T],
    size: Callable[[T], int],
    limit: int,
    *,
    inbox_url: str | None = None,
) -> T:
    """``render(record, note)`` cut to fit ``limit`` (measured by ``size``), least important part first.

    ``render`` builds the whole message (the question, a banner, an outcome line: all of it counts) from the record
    and a note line (None: nothing was cut). Each stage of :data:`_STAGES` cuts one part (the context, the
    consequences, the reason, the question, the source link, the labels, the title) only as far as needed: the longest that
    fits is found by bisection; a stage that cannot make it fit cuts its part to its smallest and the next one goes
    on. The options (their numbers) and the way to answer stay. Should even that not fit (hundreds of options), the
    smallest is returned: the transport refuses it and the delivery goes to the person's next channel."""
    # a field the egress policy truncated (its marker in it) points to the whole question as well
    first = inbox_note(inbox_url) if was_truncated(record) else None
    whole = render(record, first)
    if size(whole) <= limit:
        return whole
    note = cut_note(inbox_url)
    current = record
    for cut, smallest, largest in _STAGES:
        top = largest(current)
        if top <= smallest:
            continue
        floor = cut(current, smallest)
        if size(render(floor, note)) > limit:
            current = floor
            continue
        lo, hi = smallest, top
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if size(render(cut(current, mid), note)) <= limit:
                lo = mid
            else:
                hi = mid - 1
        return render(cut(current, lo), note)
    return render(current, note)


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
        return f"⌛ Expired at {_when(record.expires_at)} without an answer — {timeout_outcome(record)}."
    if record.status is HumanRequestState.CANCELLED:
        return "🚫 Cancelled: the task no longer needs an answer."
    return "⏳ Waiting for an answer."


def outcome_html(record: HumanRequestRecord, *, responder_name: str | None = None) -> str:
    return f"<p><b>{html.escape(record.title)}</b></p><p>{html.escape(outcome_text(record, responder_name=responder_name))}</p>"
