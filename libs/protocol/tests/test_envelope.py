"""The envelope round-trips through the official cloudevents SDK; bad bytes fail clearly."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime

import pytest
from cloudevents.core.formats.json import JSONFormat
from pydantic_core import to_json

from temporality_protocol import (
    EVENT_MODELS,
    HumanAnswered,
    InvalidEnvelope,
    NormalizedEvent,
    OptionAnswer,
    RunRequested,
    TextAnswer,
    UnknownEventType,
    decode,
    encode,
    encode_event,
    make_event,
)
from temporality_protocol.events import Actor, LaunchSource, SourceLink, TimeoutPolicy


def _answered() -> HumanAnswered:
    return HumanAnswered(
        request_id="hr-1", run_id="run-1", recipient="user:alice", responder="user:alice",
        answer=OptionAnswer(option_id="keep-v1", label="Keep v1"), channel="web", waited_s=12.5,
    )  # fmt: skip


def test_sdk_decodes_our_events_with_extensions() -> None:
    event = make_event(
        _answered(), source="/temporality/human-interaction", id="evt-1", run_id="run-1",
        causation_id="evt-0", actor="user:alice", tenant="fabrikam",
    )  # fmt: skip
    ce = JSONFormat().read(None, encode(event))
    assert ce.get_id() == "evt-1"
    assert ce.get_type() == "human.answered"
    assert ce.get_specversion() == "1.0"
    assert ce.get_extension("runid") == "run-1"
    assert ce.get_extension("correlationid") == "run-1"
    assert ce.get_extension("causationid") == "evt-0"
    assert ce.get_extension("actor") == "user:alice"
    assert ce.get_extension("tenant") == "fabrikam"
    assert ce.get_extension("protocolversion") == "1.0"
    data = ce.get_data()
    assert isinstance(data, dict)
    assert data["answer"] == {"type": "option", "option_id": "keep-v1", "label": "Keep v1"}


def test_we_read_what_the_sdk_writes() -> None:
    """The other direction: an event written by the official SDK (its own spacing, escaping) decodes the same."""
    from cloudevents.core.v1.event import CloudEvent

    event = make_event(
        _answered(), source="/temporality/human-interaction", id="evt-1", run_id="run-1",
        actor="user:alice", tenant="fabrikam 🌎",
    )  # fmt: skip
    attributes = {k: v for k, v in event.model_dump().items() if v is not None and k != "data"}
    written = JSONFormat().write(CloudEvent(attributes, event.data))
    assert written != encode(event)  # different bytes (spacing, \u escapes) ...
    assert decode(written) == event  # ... the same event


def test_non_ascii_round_trips_as_utf8_the_sdk_reads() -> None:
    answer = _answered().model_copy(update={"answer": TextAnswer(value="Hello, 🌎! «да»")})
    event = make_event(answer, source="/x")
    raw = encode(event)
    assert "🌎".encode() in raw
    assert decode(raw).payload() == answer
    assert JSONFormat().read(None, raw).get_data()["answer"]["value"] == "Hello, 🌎! «да»"


def test_round_trip_and_typed_payload() -> None:
    event = make_event(_answered(), source="/x", run_id="run-1")
    back = decode(encode(event))
    assert back == event
    payload = back.payload()
    assert isinstance(payload, HumanAnswered)
    assert isinstance(payload.answer, OptionAnswer)
    assert back.nats_subject == "temporality.events.human.answered"


def test_text_answers_are_discriminated() -> None:
    raw = _answered().model_dump(mode="json") | {"answer": {"type": "text", "value": "ship v2"}}
    assert isinstance(HumanAnswered.model_validate(raw).answer, TextAnswer)


def test_unknown_fields_are_ignored_on_read() -> None:
    event = make_event(_answered(), source="/x")
    doc = json.loads(encode(event))
    doc["data"]["added_in_v1_1"] = {"anything": True}
    doc["futureext"] = "x"
    assert decode(json.dumps(doc).encode()).payload() == _answered()


_EVENT = (
    b'{"id": "1", "source": "/x", "type": "run.failed", "specversion": "1.0", "protocolversion": "1.0",'
    b' "time": "2026-12-01T12:00:00Z", "data": {}}'
)


def test_the_invalid_cases_below_start_from_a_valid_event() -> None:
    assert decode(_EVENT).type == "run.failed"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{not json", "not a CloudEvent"),
        (
            b'{"id": "1", "source": "/x", "type": "run.failed", "specversion": "1.0", "data": {}}',
            "protocolversion",
        ),
        (
            b'{"id": "1", "type": "run.failed", "specversion": "1.0", "protocolversion": "1.0", "data": {}}',
            "source",
        ),
        (
            b'{"id": "1", "source": "/x", "type": "t", "specversion": "1.0", "protocolversion": "1.0", "data": 3}',
            "object",
        ),
        (b'["a", "list"]', "JSON object"),
        (b"\xff\xfe", "not a CloudEvent"),
        (_EVENT.replace(b'"1.0", "protocolversion"', b'"0.3", "protocolversion"'), "specversion must be 1.0"),
        (_EVENT.replace(b'"data": {}', b'"data_base64": "AAAA"'), "data_base64"),
        (_EVENT.replace(b'"data": {}', b'"data": {"x": NaN}'), "not a CloudEvent"),
        (_EVENT.replace(b'"id": "1"', b'"id": ""'), "id"),
        (_EVENT.replace(b"12:00:00Z", b"12:00:00"), "timezone"),
        (_EVENT.replace(b"2026-12-01T12:00:00Z", b"yesterday"), "time"),
    ],
)
def test_invalid_bytes_are_refused(raw: bytes, message: str) -> None:
    with pytest.raises(InvalidEnvelope, match=message):
        decode(raw)


def test_payload_validation_errors_are_protocol_errors() -> None:
    event = make_event(_answered(), source="/x").model_copy(update={"data": {"run_id": 1}})
    with pytest.raises(InvalidEnvelope, match="invalid data"):
        event.payload()
    with pytest.raises(UnknownEventType):
        make_event(_answered(), source="/x").model_copy(update={"type": "no.such"}).payload()


def test_every_event_type_is_registered_once_and_named_canonically() -> None:
    assert len(EVENT_MODELS) == len({m.EVENT_TYPE for m in EVENT_MODELS.values()})
    seed = {"trigger.received", "trigger.accepted", "trigger.rejected", "run.requested", "run.created",
            "run.started", "run.resumed", "run.completed", "run.failed", "run.cancelled", "human.requested",
            "human.answered", "human.expired", "bus.dead_lettered"}  # fmt: skip
    assert seed <= set(EVENT_MODELS)


def test_timeout_policy_default_needs_an_option() -> None:
    with pytest.raises(ValueError, match="default_option"):
        TimeoutPolicy(action="default")
    assert TimeoutPolicy(action="default", default_option="keep-v1").default_option == "keep-v1"


def test_make_event_defaults() -> None:
    req = RunRequested(run_id="run-1", agent="reviewer", title="t", launch=LaunchSource(kind="webhook"))
    event = make_event(req, source="/x", run_id="run-1")
    assert event.id.startswith("evt-")
    assert event.time.tzinfo is not None
    assert event.time <= datetime.now(UTC)


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_the_distributed_tracing_extension_round_trips_and_the_sdk_reads_it() -> None:
    event = make_event(
        _answered(), source="/temporality/human-interaction", id="evt-1", run_id="run-1",
        traceparent=TRACEPARENT, tracestate="vendor=abc",
    )  # fmt: skip
    ce = JSONFormat().read(None, encode(event))
    assert ce.get_extension("traceparent") == TRACEPARENT
    assert ce.get_extension("tracestate") == "vendor=abc"
    assert decode(encode(event)) == event


def test_without_a_trace_context_no_tracing_attribute_is_written() -> None:
    event = make_event(_answered(), source="/t", id="evt-1", tracestate="vendor=abc")  # no traceparent: no tracestate
    doc = json.loads(encode(event))
    assert "traceparent" not in doc
    assert "tracestate" not in doc


def test_a_malformed_traceparent_does_not_make_the_event_unreadable() -> None:
    doc = json.loads(encode(make_event(_answered(), source="/t", id="evt-1")))
    doc["traceparent"] = "not-a-traceparent"
    assert decode(json.dumps(doc).encode()).traceparent == "not-a-traceparent"  # the bus ignores it (no parent)


def _requested() -> RunRequested:
    event = NormalizedEvent(
        id="ev-1", type="azure_devops.git.pullrequest.created", source="https://dev.azure.com/o",
        timestamp=datetime(2026, 12, 5, 22, 0, 0, 123456, tzinfo=UTC), actor=Actor(id="jamal@x", display_name="Jämal"),
        tenant="fabrikam", payload={}, metadata={"event_type": "git.pullrequest.created"},
        source_link=SourceLink(href="https://dev.azure.com/o/p/_git/r/pullrequest/1", label="PR #1"),
    )  # fmt: skip
    return RunRequested(
        run_id="run-1", agent="reviewer", title="Review PR #1: ünïcode \u2028 \"quoted\"",
        launch=LaunchSource(kind="webhook", trigger_id="t", delivery_id="dlv-1"), event=event,
        input={"n": 1.5, "big": 10**30, "list": [None, True, "x"], "nested": {"k": "v"}},
    )  # fmt: skip


@pytest.mark.parametrize("data", [_answered(), _requested()], ids=["human.answered", "run.requested"])
@pytest.mark.parametrize("with_trace", [False, True], ids=["untraced", "traced"])
def test_an_encoded_event_is_byte_for_byte_what_make_event_then_encode_write(data: object, with_trace: bool) -> None:
    """encode_event (the data encoded once from its model) writes what make_event + encode write."""
    at = datetime.now(UTC)
    attributes = {"source": "/t", "id": "evt-1", "run_id": "run-1", "causation_id": "evt-0", "actor": "service:x"}
    for extra in ({}, {"tenant": "fabrikam", "correlation_id": "saga-1", "subject": "s"}):
        made = make_event(data, time=at, **attributes, **extra)  # type: ignore[arg-type]
        encoded = encode_event(data, time=at, **attributes, **extra)  # type: ignore[arg-type]
        assert (encoded.id, encoded.type, encoded.source, encoded.runid) == (
            made.id,
            made.type,
            made.source,
            made.runid,
        )
        assert encoded.nats_subject == made.nats_subject
        if with_trace:
            traced = made.model_copy(update={"traceparent": TRACEPARENT, "tracestate": "vendor=abc"})
            assert encoded.encoded(TRACEPARENT, "vendor=abc") == encode(traced)
        else:
            assert encoded.encoded() == encode(made)
            assert encoded.envelope() == made


def test_an_encoded_event_needs_an_id_and_a_source() -> None:
    for attributes in ({"source": "/t", "id": ""}, {"source": "", "id": "evt-1"}):
        with pytest.raises(ValueError, match="non-empty"):
            encode_event(_answered(), **attributes)


def test_an_encoded_event_needs_an_aware_time() -> None:
    """The Envelope refuses a naive time; an event encoded with one would be refused by every consumer's decode."""
    with pytest.raises(ValueError, match="timezone-aware"):
        encode_event(_answered(), source="/t", id="evt-1", time=datetime(2026, 1, 1))  # noqa: DTZ001


def _encoded_before(data: HumanAnswered | RunRequested, *, time: datetime, **given: str | None) -> bytes:
    """What encode_event + encoded wrote before they were rewritten for speed (the attributes through a loop
    over pairs, the wire form by concatenation), kept here as the reference of the differential test below."""
    attributes: dict[str, object] = {
        "id": given["id"],
        "source": given["source"],
        "type": data.EVENT_TYPE,
        "specversion": "1.0",
        "time": time,
    }
    if given.get("subject") is not None:
        attributes["subject"] = given["subject"]
    attributes["datacontenttype"] = "application/json"
    for name, value in (
        ("runid", given.get("run_id")),
        ("correlationid", given.get("correlation_id") or given.get("run_id")),
        ("causationid", given.get("causation_id")),
        ("actor", given.get("actor")),
        ("tenant", given.get("tenant")),
    ):
        if value is not None:
            attributes[name] = value
    attributes["protocolversion"] = "1.0"
    return to_json(attributes)[:-1] + b',"data":' + data.__pydantic_serializer__.to_json(data) + b"}"


@pytest.mark.parametrize("data", [_answered(), _requested()], ids=["human.answered", "run.requested"])
def test_an_encoded_event_is_byte_for_byte_what_the_code_before_its_rewrite_wrote(
    data: HumanAnswered | RunRequested,
) -> None:
    """Differential: every combination of the optional attributes absent, empty or set (and a time in another
    zone) encodes to the same bytes as the implementation it replaced; the ids read back unchanged."""
    optional = ("run_id", "correlation_id", "causation_id", "actor", "tenant", "subject")
    values: tuple[str | None, ...] = (None, "", 'x-1 \u00fcn\u00efcode "q"')
    times = (datetime(2026, 12, 6, 7, 0, 0, 123456, tzinfo=UTC), datetime.fromisoformat("2026-12-06T08:00:00+01:00"))
    for time in times:
        for chosen in itertools.product(values, repeat=len(optional)):
            given: dict[str, str | None] = {
                "source": "/temporality/t",
                "id": "evt-1",
                **dict(zip(optional, chosen, strict=True)),
            }
            encoded = encode_event(data, time=time, **given)  # type: ignore[arg-type]
            assert encoded.encoded() == _encoded_before(data, time=time, **given), given
            assert (encoded.id, encoded.type, encoded.source, encoded.runid) == (
                "evt-1",
                data.EVENT_TYPE,
                "/temporality/t",
                given["run_id"],
            )
    with pytest.raises(AttributeError):
        encoded.id = "evt-2"  # type: ignore[misc]  # immutable, as the frozen dataclass it was
