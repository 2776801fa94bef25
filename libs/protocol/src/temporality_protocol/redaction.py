"""Secret redaction, shared by every publisher of text a person will read (HUM-5, SEC-1).

The patterns live here, not in one service, because a secret must be gone before an event reaches the
bus: the run-executor redacts each ``human.requested`` it publishes (:meth:`Redactor.human_requested`),
so neither the bus nor the journal holds one; human-interaction applies the same patterns again when it
stores a request, and truncates per channel (``temporality_human_interaction.egress``).

Each match of a :class:`SecretPattern` becomes ``[REDACTED:<kind>]``; for ``key=value`` and URL
credentials only the secret part is replaced, so the text stays readable
(``postgres://app:[REDACTED:url_credentials]@db:5432/x``). The built-in patterns
(:data:`BUILTIN_PATTERNS`) are always on; a deployment adds its own with
``TEMPORALITY_HUMAN_EGRESS_REDACT_PATTERNS`` (JSON ``{"<kind>": "<regex>"}``: the whole match is replaced,
or only the group named ``secret``), which every process that publishes or shows a person's text reads:
:func:`process_redactor`.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from temporality_protocol.events import MAX_REASON, HumanOption, HumanRequested, SourceLink

__all__ = [
    "BUILTIN_PATTERNS",
    "CREDENTIAL_KEY",
    "MARKER",
    "REDACT_PATTERNS_ENV",
    "SECRET_FIELD_MARKER",
    "PatternError",
    "Redacted",
    "Redactor",
    "SecretPattern",
    "compile_extra_patterns",
    "is_secret_field",
    "process_redactor",
    "redact_form",
    "redactor_from_json",
]

#: The variable that adds a deployment's own patterns, in every process that reads it (JSON object).
REDACT_PATTERNS_ENV = "TEMPORALITY_HUMAN_EGRESS_REDACT_PATTERNS"
#: A JSON key whose value is a credential (``token``, ``auth_token``, ``password_set`` -- callers keep ``*_set``
#: flags): the journal's audit details and ``temporality dlq show`` blank such values.
CREDENTIAL_KEY = re.compile(r"token|secret|password|passwd|credential|authorization|api_?key|private", re.IGNORECASE)
#: What a redaction leaves in the text; ``kind`` names the pattern.
MARKER = re.compile(r"\[REDACTED:(?P<kind>[a-z0-9_]{1,40})\]")


#: Where a pattern's first match in a text can start at the earliest, or ``None`` when it has none: a bound
#: found by ``str.find`` (see :data:`BUILTIN_PATTERNS`), so the regex is not tried at every position before it.
Bound = Callable[[str], int | None]


@dataclass(frozen=True)
class SecretPattern:
    """One kind of secret: ``regex`` finds it; the group named ``secret`` (or the whole match) is replaced.

    ``earliest`` (optional): a lower bound of where ``regex``'s first match in a text starts, ``None`` when
    ``regex`` has no match there at all. The matches are then searched from that position on, which finds
    exactly the matches a search from the text's start finds (a search from a position still sees the
    characters before it for ``\b``): a bound only saves the positions where no match can start.
    """

    kind: str
    regex: re.Pattern[str]
    earliest: Bound | None = field(default=None, compare=False, repr=False)

    def span_of(self, match: re.Match[str]) -> tuple[int, int]:
        if "secret" in self.regex.groupindex:
            return match.span("secret")
        return match.span()

    def finditer(self, text: str) -> Iterator[re.Match[str]]:
        """``regex.finditer(text)``, the positions before :attr:`earliest`'s bound skipped."""
        start = 0 if self.earliest is None else self.earliest(text)
        if start is None:
            return iter(())
        return self.regex.finditer(text, start)


def _p(kind: str, pattern: str, flags: int = 0, earliest: Bound | None = None) -> SecretPattern:
    return SecretPattern(kind, re.compile(pattern, flags), earliest)


@dataclass(frozen=True)
class _Bound:
    """A :data:`Bound` that also says what a text must hold for the pattern to match at all: one of ``pieces``
    in the lower-cased text, when the text is ASCII (:meth:`Redactor.redact` looks for all patterns' at once)."""

    pieces: tuple[str, ...]
    earliest: Bound

    def __call__(self, text: str) -> int | None:
        return self.earliest(text)


def _starts_with(*literals: str) -> _Bound:
    """For a pattern every match of which starts with one of ``literals`` (case as written): the first of them."""
    if len(literals) == 1:
        (literal,) = literals

        def earliest(text: str) -> int | None:
            at = text.find(literal)
            return at if at >= 0 else None

    else:

        def earliest(text: str) -> int | None:
            found = [at for at in map(text.find, literals) if at >= 0]
            return min(found) if found else None

    return _Bound(tuple(literal.lower() for literal in literals), earliest)


def _within_run(*pieces: str, run: str = "", folded: bool = False) -> _Bound:
    """For a pattern every match of which holds one of ``pieces``, preceded in the match only by characters of
    ``run``. The bound: the first piece found, moved back over the ``run`` characters (and any non-ASCII one,
    to be safe) before it. A match starting before it would hold, between its start and its piece, a character
    that is not in ``run``.

    ``folded``: the pattern ignores case (``(?i)``): the pieces are looked for in the lower-cased text, which
    matches what ``(?i)`` matches only for ASCII text; any other text gets no bound (searched from 0)."""
    allowed = frozenset(run)

    def earliest(text: str) -> int | None:
        if folded:
            if not text.isascii():
                return 0
            haystack = text.lower()
        else:
            haystack = text
        found = [at for at in map(haystack.find, pieces) if at >= 0]
        if not found:
            return None
        at = min(found)
        while at > 0 and (text[at - 1] in allowed or not text[at - 1].isascii()):
            at -= 1
        return at

    return _Bound(tuple(piece.lower() for piece in pieces), earliest)


#: Never re-redact a marker (patterns run one after another over the same text).
_NOT_MARKER = r"(?!\[REDACTED)"
#: Words naming a secret in ``key=value`` / ``key: value`` (``DB_PASSWORD=…``, ``api_key: …``, ``?access_token=…``).
_SECRET_KEY_WORDS = (
    r"password|passwd|pwd|passphrase|secret|token|api[_-]?key|apikey|access[_-]?key|secret[_-]?key"
    r"|account[_-]?key|shared[_-]?access[_-]?key|private[_-]?key|client[_-]?secret|credentials?"
)

_ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"

#: In order: a later pattern never sees what an earlier one replaced.
BUILTIN_PATTERNS: tuple[SecretPattern, ...] = (
    # -----BEGIN RSA PRIVATE KEY----- … -----END RSA PRIVATE KEY----- (also a block cut off before its END)
    _p(
        "private_key",
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----[\s\S]*?(-----END [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----|\Z)",
        earliest=_starts_with("-----BEGIN "),
    ),
    # header.payload.signature, both first parts base64url JSON objects ("eyJ" = '{"')
    # (tried once per run of [A-Za-z0-9_-], from its first word-start "eyJ": a later one in the same run ends where
    # it does and fails as it did -- tried at each, "eyJ-" * 25,000 cost seconds, quadratic in the run's length)
    _p(
        "jwt",
        r"(?<![A-Za-z0-9_-])(?>[A-Za-z0-9_-]*?(?=\beyJ))"
        r"(?P<secret>eyJ[A-Za-z0-9_-]{5,}+\.eyJ[A-Za-z0-9_-]{5,}+\.[A-Za-z0-9_-]*+)",
        earliest=_within_run("eyJ", run=_ALNUM + "_-"),
    ),
    # scheme://user:password@host — connection strings (postgres, mysql, redis, amqp, mongodb+srv) and URLs
    # (a scheme of at most 32 characters: unbounded, every word start in a long run of "a.a.a." before a "://"
    # scanned the whole run again, quadratic in the run's length)
    _p(
        "url_credentials",
        r"\b[A-Za-z][A-Za-z0-9+.-]{0,31}://[^\s:/@]+:" + _NOT_MARKER + r"(?P<secret>[^\s@/]+)@",
        earliest=_within_run("://", run=_ALNUM + "+.-"),
    ),
    # GitHub personal, OAuth, user-to-server, server-to-server, refresh tokens; fine-grained PATs
    _p(
        "github_token",
        r"\b(gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})\b",
        earliest=_starts_with("gh", "github_pat_"),
    ),
    _p("gitlab_token", r"\bgl(pat|dt|rt|ptt|cbt|oas)-[A-Za-z0-9_-]{20,}", earliest=_starts_with("gl")),
    _p(
        "aws_access_key_id",
        r"\b(AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}\b",
        earliest=_starts_with("AKIA", "ASIA", "AGPA", "AIDA", "AROA", "ANPA", "ANVA", "AIPA"),
    ),
    _p(
        "aws_secret_access_key",
        r"(?i)\baws_?secret_?(access_?)?key[\"']?\s*[:=]\s*[\"']?" + _NOT_MARKER + r"(?P<secret>[A-Za-z0-9/+=]{40})",
        earliest=_within_run("aws", folded=True),
    ),
    _p("slack_token", r"\bxox[abposr]-[A-Za-z0-9-]{10,}", earliest=_starts_with("xox")),
    _p("stripe_key", r"\b[rsp]k_(live|test)_[A-Za-z0-9]{16,}", earliest=_starts_with("rk_", "sk_", "pk_")),
    _p("google_api_key", r"\bAIza[0-9A-Za-z_-]{35}", earliest=_starts_with("AIza")),
    # Standard Webhooks signing secrets (whsec_ + base64: the gateway's standard_webhooks sources, Svix)
    _p("webhook_secret", r"\bwhsec_[A-Za-z0-9+/]{16,}={0,2}", earliest=_starts_with("whsec_")),
    _p("npm_token", r"\bnpm_[A-Za-z0-9]{36}\b", earliest=_starts_with("npm_")),
    # https://hooks.slack.com/services/T…/B…/… (whoever has the URL may post to the channel); also workflows/triggers
    _p(
        "slack_webhook_url",
        r"(?i)\bhttps?://hooks\.slack\.com/(services|workflows|triggers)/[A-Za-z0-9_/-]{8,}",
        earliest=_within_run("hooks.slack.com", run=_ALNUM + ":/.", folded=True),
    ),
    # OpenAI / Anthropic style keys: sk-…, sk-proj-…, sk-ant-…
    _p("api_key", r"\bsk-[A-Za-z0-9_-]{20,}", earliest=_starts_with("sk-")),
    # Authorization: Bearer <token> / Basic <base64> / token <token>
    _p(
        "authorization_header",
        r"(?i)\b(bearer|basic|token)\s+" + _NOT_MARKER + r"(?P<secret>[A-Za-z0-9._~+/-]{16,}=*)",
        earliest=_within_run("bearer", "basic", "token", folded=True),
    ),
    # DB_PASSWORD=…, "api_key": "…", Password=…; (ADO.NET), ?access_token=…&
    # The key is a whole run of [A-Za-z0-9_.-] holding a key word: tried only where such a run starts (the
    # lookbehind), the word looked for ahead in it, the run then taken whole (possessive: the character after it
    # must be a quote, a blank, ":" or "=", none of which is in the run). Written as ``\b[A-Za-z0-9_.-]*(words)``
    # it was tried at every word start of a run and backtracked over the rest of it each time: ~9 s of CPU for
    # "a." * 4000 + "key" (8 KB), quadratic in the run's length. The secret is the same; a key run right after a
    # non-ASCII letter ("épassword=…", no word boundary there) is now found too.
    _p(
        "secret_assignment",
        r"(?i)(?<![A-Za-z0-9_.-])(?=[A-Za-z0-9_.-]*?("
        + _SECRET_KEY_WORDS
        + r"))[A-Za-z0-9_.-]*+[\"']?\s*[:=]\s*[\"']?"
        + _NOT_MARKER
        + r"(?P<secret>[^\s\"',;&<>]+)",
        # every key word holds one of these (api_key: "key"; credentials: "credential"), and only characters
        # of [A-Za-z0-9_.-] come before it in a match
        earliest=_within_run("pass", "pwd", "secret", "token", "key", "credential", run=_ALNUM + "_.-", folded=True),
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
        if not isinstance(pattern, str):
            raise PatternError(f"{key}: a pattern must be a string")
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise PatternError(f"{key}: not a valid regular expression: {exc}") from None
        if regex.search("") is not None:
            raise PatternError(f"{key}: the pattern matches the empty string (it would redact nothing useful)")
        out.append(SecretPattern(kind, regex))
    return tuple(out)


@dataclass(frozen=True)
class Redacted:
    text: str
    counts: Counter[str] = field(default_factory=Counter)


def _screen_of(patterns: tuple[SecretPattern, ...]) -> tuple[str, ...] | None:
    """:attr:`Redactor._screen`, once per set of patterns and their bounds (a :class:`Redactor` is often built per
    use). The bounds are part of the key: a pattern's ``earliest`` is left out of its equality, so the same
    patterns without bounds would otherwise share the built-ins' screen, or leave them without one."""
    return _screen_keyed(tuple((p, p.earliest) for p in patterns))


@functools.lru_cache(maxsize=64)
def _screen_keyed(keyed: tuple[tuple[SecretPattern, Bound | None], ...]) -> tuple[str, ...] | None:
    patterns = [p for p, _ in keyed]
    if not all(isinstance(p.earliest, _Bound) for p in patterns):
        return None
    return tuple(
        dict.fromkeys(piece for p in patterns if isinstance(p.earliest, _Bound) for piece in p.earliest.pieces)
    )


@dataclass(frozen=True)
class Redactor:
    """Replaces every match of ``patterns`` in a text; pure (build it once, use it anywhere)."""

    patterns: tuple[SecretPattern, ...] = BUILTIN_PATTERNS

    @classmethod
    def build(cls, extra_patterns: Mapping[str, str] | None = None, *, setting: str = REDACT_PATTERNS_ENV) -> Redactor:
        return cls((*BUILTIN_PATTERNS, *compile_extra_patterns(extra_patterns or {}, setting=setting)))

    @functools.cached_property
    def _screen(self) -> tuple[str, ...] | None:
        """What an ASCII text must hold, lower-cased, for any of :attr:`patterns` to match it: one of the
        pieces of their bounds; ``None`` when a pattern has no such bound (a deployment's own)."""
        return _screen_of(self.patterns)

    def redact(self, text: str) -> Redacted:
        screen = self._screen
        if screen is not None and text.isascii():  # most texts hold nothing any pattern could match
            lowered = text.lower()
            if not any(piece in lowered for piece in screen):
                return Redacted(text)
        counts: Counter[str] = Counter()
        for pattern in self.patterns:
            pieces: list[str] = []
            last = 0
            for match in pattern.finditer(text):
                start, end = pattern.span_of(match)
                if end <= start or start < last or "[REDACTED:" in text[start:end]:
                    continue  # empty, overlapping, or already redacted inside (by an earlier pattern)
                pieces += [text[last:start], f"[REDACTED:{pattern.kind}]"]
                last = end
                counts[pattern.kind] += 1
            if pieces:
                text = "".join(pieces) + text[last:]
        return Redacted(text, counts)

    def link(self, link: SourceLink | None) -> SourceLink | None:
        """``link`` unless its URL holds a secret (``?access_token=…``: a redacted URL opens nothing)."""
        if link is None or self.redact(link.href).counts:
            return None
        if link.label is None:
            return link
        return SourceLink(href=link.href, label=self.redact(link.label).text[:200])

    def human_requested(self, data: HumanRequested) -> HumanRequested:
        """``data`` with every text a person will read redacted: the title, question, context, the reason (OBS-1),
        each option's label and consequence, the source link, the texts of its form (:func:`redact_form`). Ids, the policy,
        the recipient and the form's machine values are never touched."""

        def clean(text: str) -> str:
            return self.redact(text).text

        options = [
            HumanOption(
                id=o.id,
                label=clean(o.label)[:200] or o.id,
                consequence=clean(o.consequence) if o.consequence is not None else None,
            )
            for o in data.options
        ]
        return data.model_copy(
            update={
                "title": clean(data.title),
                "question": clean(data.question)[:4096] or "(redacted)",
                "context": clean(data.context)[:4096],
                "reason": None if data.reason is None else clean(data.reason)[:MAX_REASON] or None,
                "options": options,
                "source_link": self.link(data.source_link),
                "answer_schema": None if data.answer_schema is None else redact_form(data.answer_schema, clean),
            }
        )


#: Keywords of a form (``answer_schema``) whose strings a person reads and no answer is checked against.
_FORM_TEXTS = frozenset({"title", "description", "default", "examples", "enumNames"})
#: Keywords holding a map of name -> subschema (the names are the machine's: field names, never touched).
_FORM_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
#: Keywords holding one subschema, or a list of them.
_FORM_SCHEMAS = frozenset(
    {"items", "additionalProperties", "contains", "not", "if", "then", "else", "propertyNames", "unevaluatedItems"}
)
_FORM_SCHEMA_LISTS = frozenset({"oneOf", "anyOf", "allOf", "prefixItems"})


#: A field whose name names a secret (``db_password``, ``api_token``: the words of ``secret_assignment``).
_SECRET_FIELD_NAME = re.compile(r"(?i)(" + _SECRET_KEY_WORDS + r")")
#: What a secret field's values become (the kind of ``key=value`` whose key names a secret).
SECRET_FIELD_MARKER = "[REDACTED:secret_assignment]"
#: Keywords holding a field's values: what an answer is checked against, and what a front end offers.
_FORM_VALUES = frozenset({"enum", "const"})


def is_secret_field(name: str | None, schema: dict[str, Any]) -> bool:
    """Whether a form field holds a secret: its name names one (as in ``DB_PASSWORD=…``, the
    ``secret_assignment`` kind), or its schema says so (``"format": "password"``, ``"writeOnly": true``)."""
    if schema.get("format") == "password" or schema.get("writeOnly") is True:
        return True
    return name is not None and _SECRET_FIELD_NAME.search(name) is not None


def redact_form(schema: dict[str, Any], clean: Callable[[str], str]) -> dict[str, Any]:
    """A form (a request's ``answer_schema``, JSON Schema) with ``clean`` applied to every string a person is
    shown and no answer is validated against: ``title``, ``description``, ``default``, ``examples`` and
    ``enumNames`` (an enum's labels, and a ``oneOf`` const's ``title``), at every level of the schema.

    The values of a field (``enum``, ``const``, also a ``oneOf`` const's) are machine values, like option ids:
    an answer is checked against them and a front end sends them back, so they stay -- except a secret. A
    value a pattern finds on its own (an enum of tokens) is redacted like any text; and every string value,
    ``default`` and ``examples`` of a **secret field** (:func:`is_secret_field`: ``db_password``,
    ``"format": "password"``) becomes :data:`SECRET_FIELD_MARKER`, since no pattern can tell a password from a
    word: the same rule as ``DB_PASSWORD=…`` in a text. Such a value cannot be chosen by a person (who never
    saw it); human-interaction refuses an answer that names a redacted value. Field names, ``pattern``,
    ``format`` and bounds stay. A ``default`` is an annotation in JSON Schema 2020-12 (never checked), so a
    redacted one changes no answer's validity."""

    def texts(value: Any) -> Any:
        if isinstance(value, str):
            return clean(value)
        if isinstance(value, list):
            return [texts(item) for item in value]
        if isinstance(value, dict):
            return {key: texts(item) for key, item in value.items()}
        return value

    def hidden(value: Any) -> Any:
        """A secret field's value: every string in it replaced (through ``clean``, which may count the marker)."""
        if isinstance(value, str):
            return clean(SECRET_FIELD_MARKER)
        if isinstance(value, list):
            return [hidden(item) for item in value]
        if isinstance(value, dict):
            return {key: hidden(item) for key, item in value.items()}
        return value

    def walk(node: Any, secret: bool = False) -> Any:
        if not isinstance(node, dict):
            return node
        out: dict[str, Any] = {}
        for key, value in node.items():
            if secret and (key in _FORM_VALUES or key in {"default", "examples"}):
                out[key] = hidden(value)
            elif key in _FORM_TEXTS:
                out[key] = texts(value)
            elif key in _FORM_VALUES:
                out[key] = texts(value)  # a value a pattern finds (the rest are unchanged)
            elif key in _FORM_SCHEMA_MAPS and isinstance(value, dict):
                out[key] = {
                    name: walk(sub, secret or (isinstance(sub, dict) and is_secret_field(name, sub)))
                    for name, sub in value.items()
                }
            elif key in _FORM_SCHEMAS:
                out[key] = [walk(sub, secret) for sub in value] if isinstance(value, list) else walk(value, secret)
            elif key in _FORM_SCHEMA_LISTS and isinstance(value, list):
                out[key] = [walk(sub, secret) for sub in value]
            else:
                out[key] = value
        return out

    redacted: dict[str, Any] = walk(schema, is_secret_field(None, schema))
    return redacted


@cache
def process_redactor() -> Redactor:
    """The built-in patterns plus this process's :data:`REDACT_PATTERNS_ENV`, read once (on first use).

    A value that is not a JSON object of valid patterns raises :class:`PatternError` (every time): a
    publisher then fails rather than publish what it could not redact."""
    return redactor_from_json(os.environ.get(REDACT_PATTERNS_ENV, ""))


def redactor_from_json(raw: str) -> Redactor:
    """The built-in patterns plus ``raw``, a value of :data:`REDACT_PATTERNS_ENV` (JSON ``{"<kind>": "<regex>"}``;
    empty: none). :class:`PatternError`, naming the variable, for anything else."""
    raw = raw.strip()
    if not raw:
        return Redactor()
    try:
        extra = json.loads(raw)
    except ValueError as exc:
        raise PatternError(f"{REDACT_PATTERNS_ENV}: not JSON: {exc}") from None
    if not isinstance(extra, dict):
        raise PatternError(f'{REDACT_PATTERNS_ENV}: must be a JSON object {{"<kind>": "<regex>"}}')
    return Redactor.build(extra)
