"""The built-in patterns' ``earliest`` bounds skip only positions where no match starts: with them, every
pattern finds the very matches a search from the text's start finds, and a redaction is the same text."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from temporality_protocol.redaction import BUILTIN_PATTERNS, Redacted, Redactor, SecretPattern

ROOT = Path(__file__).resolve().parents[3]

#: Pieces of every pattern (and near misses), the characters around them, and non-ASCII letters that
#: ``(?i)`` folds onto ASCII ones (the Kelvin sign onto k, the long s onto s, the dotted and dotless i).
FRAGMENTS = [
    "password",
    "PassWord",
    "pwd",
    "api_key",
    "API-KEY",
    "apikey",
    "access_key",
    "client_secret",
    "secret",
    "token",
    "TOKEN",
    "credentials",
    "Credential",
    "aws_secret_access_key",
    "AWS_SECRET_KEY",
    "aws",
    "bearer ",
    "Basic ",
    "token ",
    "://",
    "postgres://",
    "user:",
    "@",
    "eyJ",
    "eyJhbGciOi.",
    "ghp_",
    "github_pat_",
    "glpat-",
    "AKIA",
    "ASIA",
    "xoxb-",
    "sk_live_",
    "pk_test_",
    "sk-",
    "AIza",
    "whsec_",
    "npm_",
    "https://hooks.slack.com/services/",
    "HOOKS.SLACK.COM/",
    "-----BEGIN RSA PRIVATE KEY-----",
    "-----END RSA PRIVATE KEY-----",
    "[REDACTED:jwt]",
    "=",
    ":",
    '"',
    "'",
    " ",
    "\n",
    "_",
    ".",
    "-",
    "/",
    "+",
    "x",
    "\u212a",  # KELVIN SIGN
    "\u017f",  # LATIN SMALL LETTER LONG S
    "\u0130",
    "\u0131",
    "é",
]


def texts_of(fragments: list[str], *, longest_run: int) -> st.SearchStrategy[str]:
    """Texts of up to 40 pieces: ``fragments`` and runs of up to ``longest_run`` of the patterns' characters."""
    return st.lists(
        st.one_of(
            st.sampled_from(fragments),
            st.text(
                alphabet="abcdefghijklmnopqrstuvwxyzABCDEFKSTXYZ0123456789_-.:=/+", min_size=1, max_size=longest_run
            ),
        ),
        max_size=40,
    ).map("".join)


texts = texts_of(FRAGMENTS, longest_run=45)


def _spans(pattern: SecretPattern, text: str, *, bounded: bool) -> list[tuple[int, int]]:
    found = pattern.finditer(text) if bounded else pattern.regex.finditer(text)
    return [m.span() for m in found]


def _unbounded(redactor: Redactor, text: str) -> Redacted:
    """:meth:`Redactor.redact` as it was before the bounds and the screen: every pattern searched from the text's
    start with its own regex (written out here, so no cache or shortcut of the module's can stand in for it)."""
    counts: Counter[str] = Counter()
    for pattern in redactor.patterns:
        pieces: list[str] = []
        last = 0
        for match in pattern.regex.finditer(text):
            start, end = pattern.span_of(match)
            if end <= start or start < last or "[REDACTED:" in text[start:end]:
                continue
            pieces += [text[last:start], f"[REDACTED:{pattern.kind}]"]
            last = end
            counts[pattern.kind] += 1
        if pieces:
            text = "".join(pieces) + text[last:]
    return Redacted(text, counts)


def test_the_same_patterns_without_bounds_do_not_share_the_builtins_screen() -> None:
    """The screen is cached per patterns *and* bounds (a pattern's bound is not part of its equality)."""
    unbounded = Redactor(tuple(SecretPattern(p.kind, p.regex) for p in BUILTIN_PATTERNS))
    assert unbounded._screen is None
    assert Redactor()._screen is not None
    assert unbounded._screen is None


def _samples() -> list[str]:
    payload = json.loads((ROOT / "examples/azure-devops/git.pullrequest.created.json").read_text("utf-8-sig"))
    base = json.dumps(payload)
    return [
        base,
        base[:4096],
        base.replace("_apis", "DB_PASSWORD=hunter2-and-more api_key: 'abcdefghijklmnop'"),
        "connect with postgres://app:s3cret@db:5432/x and Authorization: Bearer abcdefghijklmnopqrstuvwx",
        "x" * 3000 + " aws_secret_access_key = " + "A" * 40 + " " + "sk-" + "a" * 30,
        "ghp_" + "a" * 36 + " github_pat_" + "b" * 30 + " glpat-" + "c" * 25 + " AKIA" + "B" * 16,
        "eyJhbGciOiJIUzI1.eyJzdWIiOiIx.sig xoxb-1234567890ab sk_live_" + "a" * 20 + " AIza" + "d" * 35,
        "-----BEGIN RSA PRIVATE KEY-----\nabc\n-----END RSA PRIVATE KEY----- then Password\u212a=x",
        "My\u017fecret_token=abc TOKEN=def \u0130password=ghi",
        "whsec_" + "Zm9v" * 8 + "== npm_" + "n" * 36 + " https://hooks.slack.com/services/T0/B0/" + "s" * 24,
        "",
    ]


def test_every_builtin_pattern_has_a_bound() -> None:
    assert [p.kind for p in BUILTIN_PATTERNS if p.earliest is None] == []


def test_the_bounds_find_the_same_matches_on_samples() -> None:
    for text in _samples():
        for pattern in BUILTIN_PATTERNS:
            assert _spans(pattern, text, bounded=True) == _spans(pattern, text, bounded=False), (pattern.kind, text)
        assert Redactor().redact(text) == _unbounded(Redactor(), text)


def test_the_samples_do_hold_secrets() -> None:
    """The samples above exercise the matching paths, not only the no-match shortcut."""
    kinds: Counter[str] = Counter()
    for text in _samples():
        kinds.update(Redactor().redact(text).counts)
    assert {p.kind for p in BUILTIN_PATTERNS} <= set(kinds)


@settings(max_examples=600, deadline=None)
@given(texts)
def test_the_bounds_find_the_same_matches(text: str) -> None:
    for pattern in BUILTIN_PATTERNS:
        assert _spans(pattern, text, bounded=True) == _spans(pattern, text, bounded=False), pattern.kind
    assert Redactor().redact(text) == _unbounded(Redactor(), text)


def test_an_extra_pattern_has_no_bound() -> None:
    redactor = Redactor.build({"ticket": r"TICKET-\d+"})
    assert redactor.patterns[-1].earliest is None
    assert redactor.redact("see TICKET-42").text == "see [REDACTED:ticket]"


def test_the_screen_is_the_builtin_patterns_only() -> None:
    """A text with none of the bounds' pieces is given back as it is, without trying a pattern; a deployment's
    own pattern (no bound) turns the screen off, so it is always tried."""
    assert Redactor()._screen is not None
    assert Redactor().redact("nothing to see here: 42 files changed") == Redacted(
        "nothing to see here: 42 files changed"
    )
    extra = Redactor.build({"ticket": r"TICKET-\d+"})
    assert extra._screen is None
    assert extra.redact("TICKET-7 and password=hunter2").text == (
        "[REDACTED:ticket] and password=[REDACTED:secret_assignment]"
    )
