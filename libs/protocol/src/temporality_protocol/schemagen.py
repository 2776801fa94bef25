"""Generate ``schemas/`` from the protocol library (DC-4): the models are the source, the files are output.

    python -m temporality_protocol.schemagen schemas          # (re)write schemas/
    python -m temporality_protocol.schemagen schemas --check  # exit 1 and list stale files

What it writes (all deterministic: sorted keys, stable order, trailing newline):

* ``envelope.schema.json`` -- the CloudEvents 1.0 envelope with our extension attributes;
* ``events/<type>.schema.json`` -- JSON Schema 2020-12 of the ``data`` of every type in
  :data:`~temporality_protocol.events.EVENT_MODELS`;
* ``rpc/<name>.{request,reply}.schema.json`` -- the request and reply bodies of every request/reply
  subject ``temporality.rpc.<name>`` in :data:`temporality_protocol.catalog.RPCS` (the RPC table);
* ``asyncapi.yaml`` -- AsyncAPI 3.0.0: one channel per event subject, one per RPC subject (with its
  reply channel), and the operations of every service in
  :data:`temporality_protocol.catalog.SERVICES`: a send per type it
  declares in ``sends``, a receive per type its consumers' filter subjects match (one on the
  every-event channel for a ``temporality.events.>`` consumer), a reply per ``responders`` subject and
  a request per ``requests`` subject -- nothing the code does not do;
* ``README.md`` -- says the above and how to regenerate.

No third-party dependency beyond pydantic: the YAML is written by a small emitter whose output a
test parses back (PyYAML) and compares with the document it was made from.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from temporality_protocol.catalog import (
    ALL_EVENTS_SUBJECT,
    EVENTS_PREFIX,
    RPC_PREFIX,
    RPC_SUBJECTS,
    RPCS,
    SERVICES,
    RpcSpec,
    check_services,
    subject_for,
)
from temporality_protocol.envelope import _CORE, _EXT, CONTENT_TYPE, Envelope
from temporality_protocol.events import EVENT_MODELS, EventData
from temporality_protocol.version import PROTOCOL_VERSION

__all__ = ["build_asyncapi", "check", "main", "render", "rpc_file", "rpc_schema", "write"]

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
#: ``$id`` of every generated schema: ``urn:temporality:protocol:<version>:<kind>:<name>``.
ID_PREFIX = f"urn:temporality:protocol:{PROTOCOL_VERSION}"
ENVELOPE_FILE = "envelope.schema.json"
ASYNCAPI_FILE = "asyncapi.yaml"
README_FILE = "README.md"
#: Files under these folders that the generator no longer produces are stale (and deleted on write).
_OWNED_DIRS = ("events", "rpc")

_EXTENSION_DOCS: dict[str, str] = {
    "runid": "The run the event belongs to, when it belongs to one.",
    "correlationid": "The saga: the root run (or delivery) everything here descends from.",
    "causationid": "The id of the event that caused this one.",
    "actor": "Who caused it: `user:alice`, `service:trigger-gateway`, `agent:reviewer`.",
    "tenant": "Tenant / project scope.",
    "protocolversion": "The Temporality protocol version the writer spoke (mandatory, AP-10; PRO-3 negotiation).",
    "traceparent": (
        "CloudEvents Distributed Tracing extension: the W3C Trace Context `traceparent` "
        "(`00-<trace id>-<span id>-<flags>`) of the span that published the event; absent when tracing is off. "
        "A value that does not parse is ignored."
    ),
    "tracestate": "CloudEvents Distributed Tracing extension: the W3C `tracestate` that goes with `traceparent`.",
}
_CORE_DOCS: dict[str, str] = {
    "id": "Unique per fact; deterministic where the fact is (also the `Nats-Msg-Id`, so JetStream dedupes).",
    "source": "The producer, e.g. `/temporality/trigger-gateway`.",
    "type": "The event type, e.g. `run.requested`; `data` follows `events/<type>.schema.json`.",
    "specversion": "CloudEvents spec version.",
    "time": "When the fact happened (RFC 3339).",
    "subject": "What the event is about inside the source, when useful.",
    "datacontenttype": "Always JSON.",
}


# --------------------------------------------------------------------------- who sends / receives what
def _check_services() -> None:
    """The roles come from :data:`~temporality_protocol.catalog.SERVICES`; refuse to describe an
    inconsistent table (an event without a sender, a type without a model, a consumer owned by no
    service or by two, an unknown responder subject: :func:`~temporality_protocol.catalog.check_services`),
    and an RPC subject without its row in :data:`~temporality_protocol.catalog.RPCS` or outside
    ``temporality.rpc.``."""
    check_services()
    missing = sorted(set(RPC_SUBJECTS) - set(RPCS))
    if missing:
        raise ValueError(f"no RpcSpec (request/reply bodies) for {missing}: add them to catalog.RPCS")
    outside = sorted(s for s in RPCS if not s.startswith(f"{RPC_PREFIX}.") or RPCS[s].name.count(".") != 1)
    if outside:
        raise ValueError(f"RPC subjects must be {RPC_PREFIX}.<area>.<operation>: {outside}")


# --------------------------------------------------------------------------- JSON Schemas
def _strip_null(prop: dict[str, Any]) -> dict[str, Any]:
    """``anyOf [X, null]`` -> ``X``: absent attributes are omitted on the wire, never null."""
    options = prop.get("anyOf")
    if options is None:
        return prop
    kept = [o for o in options if o != {"type": "null"}]
    out = {k: v for k, v in prop.items() if k not in ("anyOf", "default")}
    if len(kept) == 1:
        out.update(kept[0])
    else:
        out["anyOf"] = kept
    return out


def envelope_schema() -> dict[str, Any]:
    base = Envelope.model_json_schema()
    props: dict[str, Any] = {}
    for name in (*_CORE, *_EXT):
        prop = _strip_null(base["properties"][name])
        prop.pop("title", None)
        prop["description"] = {**_CORE_DOCS, **_EXTENSION_DOCS}[name]
        props[name] = prop
    props["specversion"] = {"const": "1.0", "description": _CORE_DOCS["specversion"], "type": "string"}
    props["protocolversion"] = {
        "description": _EXTENSION_DOCS["protocolversion"],
        "examples": [PROTOCOL_VERSION],
        "pattern": r"^[0-9]+\.[0-9]+$",
        "type": "string",
    }
    props["data"] = {"description": "The event's data; its schema is `events/<type>.schema.json`.", "type": "object"}
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "$id": f"{ID_PREFIX}:envelope",
        "title": "Temporality CloudEvent",
        "description": (
            "A CloudEvents 1.0 event in structured JSON mode (`application/cloudevents+json`) with Temporality's "
            "extension attributes. Published on NATS subject `temporality.events.<type>` with `Nats-Msg-Id` = `id`. "
            "Readers ignore attributes they do not know (PRO-3)."
        ),
        "type": "object",
        "properties": props,
        "required": sorted({*base["required"], "specversion", "protocolversion"}),
    }


def _describe(model: type[BaseModel], lead: str) -> str:
    own = model.__doc__
    return f"{lead}\n\n{' '.join(own.split())}" if own else lead


def event_schema(event_type: str, model: type[EventData]) -> dict[str, Any]:
    subject = subject_for(event_type)
    schema = model.model_json_schema()
    schema.update(
        {
            "$schema": JSON_SCHEMA_DIALECT,
            "$id": f"{ID_PREFIX}:event:{event_type}",
            "title": model.__name__,
            "description": _describe(
                model, f"`data` of the `{event_type}` CloudEvent, published on NATS subject `{subject}`."
            ),
            "x-event-type": event_type,
            "x-nats-subject": subject,
        }
    )
    return schema


def rpc_schema(spec: RpcSpec, kind: str) -> dict[str, Any]:
    """The JSON Schema of the ``request`` or ``reply`` body of one RPC subject."""
    model = spec.request if kind == "request" else spec.reply
    schema = model.model_json_schema()
    lead = f"The {kind} body (JSON) on NATS subject `{spec.address}` (answered by {spec.responder}). {spec.description}"
    schema.update(
        {
            "$schema": JSON_SCHEMA_DIALECT,
            "$id": f"{ID_PREFIX}:rpc:{spec.name}.{kind}",
            "title": model.__name__,
            "description": _describe(model, lead),
            "x-nats-subject": spec.address,
            "x-rpc-responder": spec.responder,
            "x-rpc-external": spec.external,
        }
    )
    return schema


def rpc_file(spec: RpcSpec, kind: str) -> str:
    """``rpc/<name>.<kind>.schema.json`` (``kind``: ``request`` or ``reply``)."""
    return f"rpc/{spec.name}.{kind}.schema.json"


def _event_file(event_type: str) -> str:
    return f"events/{event_type}.schema.json"


# --------------------------------------------------------------------------- AsyncAPI
def _ident(text: str) -> str:
    """``run.tool_called`` -> ``runToolCalled``; ``trigger-gateway`` -> ``triggerGateway``."""
    head, *rest = re.split(r"[._\-]", text)
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


_ALL_EVENTS_CHANNEL = "allEvents"


def _rpc_ident(spec: RpcSpec) -> str:
    """``temporality.rpc.agents.*.register`` -> ``agentsRegister`` (its channel; ``...Reply``: the reply's)."""
    return _ident(spec.name)


def _upper(ident: str) -> str:
    return ident[:1].upper() + ident[1:]


def build_asyncapi() -> dict[str, Any]:
    _check_services()
    types = sorted(EVENT_MODELS)
    messages: dict[str, Any] = {}
    channels: dict[str, Any] = {}
    for event_type in types:
        ident = _ident(event_type)
        model = EVENT_MODELS[event_type]
        messages[ident] = {
            "name": event_type,
            "title": model.__name__,
            "summary": f"The `{event_type}` CloudEvent.",
            "contentType": CONTENT_TYPE,
            "headers": {
                "type": "object",
                "properties": {
                    "Nats-Msg-Id": {"type": "string", "description": "The CloudEvent `id` (JetStream dedupes on it)."}
                },
            },
            "payload": {
                "allOf": [
                    {"$ref": f"./{ENVELOPE_FILE}"},
                    {
                        "type": "object",
                        "properties": {
                            "type": {"const": event_type},
                            "data": {"$ref": f"./{_event_file(event_type)}"},
                        },
                    },
                ]
            },
        }
        channels[ident] = {
            "address": subject_for(event_type),
            "title": event_type,
            "messages": {ident: {"$ref": f"#/components/messages/{ident}"}},
        }
    channels[_ALL_EVENTS_CHANNEL] = {
        "address": ALL_EVENTS_SUBJECT,
        "title": "every event",
        "description": "The whole journal (stream TEMPORALITY_EVENTS), for subscribers of every event type.",
        "messages": {ident: {"$ref": f"#/components/messages/{ident}"} for ident in map(_ident, types)},
    }
    for rpc in RPCS.values():
        ident = _rpc_ident(rpc)
        callers = "any agent outside the services, and services" if rpc.external else "services"
        for kind in ("request", "reply"):
            body = rpc.request if kind == "request" else rpc.reply
            messages[f"{ident}{_upper(kind)}"] = {
                "name": f"{rpc.name}.{kind}",
                "title": body.__name__,
                "contentType": "application/json",
                "payload": {"$ref": f"./{rpc_file(rpc, kind)}"},
            }
        channels[ident] = {
            "address": rpc.address,
            "title": rpc.name,
            "description": (
                f"Request/reply (core NATS): {rpc.description} Answered by {rpc.responder} (queue group "
                f"`{rpc.responder}`); called by {callers}."
            ),
            "messages": {f"{ident}Request": {"$ref": f"#/components/messages/{ident}Request"}},
        }
        if rpc.per_agent:
            channels[ident]["parameters"] = {
                "agent_id": {"description": "The sending agent's id (its NATS user may publish on its own only)."}
            }
        channels[f"{ident}Reply"] = {
            "address": None,
            "title": f"{rpc.name} reply",
            "description": "The requester's reply inbox (NATS reply subject), chosen per request.",
            "messages": {f"{ident}Reply": {"$ref": f"#/components/messages/{ident}Reply"}},
        }

    operations: dict[str, Any] = {}

    def op(service: str, action: str, channel: str, message_ids: Sequence[str]) -> dict[str, Any]:
        return {
            "action": action,
            "channel": {"$ref": f"#/channels/{channel}"},
            "messages": [{"$ref": f"#/channels/{channel}/messages/{m}"} for m in message_ids],
            "tags": [{"name": service}],
        }

    def rpc_op(service: str, action: str, spec: RpcSpec) -> dict[str, Any]:
        ident = _rpc_ident(spec)
        operation = op(service, action, ident, [f"{ident}Request"])
        operation["reply"] = {
            "channel": {"$ref": f"#/channels/{ident}Reply"},
            "messages": [{"$ref": f"#/channels/{ident}Reply/messages/{ident}Reply"}],
        }
        return operation

    for spec in SERVICES.values():
        svc = _ident(spec.name)
        for event_type in spec.sends:
            ident = _ident(event_type)
            operations[f"{svc}Send{ident[:1].upper()}{ident[1:]}"] = op(spec.name, "send", ident, [ident])
        if spec.receives_all:
            operations[f"{svc}ReceiveAllEvents"] = op(
                spec.name, "receive", _ALL_EVENTS_CHANNEL, [_ident(t) for t in types]
            )
        else:
            for event_type in spec.receives:
                ident = _ident(event_type)
                operations[f"{svc}Receive{ident[:1].upper()}{ident[1:]}"] = op(spec.name, "receive", ident, [ident])
        for subject in spec.requests:
            rpc = RPCS[subject]
            operations[f"{svc}Request{_upper(_rpc_ident(rpc))}"] = rpc_op(spec.name, "send", rpc)
        for subject in spec.responders:
            rpc = RPCS[subject]
            operations[f"{svc}Reply{_upper(_rpc_ident(rpc))}"] = rpc_op(spec.name, "receive", rpc)

    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "Temporality",
            "version": PROTOCOL_VERSION,
            "description": (
                "Temporality's bus: CloudEvents 1.0 (structured JSON) on NATS JetStream subjects "
                f"`{EVENTS_PREFIX}.<type>`, plus core-NATS request/reply. `info.version` is the protocol version "
                "(every event's `protocolversion`). With tracing on, every event carries the CloudEvents Distributed "
                "Tracing extension (`traceparent`, `tracestate`: W3C Trace Context) of the span that published it, and "
                "each consumer handles it in a child span. Generated by `python -m temporality_protocol.schemagen schemas`; "
                "do not edit."
            ),
            "tags": [{"name": spec.name, "description": spec.description} for spec in SERVICES.values()],
        },
        "defaultContentType": CONTENT_TYPE,
        "servers": {
            "nats": {
                "host": "{host}:4222",
                "protocol": "nats",
                "description": "Placeholder: the NATS server (>= 2.12, JetStream enabled) of your deployment.",
                "variables": {"host": {"default": "localhost"}},
            }
        },
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages},
    }


# --------------------------------------------------------------------------- serialisation
def _json(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


_PLAIN = re.compile(r"^[A-Za-z_/$][A-Za-z0-9_./$#+\-]*$")
# YAML 1.1 (PyYAML) resolves these plain scalars to booleans / null: quote them.
_RESERVED = {"y", "yes", "n", "no", "true", "false", "on", "off", "null"}


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, str):
        if _PLAIN.match(value) and value.lower() not in _RESERVED and not value.endswith(("-", ".")):
            return value
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a YAML double-quoted scalar
    raise TypeError(f"cannot write {type(value).__name__} as YAML")


def _yaml_lines(value: Any, indent: int) -> list[str]:
    pad = "  " * indent
    lines: list[str] = []
    if isinstance(value, Mapping):
        for key in sorted(value):
            item = value[key]
            head = f"{pad}{_scalar(str(key))}:"
            if isinstance(item, Mapping | list) and item:
                lines.append(head)
                lines.extend(_yaml_lines(item, indent + 1))
            else:
                lines.append(f"{head} {_inline(item)}")
    else:
        for item in value:
            if isinstance(item, Mapping | list) and item:
                nested = _yaml_lines(item, indent + 1)
                lines.append(f"{pad}- {nested[0].lstrip()}")
                lines.extend(nested[1:])
            else:
                lines.append(f"{pad}- {_inline(item)}")
    return lines


def _inline(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return _scalar(value)


def _yaml(doc: Mapping[str, Any]) -> str:
    header = "# Generated by `python -m temporality_protocol.schemagen schemas` (make schemas). Do not edit.\n"
    return header + "\n".join(_yaml_lines(doc, 0)) + "\n"


_README = """\
# schemas/ (generated — do not edit)

Generated from the protocol library (`libs/protocol`, DC-4) by

    make schemas        # = python -m temporality_protocol.schemagen schemas

and checked for staleness by `libs/protocol/tests/test_schemas.py`
(`python -m temporality_protocol.schemagen schemas --check` exits 1 and lists stale files).

| file | what |
|---|---|
| `envelope.schema.json` | the CloudEvents 1.0 envelope with the extension attributes {extensions} |
| `events/<type>.schema.json` | JSON Schema 2020-12 of the `data` of each event type; subject `temporality.events.<type>` |
| `rpc/<name>.{{request,reply}}.schema.json` | request and reply bodies on `temporality.rpc.<name>`: {rpc} |
| `asyncapi.yaml` | AsyncAPI 3.0.0: channels, messages and each service's send/receive operations |

Protocol version: {version}. Event types: {count}.
"""


def render() -> dict[str, str]:
    """Every generated file: path relative to ``schemas/`` -> content."""
    files = {
        ENVELOPE_FILE: _json(envelope_schema()),
        ASYNCAPI_FILE: _yaml(build_asyncapi()),
        README_FILE: _README.format(
            extensions=", ".join(f"`{e}`" for e in _EXT),
            rpc=", ".join(f"`{spec.name}`" for spec in RPCS.values()),
            version=PROTOCOL_VERSION,
            count=len(EVENT_MODELS),
        ),
    }
    for event_type, model in sorted(EVENT_MODELS.items()):
        files[_event_file(event_type)] = _json(event_schema(event_type, model))
    for spec in RPCS.values():
        for kind in ("request", "reply"):
            files[rpc_file(spec, kind)] = _json(rpc_schema(spec, kind))
    return dict(sorted(files.items()))


def _owned(root: Path) -> set[str]:
    """Files in ``root`` the generator is responsible for (so extra ones are stale)."""
    found = {p.relative_to(root).as_posix() for d in _OWNED_DIRS for p in (root / d).glob("*.schema.json")}
    return found | {name for name in (ENVELOPE_FILE, ASYNCAPI_FILE, README_FILE) if (root / name).exists()}


def check(root: Path) -> list[str]:
    """Paths (relative to ``root``) that are missing, different, or no longer generated."""
    expected = render()
    stale = [
        path
        for path, content in expected.items()
        if not (root / path).is_file() or (root / path).read_bytes() != content.encode("utf-8")
    ]
    return sorted({*stale, *(_owned(root) - set(expected))})


def write(root: Path) -> list[str]:
    """(Re)write ``root``; return the paths that changed. Files no longer generated are removed."""
    changed = check(root)
    expected = render()
    for path in changed:
        target = root / path
        if path in expected:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(expected[path].encode("utf-8"))
        else:
            target.unlink()
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m temporality_protocol.schemagen", description="Generate schemas/ from the protocol library."
    )
    parser.add_argument("root", type=Path, nargs="?", default=Path("schemas"), help="output folder (schemas)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if any file is stale")
    args = parser.parse_args(argv)
    root: Path = args.root
    if args.check:
        stale = check(root)
        if stale:
            listing = "".join(f"  {root / p}\n" for p in stale)
            sys.stderr.write(f"{root}/ is stale ({len(stale)} files); run `make schemas`:\n{listing}")
            return 1
        sys.stdout.write(f"{root}/ is up to date ({len(render())} files)\n")
        return 0
    changed = write(root)
    sys.stdout.write(f"{root}/: {len(changed)} of {len(render())} files updated\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
