"""What one model reply or one tool result may put into a run's conversation (docs/agents.md, "How big a run's
conversation may grow").

A run's conversation lives in its checkpoint, one KV value on the bus, and everything the model sends is kept there,
on its run record (a kept reply) and in its events: a NATS message is at most the server's ``max_payload`` (1 MB by
default). So every item that enters the conversation is bounded here, before it is kept anywhere:

* a tool call's **name** longer than :data:`MAX_TOOL_NAME_CHARS` is a malformed call (not made; the model is told;
  it counts against ``limits.max_malformed_tool_calls``), the name kept as its first :data:`KEPT_NAME_CHARS`;
* a tool call's **arguments** over :data:`MAX_ARGUMENTS_BYTES` (their JSON text) make it a malformed call too, the
  arguments kept as a short head of their text;
* the **text beside tool calls** over :data:`MAX_ITEM_BYTES` is cut, with a marker saying so;
* a **tool's result** over :data:`MAX_ITEM_BYTES` is cut, with a marker telling the model how much was dropped;
* the **final reply** (the run's result) over :func:`result_limit` -- a quarter of the server's ``max_payload``
  (the rest of the run record keeps the other three quarters), at most :data:`MAX_RESULT_BYTES` -- is cut, with a
  marker saying so (the run completes; ``run.completed`` carries at most its first 16,384 characters, as before).

What still does not fit -- a conversation grown past ``max_payload`` over many turns -- fails the run with reason
``conversation_too_large`` (:mod:`.engine`), naming both sizes, instead of dead-lettering its message; so does a run
record that would not fit even so.
"""

from __future__ import annotations

import json

from temporality_run_executor.providers.base import AssistantTurn
from temporality_run_executor.records import ToolCall

__all__ = [
    "KEPT_NAME_CHARS",
    "MAX_ARGUMENTS_BYTES",
    "MAX_ITEM_BYTES",
    "MAX_RESULT_BYTES",
    "MAX_TOOL_NAME_CHARS",
    "bounded_reply",
    "bounded_result",
    "bounded_tool_result",
    "cut",
    "result_limit",
]

#: The longest tool name a call may give (a card's tools are named far shorter: OpenAI's limit is 64).
MAX_TOOL_NAME_CHARS = 256
#: What is kept of a longer name (in the conversation, the events and the logs).
KEPT_NAME_CHARS = 64
#: A tool call's arguments, as JSON text (UTF-8 bytes).
MAX_ARGUMENTS_BYTES = 64 * 1024
#: A tool's result, or the text a reply gives beside its tool calls (UTF-8 bytes).
MAX_ITEM_BYTES = 64 * 1024
#: The run's result: its final reply (UTF-8 bytes), at most; less on a server with a smaller ``max_payload``
#: (:func:`result_limit`).
MAX_RESULT_BYTES = 256 * 1024
#: How much of oversized arguments is kept in the conversation (so the model sees what it sent).
_ARGUMENTS_HEAD = 512


def _size(text: str, limit: int) -> int:
    """``text``'s UTF-8 length; 0 when it is certainly within ``limit`` (no encoding needed for that)."""
    if len(text) * 4 <= limit:
        return 0
    return len(text.encode("utf-8"))


def cut(text: str, limit: int) -> str:
    """The longest head of ``text`` whose UTF-8 encoding is at most ``limit`` bytes (never half a character)."""
    return text.encode("utf-8")[:limit].decode("utf-8", errors="ignore")


def bounded_tool_result(content: str) -> str:
    """A tool's result as the conversation keeps it: cut to :data:`MAX_ITEM_BYTES`, the model told."""
    size = _size(content, MAX_ITEM_BYTES)
    if size <= MAX_ITEM_BYTES:
        return content
    marker = (
        f"\n[cut by Temporality: this result was {size} bytes; only its first {MAX_ITEM_BYTES} are kept. "
        "If you need the rest, ask the tool for less at a time]"
    )
    return cut(content, MAX_ITEM_BYTES - len(marker.encode("utf-8"))) + marker


def result_limit(max_payload: int) -> int:
    """The most a run's result may be on a bus whose messages carry at most ``max_payload`` bytes: a quarter of it
    (the run record holding the result also holds its usage, its lease, its error and more, and the result is JSON
    text there, where a character may take more bytes: escaped), at most :data:`MAX_RESULT_BYTES` (64 KiB on a
    256 KiB server, 256 KiB on the default 1 MB one)."""
    return min(MAX_RESULT_BYTES, max_payload // 4)


def bounded_result(content: str, limit: int = MAX_RESULT_BYTES) -> str:
    """The run's result (its final reply) as the run keeps it: cut to ``limit`` bytes (:func:`result_limit`),
    marked."""
    size = _size(content, limit)
    if size <= limit:
        return content
    marker = f"\n\n[cut by Temporality: the final reply was {size} bytes; its first {limit} are kept]"
    return cut(content, limit - len(marker.encode("utf-8"))) + marker


def _bounded_text(content: str | None) -> str | None:
    if content is None:
        return None
    size = _size(content, MAX_ITEM_BYTES)
    if size <= MAX_ITEM_BYTES:
        return content
    marker = f"\n[cut by Temporality: this text was {size} bytes; its first {MAX_ITEM_BYTES} are kept]"
    return cut(content, MAX_ITEM_BYTES - len(marker.encode("utf-8"))) + marker


def _bounded_call(call: ToolCall) -> ToolCall:
    if call.refused is not None:
        return call
    name, refused = call.name, None
    if len(name) > MAX_TOOL_NAME_CHARS:
        name = name[:KEPT_NAME_CHARS]
        refused = (
            f"a tool name must be at most {MAX_TOOL_NAME_CHARS} characters; this call's was {len(call.name)} "
            f"(it began {name!r}), so it was not made. Call one of your tools by its name"
        )
    text = call.invalid_arguments if call.invalid_arguments is not None else None
    size = _size(text, MAX_ARGUMENTS_BYTES) if text is not None else 0
    if text is None and call.arguments:
        text = json.dumps(call.arguments, ensure_ascii=False)
        size = _size(text, MAX_ARGUMENTS_BYTES)
    if size > MAX_ARGUMENTS_BYTES and text is not None:
        refused = refused or (
            f"the arguments of {name!r} were {size} bytes of JSON; a call may send at most {MAX_ARGUMENTS_BYTES}, "
            "so it was not made. Send less at once (several smaller calls, or a reference instead of the content)"
        )
        head = cut(text, _ARGUMENTS_HEAD) + f"... [cut by Temporality: {size} bytes]"
        return ToolCall(id=call.id, name=name, invalid_arguments=head, refused=refused)
    if refused is None:
        return call
    return call.model_copy(update={"name": name, "refused": refused})


def bounded_reply(reply: AssistantTurn) -> AssistantTurn:
    """``reply`` as the run keeps it: its calls' names and arguments bounded (an oversized one refused), the text
    beside its calls cut to :data:`MAX_ITEM_BYTES`. A final reply's text (no calls) is left whole here: it is the
    run's result, bounded by :func:`bounded_result` when the run completes. The same reply when nothing is over."""
    if not reply.tool_calls:
        return reply
    calls = [_bounded_call(call) for call in reply.tool_calls]
    content = _bounded_text(reply.content)
    if content is reply.content and all(a is b for a, b in zip(calls, reply.tool_calls, strict=True)):
        return reply
    return reply.model_copy(update={"tool_calls": calls, "content": content})
