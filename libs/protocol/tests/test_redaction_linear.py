"""The three patterns rewritten so their cost grows linearly with the text (``secret_assignment``: tried only
where a key run starts; ``jwt``: from the first "eyJ" of a run only; ``url_credentials``: a scheme of at most 32
characters) redact what the patterns they replace redacted, and texts that took the old ones seconds to minutes
are redacted whole."""

from __future__ import annotations

import re
from dataclasses import replace

from hypothesis import assume, given, settings
from test_redaction_bounds import FRAGMENTS, texts_of

from temporality_protocol.redaction import _NOT_MARKER, _SECRET_KEY_WORDS, BUILTIN_PATTERNS, Redactor

#: The patterns as they were before (written out here: the module's own cannot stand in for them).
BEFORE = {
    "jwt": re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"),
    "url_credentials": re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]+:" + _NOT_MARKER + r"(?P<secret>[^\s@/]+)@"),
    "secret_assignment": re.compile(
        r"(?i)\b[A-Za-z0-9_.-]*("
        + _SECRET_KEY_WORDS
        + r")[A-Za-z0-9_.-]*[\"']?\s*[:=]\s*[\"']?"
        + _NOT_MARKER
        + r"(?P<secret>[^\s\"',;&<>]+)"
    ),
}
OLD = Redactor(tuple(replace(p, regex=BEFORE[p.kind]) if p.kind in BEFORE else p for p in BUILTIN_PATTERNS))

#: ASCII only: a key run right after a non-ASCII letter is found now and was not before (no word boundary there).
ASCII_FRAGMENTS = [f for f in FRAGMENTS if f.isascii()]
texts = texts_of(ASCII_FRAGMENTS, longest_run=20)


#: A URL scheme longer than the rewritten ``url_credentials`` takes (32 characters, the documented bound): there the
#: old pattern found the credentials and the new one may not, by design (``passwordpassword…password://0:0@``, a
#: 40-character scheme, is a ``secret_assignment`` now), so such texts are not compared.
LONG_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{32,}://")


@settings(max_examples=1500, deadline=None)
@given(texts)
def test_the_rewritten_patterns_redact_what_the_old_ones_did(text: str) -> None:
    assume(LONG_SCHEME.search(text) is None)
    assert Redactor().redact(text) == OLD.redact(text)


def test_a_scheme_over_32_characters_is_the_one_documented_difference() -> None:
    text = "password" * 5 + "://0:0@"
    assert OLD.redact(text).text == "password" * 5 + "://0:[REDACTED:url_credentials]@"
    assert "url_credentials" not in Redactor().redact(text).text


def test_what_each_finds_on_written_cases() -> None:
    cases = {
        "DB_PASSWORD=hunter2": "DB_PASSWORD=[REDACTED:secret_assignment]",
        "x.api-key: 'abc'": "x.api-key: '[REDACTED:secret_assignment]'",
        "my.secret.token=abc;": "my.secret.token=[REDACTED:secret_assignment];",
        "1.2.3.password = v": "1.2.3.password = [REDACTED:secret_assignment]",
        "see postgres://app:s3cret@db:5432/x": "see postgres://app:[REDACTED:url_credentials]@db:5432/x",
        "1.http://u:p@h": "1.http://u:[REDACTED:url_credentials]@h",
        "a.key=v": "a.key=v",  # ("key" alone names no secret)
        "t=eyJhbGciOi.eyJzdWIiOi.sig end": "t=[REDACTED:jwt] end",
        "x-eyJhbGciOi.eyJzdWIiOi.sig": "x-[REDACTED:jwt]",
        "eyJa-eyJhbGciOi.eyJzdWIiOi.sig": "[REDACTED:jwt]",
        "xeyJhbGciOi.eyJzdWIiOi.sig": "xeyJhbGciOi.eyJzdWIiOi.sig",  # (no word start)
    }
    for text, redacted in cases.items():
        assert Redactor().redact(text).text == redacted
        assert OLD.redact(text).text == redacted


def test_a_key_right_after_a_non_ascii_letter_is_now_found() -> None:
    assert Redactor().redact("épassword=hunter2").text == "épassword=[REDACTED:secret_assignment]"
    assert OLD.redact("épassword=hunter2").text == "épassword=hunter2"


def test_a_scheme_longer_than_32_characters_is_read_from_its_last_word_start() -> None:
    text = "x-" * 40 + "postgres://app:s3cret@db"
    assert Redactor().redact(text).text.endswith("postgres://app:[REDACTED:url_credentials]@db")
    one_word = "a" * 40 + "://app:s3cret@db"  # no scheme is that long: not a URL's credentials any more
    assert Redactor().redact(one_word).text == one_word
    assert OLD.redact(one_word).text != one_word


def test_texts_that_took_the_old_patterns_minutes_are_redacted_whole() -> None:
    """Each of these is ~100 KB; the old patterns' work grew with the square of the run (8 KB of the first took
    ~9 s of CPU, so this one would take ~20 minutes): the suite's timeout stops a regression here."""
    dotted = "a." * 50_000
    assert Redactor().redact(dotted + "password=hunter2").text == dotted + "password=[REDACTED:secret_assignment]"
    assert Redactor().redact(dotted + "://u:p@h").text == dotted + "://u:[REDACTED:url_credentials]@h"
    assert Redactor().redact(dotted).text == dotted
    jwts = "eyJ-" * 25_000
    assert Redactor().redact(jwts).text == jwts
    assert Redactor().redact(jwts + "eyJhbGciOi.eyJzdWIiOi.sig").text == "[REDACTED:jwt]"
