"""The egress policy: what may leave the system on a channel (HUM-5, SEC-1).

Everything a person is shown — the question, its context, the title, the options' labels and
consequences, a notification's text, a free-text answer quoted in an outcome — passes through
:class:`EgressPolicy` before a channel carries it:

* **secrets are redacted** at intake (the stored request never holds them, so every channel, the web
  inbox API and every later reminder show the redacted text): each match of a :class:`SecretPattern`
  becomes ``[REDACTED:<kind>]``; for ``key=value`` and URL credentials only the secret part is
  replaced, so the text stays readable (``postgres://app:[REDACTED:url_credentials]@db:5432/x``);
* **long text is truncated** per channel when it is rendered: each text field keeps at most the
  channel's limit of characters and ends with a visible marker
  ``… (truncated, 1,234 more characters)``.

The built-in patterns (:data:`BUILTIN_PATTERNS`, one test each) are always on; a deployment adds its
own (``TEMPORALITY_HUMAN_EGRESS_REDACT_PATTERNS``, ``{"<kind>": "<regex>"}``: the whole match is
replaced, or only the group named ``secret`` when the regex has one). The counts per kind — never a
secret — are stored in the request (``redactions``) and journaled in ``human.notified.redacted``.

Pure functions; the policy is built once at start (:meth:`EgressPolicy.from_settings`, a bad regex is
a configuration error naming its key).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from temporality_bus import evolve
from temporality_human_interaction.records import HumanRequestRecord
from temporality_protocol import HumanOption, TextAnswer

__all__ = [
    "BUILTIN_PATTERNS",
    "DEFAULT_LIMIT",
    "DEFAULT_LIMITS",
    "DEFAULT_POLICY",
    "EgressPolicy",
    "PatternError",
    "Redacted",
    "SecretPattern",
    "compile_extra_patterns",
    "truncate",
]

#: Characters kept per text field when no limit is configured for a channel.
DEFAULT_LIMIT = 1000
#: Per channel: Telegram messages are capped at 4096 characters (the whole message), Matrix renders
#: long events fine but people do not read them, the web inbox has room.
DEFAULT_LIMITS: Mapping[str, int] = {"telegram": 800, "matrix": 2000, "web": 4000}
#: A label or a title is never longer than this, whatever the channel allows (the protocol's cap).
_SHORT_FIELD = 200


@dataclass(frozen=True)
class SecretPattern:
    """One kind of secret: ``regex`` finds it; the group named ``secret`` (or the whole match) is replaced."""

    kind: str
    regex: re.Pattern[str]

    def span_of(self, match: re.Match[str]) -> tuple[int, int]:
        if "secret" in self.regex.groupindex:
            return match.span("secret")
        return match.span()


def _p(kind: str, pattern: str, flags: int = 0) -> SecretPattern:
    return SecretPattern(kind, re.compile(pattern, flags))


#: Never re-redact a marker (patterns run one after another over the same text).
_NOT_MARKER = r"(?!\[REDACTED)"
#: Words naming a secret in ``key=value`` / ``key: value`` (``DB_PASSWORD=…``, ``api_key: …``, ``?access_token=…``).
_SECRET_KEY_WORDS = (
    r"password|passwd|pwd|passphrase|secret|token|api[_-]?key|apikey|access[_-]?key|secret[_-]?key"
    r"|account[_-]?key|shared[_-]?access[_-]?key|private[_-]?key|client[_-]?secret|credentials?"
)

#: In order: a later pattern never sees what an earlier one replaced.
BUILTIN_PATTERNS: tuple[SecretPattern, ...] = (
    # -----BEGIN RSA PRIVATE KEY----- … -----END RSA PRIVATE KEY----- (also a block cut off before its END)
    _p(
        "private_key",
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----[\s\S]*?(-----END [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----|\Z)",
    ),
    # header.payload.signature, both first parts base64url JSON objects ("eyJ" = '{"')
    _p("jwt", r"\beyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"),
    # scheme://user:password@host — connection strings (postgres, mysql, redis, amqp, mongodb+srv) and URLs
    _p("url_credentials", r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]+:" + _NOT_MARKER + r"(?P<secret>[^\s@/]+)@"),
    # GitHub personal, OAuth, user-to-server, server-to-server, refresh tokens; fine-grained PATs
    _p("github_token", r"\b(gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})\b"),
    _p("gitlab_token", r"\bgl(pat|dt|rt|ptt|cbt|oas)-[A-Za-z0-9_-]{20,}"),
    _p("aws_access_key_id", r"\b(AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}\b"),
    _p(
        "aws_secret_access_key",
        r"(?i)\baws_?secret_?(access_?)?key[\"']?\s*[:=]\s*[\"']?" + _NOT_MARKER + r"(?P<secret>[A-Za-z0-9/+=]{40})",
    ),
    _p("slack_token", r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),
    _p("stripe_key", r"\b[rsp]k_(live|test)_[A-Za-z0-9]{16,}"),
    _p("google_api_key", r"\bAIza[0-9A-Za-z_-]{35}"),
    # OpenAI / Anthropic style keys: sk-…, sk-proj-…, sk-ant-…
    _p("api_key", r"\bsk-[A-Za-z0-9_-]{20,}"),
    # Authorization: Bearer <token> / Basic <base64> / token <token>
    _p(
        "authorization_header",
        r"(?i)\b(bearer|basic|token)\s+" + _NOT_MARKER + r"(?P<secret>[A-Za-z0-9._~+/-]{16,}=*)",
    ),
    # DB_PASSWORD=…, "api_key": "…", Password=…; (ADO.NET), ?access_token=…&
    _p(
        "secret_assignment",
        r"(?i)\b[A-Za-z0-9_.-]*("
        + _SECRET_KEY_WORDS
        + r")[A-Za-z0-9_.-]*[\"']?\s*[:=]\s*[\"']?"
        + _NOT_MARKER
        + r"(?P<secret>[^\s\"',;&<>]+)",
    ),
)


class PatternError(ValueError):
    """An extra pattern of the configuration is not usable; the message names its key."""


def compile_extra_patterns(raw: Mapping[str, str], *, setting: str) -> tuple[SecretPattern, ...]:
    """``{"<kind>": "<regex>"}`` from the configuration as patterns; a bad one raises :class:`PatternError`
    naming ``<setting>[<kind>]``."""
    out: list[SecretPattern] = []
    for kind, pattern in raw.items():
        key = f"{setting}[{kind}]"
        if not re.fullmatch(r"[a-z0-9_]{1,40}", kind):
            raise PatternError(f"{key}: a pattern's name must be 1-40 characters of a-z 0-9 _")
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise PatternError(f"{key}: not a valid regular expression: {exc}") from None
        if regex.search("") is not None:
            raise PatternError(f"{key}: the pattern matches the empty string (it would redact nothing useful)")
        out.append(SecretPattern(kind, regex))
    return tuple(out)


def truncate(text: str, limit: int) -> tuple[str, bool]:
    """``text`` cut to ``limit`` characters plus a visible marker saying how much was left out."""
    if len(text) <= limit:
        return text, False
    kept = text[:limit].rstrip()
    return f"{kept}… (truncated, {len(text) - len(kept):,} more characters)", True


@dataclass(frozen=True)
class Redacted:
    text: str
    counts: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True)
class EgressPolicy:
    patterns: tuple[SecretPattern, ...] = BUILTIN_PATTERNS
    limits: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_LIMITS))
    default_limit: int = DEFAULT_LIMIT

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
        counts: Counter[str] = Counter()
        for pattern in self.patterns:
            pieces: list[str] = []
            last = 0
            for match in pattern.regex.finditer(text):
                start, end = pattern.span_of(match)
                if end <= start or start < last or "[REDACTED:" in text[start:end]:
                    continue  # empty, overlapping, or already redacted inside (by an earlier pattern)
                pieces += [text[last:start], f"[REDACTED:{pattern.kind}]"]
                last = end
                counts[pattern.kind] += 1
            if pieces:
                text = "".join(pieces) + text[last:]
        return Redacted(text, counts)

    def redact_text(self, text: str) -> str:
        return self.redact(text).text

    def redact_record(self, record: HumanRequestRecord) -> HumanRequestRecord:
        """The record with every text a person will see redacted; ``redactions`` counts what was replaced."""
        counts: Counter[str] = Counter(record.redactions)

        def clean(text: str, cap: int | None = None) -> str:
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
        return evolve(
            record,
            title=clean(record.title),
            question=clean(record.question) or "(redacted)",
            context=clean(record.context),
            options=options,
            redactions=dict(sorted(counts.items())),
        )

    # ------------------------------------------------------------------ truncation
    def for_channel(self, record: HumanRequestRecord, channel: str) -> tuple[HumanRequestRecord, list[str]]:
        """``record`` as ``channel`` may show it: redacted (again: a no-op on a stored record) and each
        text field truncated to the channel's limit; also the names of the fields that were truncated."""
        limit = self.limit_for(channel)
        short = min(limit, _SHORT_FIELD)
        cut: list[str] = []

        def fit(name: str, text: str, size: int) -> str:
            text, truncated = truncate(self.redact_text(text), size)
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
        if isinstance(answer, TextAnswer):  # quoted in the outcome line: another member may see it
            answer = TextAnswer(value=self.redact_text(answer.value))
        shown = evolve(
            record,
            answer=answer,
            title=fit("title", record.title, short),
            question=fit("question", record.question, limit),
            context=fit("context", record.context, limit),
            options=options,
        )
        return shown, cut

    def message_for(self, channel: str, text: str) -> str:
        """A plain message (a notification) as ``channel`` may carry it: redacted, then truncated."""
        return truncate(self.redact_text(text), self.limit_for(channel))[0]


#: The policy with the built-in patterns and default limits (what an adapter uses unless told otherwise).
DEFAULT_POLICY = EgressPolicy()
