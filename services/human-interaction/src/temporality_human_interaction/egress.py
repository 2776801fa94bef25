"""The egress policy: what may leave the system on a channel (HUM-5, SEC-1).

Everything a person is shown — the question, its context, why the agent asks (its ``reason``), the title,
the options' labels and consequences, the texts of a form (``answer_schema``: titles, descriptions, defaults, examples, enum
labels), a notification's text, a free-text answer quoted in an outcome — passes through
:class:`EgressPolicy` before a channel carries it:

* **secrets are redacted** at intake (the stored request never holds them, so every channel, the web
  inbox API and every later reminder show the redacted text), and in a person's answer when it is bound
  (:meth:`EgressPolicy.redact_answer`: the record and ``human.answered`` never hold them, so neither do the
  journal nor the agent): each match of a :class:`SecretPattern`
  becomes ``[REDACTED:<kind>]``; for ``key=value`` and URL credentials only the secret part is
  replaced, so the text stays readable (``postgres://app:[REDACTED:url_credentials]@db:5432/x``);
* **long text is truncated** per channel when it is rendered: each text field keeps at most the
  channel's limit of characters and ends with a visible marker
  ``… (truncated, 1,234 more characters)``; the source link (HUM-5) is never cut: one longer than the
  channel's limit is left out (``truncated`` names ``source_link``), and one holding a secret
  (``?token=…``) is dropped at intake.

The patterns live in :mod:`temporality_protocol.redaction`: the run-executor applies the same ones to
each ``human.requested`` before it publishes it, so the bus and the journal never hold a secret either;
what it redacted (its ``[REDACTED:<kind>]`` markers) is counted here with the rest.

The built-in patterns (:data:`BUILTIN_PATTERNS`, one test each) are always on; a deployment adds its
own (``TEMPORALITY_HUMAN_EGRESS_REDACT_PATTERNS``, ``{"<kind>": "<regex>"}``: the whole match is
replaced, or only the group named ``secret`` when the regex has one). The counts per kind — never a
secret — are stored in the request (``redactions``) and journaled in ``human.notified.redacted``.

Pure functions; the policy is built once at start (:meth:`EgressPolicy.from_settings`, a bad regex is
a configuration error naming its key).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from temporality_bus import evolve
from temporality_human_interaction.records import HumanRequestRecord
from temporality_protocol import HumanAnswer, HumanOption, SourceLink, TextAnswer, forms
from temporality_protocol.events import MAX_REASON, MAX_TEXT
from temporality_protocol.redaction import (
    BUILTIN_PATTERNS,
    MARKER,
    SECRET_FIELD_MARKER,
    PatternError,
    Redacted,
    Redactor,
    SecretPattern,
    compile_extra_patterns,
    is_secret_field,
    redact_form,
)

__all__ = [
    "BUILTIN_PATTERNS",
    "DEFAULT_LIMIT",
    "DEFAULT_LIMITS",
    "DEFAULT_POLICY",
    "EgressPolicy",
    "PatternError",
    "Redacted",
    "SecretPattern",
    "SecretUnfit",
    "compile_extra_patterns",
    "truncate",
    "truncate_middle",
    "was_truncated",
]

#: Characters kept per text field when no limit is configured for a channel.
DEFAULT_LIMIT = 1000
#: Per channel, the characters each text field keeps: a field, not the whole message. Telegram refuses a message over
#: 4,096 characters and a Matrix event over 64 KiB; the whole rendered message is cut to those by
#: :func:`.channels.render.fitted`, these keep one long field from crowding out the rest. Matrix renders long
#: events fine but people do not read them; the web inbox has room.
DEFAULT_LIMITS: Mapping[str, int] = {"telegram": 800, "matrix": 2000, "web": 4000}
#: A label or a title is never longer than this, whatever the channel allows (the protocol's cap).
_SHORT_FIELD = 200


def truncate(text: str, limit: int) -> tuple[str, bool]:
    """``text`` cut to ``limit`` characters plus a visible marker saying how much was left out."""
    if len(text) <= limit:
        return text, False
    kept = text[:limit].rstrip()
    return f"{kept}… (truncated, {len(text) - len(kept):,} more characters)", True


#: What :func:`truncate_middle` keeps of the end: the question sentence a long text ends with.
_TAIL_SHARE = 3


def truncate_middle(text: str, limit: int) -> tuple[str, bool]:
    """``text`` cut to ``limit`` characters by leaving out its middle (its start and its last third of ``limit``
    kept, with a visible marker between): a long question's actual question is usually its last sentence."""
    if len(text) <= limit:
        return text, False
    tail_size = limit // _TAIL_SHARE
    head, tail = text[: limit - tail_size].rstrip(), text[len(text) - tail_size :].lstrip()
    left_out = len(text) - len(head) - len(tail)
    return f"{head} … (truncated, {left_out:,} characters left out) … {tail}", True


#: The marker :func:`truncate` and :func:`truncate_middle` leave in a cut text.
TRUNCATED = re.compile(r"… \(truncated, [0-9,]+ (?:more characters|characters left out)\)")


def was_truncated(record: HumanRequestRecord) -> bool:
    """Whether a text of ``record`` as :meth:`EgressPolicy.for_channel` shows it was cut (carries the marker)."""
    texts = [record.title, record.question, record.context, record.reason or ""]
    texts += [t for o in record.options for t in (o.label, o.consequence or "")]
    return any(TRUNCATED.search(t) for t in texts)


#: Texts up to this long have their redaction remembered (:meth:`EgressPolicy.redact`); the run-executor cuts a
#: question and its context to 4,096 characters, so every text of a request fits.
_MEMO_TEXT = 4096
#: Redactions remembered per policy (first in, first out): a request's texts are redacted at intake and again
#: each time a channel, the inbox API or an outcome shows the record, all within about a second.
_MEMO_SIZE = 1024


@dataclass(frozen=True)
class EgressPolicy:
    patterns: tuple[SecretPattern, ...] = BUILTIN_PATTERNS
    limits: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_LIMITS))
    default_limit: int = DEFAULT_LIMIT
    #: text -> its redaction with :attr:`patterns` (pure, so the same text always redacts the same way).
    _memo: dict[str, Redacted] = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    @classmethod
    def build(
        cls,
        *,
        limits: Mapping[str, int] | None = None,
        extra_patterns: Mapping[str, str] | None = None,
        default_limit: int = DEFAULT_LIMIT,
        setting: str = "egress_redact_patterns",
    ) -> EgressPolicy:
        extra = compile_extra_patterns(extra_patterns or {}, setting=setting)
        return cls(
            patterns=(*BUILTIN_PATTERNS, *extra),
            limits={**DEFAULT_LIMITS, **(limits or {})},
            default_limit=default_limit,
        )

    def limit_for(self, channel: str) -> int:
        return self.limits.get(channel, self.default_limit)

    # ------------------------------------------------------------------ redaction
    def redact(self, text: str) -> Redacted:
        """``text`` with every secret replaced (:class:`Redactor`), remembered for the texts seen last: a stored
        request's texts are redacted again every time it is shown (:meth:`for_channel`), each pass running
        every pattern over every field -- the service's largest CPU cost per question in the bench's loop."""
        done = self._memo.get(text)
        if done is None:
            done = Redactor(self.patterns).redact(text)
            if len(text) <= _MEMO_TEXT:
                if len(self._memo) >= _MEMO_SIZE:
                    self._memo.pop(next(iter(self._memo), ""), None)
                self._memo[text] = done
        # a caller may update the counts it gets: never the remembered ones
        return Redacted(done.text, Counter(done.counts)) if done.counts else Redacted(done.text)

    def redact_text(self, text: str) -> str:
        return self.redact(text).text

    def redact_record(self, record: HumanRequestRecord) -> HumanRequestRecord:
        """The record with every text a person will see redacted; ``redactions`` counts what was replaced."""
        counts: Counter[str] = Counter(record.redactions)

        def clean(text: str, cap: int | None = None) -> str:
            # what the publisher (the run-executor) already redacted counts too: the markers it left
            counts.update(m.group("kind") for m in MARKER.finditer(text))
            done = self.redact(text)
            counts.update(done.counts)
            return done.text if cap is None else done.text[:cap]

        options = [
            HumanOption(
                id=o.id,
                label=clean(o.label, _SHORT_FIELD) or o.id,
                consequence=clean(o.consequence) if o.consequence is not None else None,
            )
            for o in record.options
        ]
        link = record.source_link
        if link is not None:
            href = self.redact(link.href)
            counts.update(href.counts)
            # a link with a secret in it (``?token=…``) is dropped: a redacted URL opens nothing
            link = None if href.counts else SourceLink(href=link.href, label=clean(link.label) if link.label else None)
        form = None if record.answer_schema is None else redact_form(record.answer_schema, clean)
        return evolve(
            record,
            title=clean(record.title),
            question=clean(record.question) or "(redacted)",
            context=clean(record.context),
            # OBS-1: the agent's short phrase for why it asks (a redacted one stays: it says something was there)
            reason=(clean(record.reason, MAX_REASON) or None) if record.reason is not None else None,
            options=options,
            answer_schema=form,
            redactions=dict(sorted(counts.items())),
            source_link=link,
        )

    def redact_answer(
        self, record: HumanRequestRecord, answer: HumanAnswer, read: forms.FormRead | None = None
    ) -> tuple[HumanAnswer, dict[str, int]]:
        """``answer`` (one ``record`` takes: checked) as it may be stored and published, and what was redacted in it
        per kind (SEC-1: the record, ``human.answered``, the journal and the agent never hold a person's secret).

        A free-text answer: each secret becomes ``[REDACTED:<kind>]``, like a request's texts. A form's answer
        (``record.answer_schema``; ``read``: its reading, :func:`temporality_protocol.forms.read`, read here
        without one): every string value, and each text of a list, is redacted -- except a value that is one of its
        field's own choices (an ``enum`` / ``oneOf`` value: the agent's, shown in the stored form, which was
        redacted at intake; this keeps the answer fitting the form when a pattern came since that matches it) --
        and every string value of a secret field (``db_password``, ``"format": "password"``:
        :func:`~temporality_protocol.redaction.is_secret_field`) becomes its marker, as in the form; with anything
        redacted, the answer is the JSON object of the content, which must still fit the form, else
        :class:`SecretUnfit`. A declined form, an option (a machine value), an answer with nothing to redact: as
        given."""
        if not isinstance(answer, TextAnswer):
            return answer, {}
        schema = record.answer_schema
        if schema is None:
            done = self.redact(answer.value)
            if not done.counts:
                return answer, {}
            return TextAnswer(value=done.text[:MAX_TEXT]), dict(sorted(done.counts.items()))
        read = read or forms.read(schema, answer)
        if read.action != "accept" or not read.content:
            return answer, {}
        fields = forms.form_fields(schema)
        counts: Counter[str] = Counter()

        def clean(name: str, value: Any) -> Any:
            if isinstance(value, list):
                return [clean(name, item) for item in value]
            if not isinstance(value, str):
                return value
            prop = fields.get(name, {})
            if is_secret_field(name, prop) or is_secret_field(None, schema):
                counts[_SECRET_FIELD_KIND] += 1
                return SECRET_FIELD_MARKER
            if any(value == choice for choice, _ in (*_choices(prop), *_choices(prop.get("items")))):
                return value
            done = self.redact(value)
            counts.update(done.counts)
            return done.text

        content = {name: clean(name, value) for name, value in read.content.items()}
        if not counts:
            return answer, {}
        text = json.dumps(content, ensure_ascii=False)
        if len(text) > MAX_TEXT or forms.read(schema, TextAnswer(value=text)).content != content:
            raise SecretUnfit(sorted(counts))
        return TextAnswer(value=text), dict(sorted(counts.items()))

    # ------------------------------------------------------------------ truncation
    def for_channel(self, record: HumanRequestRecord, channel: str) -> tuple[HumanRequestRecord, list[str]]:
        """``record`` as ``channel`` may show it: redacted (again: a no-op on a stored record, and what hides a
        secret in the form of a record an older version stored) and each text field truncated to the
        channel's limit; also the names of the fields that were truncated. The form's texts are redacted,
        not truncated (the web inbox shows the form; a chat shows the question the run-executor wrote)."""
        limit = self.limit_for(channel)
        short = min(limit, _SHORT_FIELD)
        cut: list[str] = []

        def fit(name: str, text: str, size: int) -> str:
            # the question keeps its end too: its last sentence is what is asked
            text, truncated = (truncate_middle if name == "question" else truncate)(self.redact_text(text), size)
            if truncated and name not in cut:
                cut.append(name)
            return text

        options = [
            HumanOption(
                id=o.id,
                label=fit("options", o.label, short),
                consequence=fit("options", o.consequence, limit) if o.consequence is not None else None,
            )
            for o in record.options
        ]
        answer = record.answer
        if answer is not None:  # quoted in the outcome line: another member may see it (an older version's answer)
            try:
                answer = self.redact_answer(record, answer)[0]
            except SecretUnfit:
                answer = TextAnswer(value=self.redact_text(answer.value)) if isinstance(answer, TextAnswer) else answer
        link = record.source_link
        if link is not None:
            if len(link.href) > limit or self.redact(link.href).counts:  # a cut URL opens nothing: left out
                link = None
                cut.append("source_link")
            elif link.label:
                link = SourceLink(href=link.href, label=fit("source_link", link.label, short))
        shown = evolve(
            record,
            answer=answer,
            title=fit("title", record.title, short),
            question=fit("question", record.question, limit),
            context=fit("context", record.context, limit),
            reason=fit("reason", record.reason, short) if record.reason is not None else None,
            options=options,
            source_link=link,
            answer_schema=None if record.answer_schema is None else redact_form(record.answer_schema, self.redact_text),
        )
        return shown, cut

    def truncated(self, record: HumanRequestRecord, channel: str) -> list[str]:
        """What :meth:`for_channel` says it truncated (the same names, in the same order), without building the
        record it shows: the intake's ``human.notified.truncated`` for a question it does not render itself."""
        limit = self.limit_for(channel)
        short = min(limit, _SHORT_FIELD)

        def over(text: str, size: int) -> bool:  # truncate() cuts exactly the texts longer than ``size``
            return len(self.redact_text(text)) > size

        cut: list[str] = []
        if any(
            over(o.label, short) or (o.consequence is not None and over(o.consequence, limit)) for o in record.options
        ):
            cut.append("options")
        link = record.source_link
        if link is not None and (
            len(link.href) > limit
            or bool(self.redact(link.href).counts)
            or bool(link.label and over(link.label, short))
        ):
            cut.append("source_link")
        cut += [
            name
            for name, text, size in (
                ("title", record.title, short),
                ("question", record.question, limit),
                ("context", record.context, limit),
                ("reason", record.reason or "", short),
            )
            if over(text, size)
        ]
        return cut

    def message_for(self, channel: str, text: str) -> str:
        """A plain message (a notification) as ``channel`` may carry it: redacted, then truncated."""
        return self.message_shown(channel, text)[0]

    def message_shown(self, channel: str, text: str) -> tuple[str, dict[str, int], bool]:
        """:meth:`message_for`, with what was redacted per kind (the publisher's markers counted too, as
        :meth:`redact_record` counts them) and whether the text was truncated."""
        counts: Counter[str] = Counter(m.group("kind") for m in MARKER.finditer(text))
        done = self.redact(text)
        counts.update(done.counts)
        shown, truncated = truncate(done.text, self.limit_for(channel))
        return shown, dict(sorted(counts.items())), truncated


class SecretUnfit(ValueError):
    """A form's answer that fits its form only with a secret (:meth:`EgressPolicy.redact_answer`): ``kinds``
    names what was found, never the secret."""

    def __init__(self, kinds: list[str]) -> None:
        super().__init__(f"the answer fits its form only with its secret ({', '.join(kinds)})")
        self.kinds = kinds


#: The kind a secret field's value is counted as (its marker's, :data:`SECRET_FIELD_MARKER`).
_SECRET_FIELD_KIND = SECRET_FIELD_MARKER.removeprefix("[REDACTED:").removesuffix("]")


def _choices(prop: Any) -> list[tuple[Any, str]]:
    """The closed set of values of a field's schema (none when it is free, or not a schema)."""
    return (forms.field_choices(prop) or []) if isinstance(prop, dict) else []


#: The policy with the built-in patterns and default limits (what an adapter uses unless told otherwise).
DEFAULT_POLICY = EgressPolicy()
