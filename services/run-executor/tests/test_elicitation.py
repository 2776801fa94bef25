"""MCP elicitation, decided from plain data (issue 6): the form rendered and read back
(:mod:`temporality_run_executor.elicitation`), and the run machine's decisions -- park on the call's
question, record the person's answer (or ask again), retry the call, park again on a further question.
The end-to-end path over a real MCP server and nats-server is ``test_mcp_elicitation.py``."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import pytest
from executor_support import REVIEWER
from machine_support import T0, make_checkpoint, make_run

from temporality_bus import PermanentError
from temporality_protocol import (
    HumanAnswered,
    HumanExpired,
    HumanPolicy,
    HumanRequested,
    LaunchSource,
    OptionAnswer,
    RunState,
    RunToolCalled,
    TextAnswer,
)
from temporality_run_executor.elicitation import (
    MAX_REFUSED,
    form_problem,
    read,
    read_url,
    render,
    render_url,
    secret_fields,
)
from temporality_run_executor.machine import (
    Agent,
    AnswerElicitation,
    Boundary,
    CallTool,
    Decision,
    Incoming,
    ProviderReplied,
    Publish,
    RetryTool,
    SaveCheckpoint,
    ToolElicited,
    ToolOutput,
    ToolRetried,
    ToolReturned,
    Transition,
    decide,
    elicitation_answered,
    human_outcome,
)
from temporality_run_executor.providers import AssistantTurn
from temporality_run_executor.records import Checkpoint, ElicitAnswer, Message, RunRecord, ToolCall
from temporality_run_executor.tools import BUILTIN_TOOLS, Tool, ToolContext, ToolPolicy, ToolRegistry

RUN_ID = "run-e-1"
CONFIRM: dict[str, Any] = {
    "type": "object",
    "properties": {"confirm": {"type": "boolean", "description": "Delete it for good?"}},
    "required": ["confirm"],
}
BOOKING: dict[str, Any] = {
    "type": "object",
    "properties": {
        "day": {"type": "string", "enum": ["monday", "tuesday"], "description": "Which day"},
        "hours": {"type": "integer", "minimum": 1, "maximum": 8},
        "note": {"type": "string"},
    },
    "required": ["day", "hours"],
}


async def _never(arguments: dict[str, Any], ctx: ToolContext) -> str:
    raise AssertionError("the machine never runs a tool")


DELETE = Tool(
    name="notes__delete_note", description="Delete a note.", parameters={"type": "object"}, implementation=_never
)
AGENT = Agent(
    REVIEWER.model_copy(update={"tools": ToolPolicy(allow=["get_input", "ask_human", "notes__delete_note"])}),
    ToolRegistry([*BUILTIN_TOOLS, DELETE]),
)


# --------------------------------------------------------------------------- the form
def test_a_boolean_field_is_asked_as_yes_no_options_and_read_back() -> None:
    form = render("Delete the note?", CONFIRM)
    assert form.question == "Delete the note?"
    assert [(o.id, o.label) for o in form.options] == [("yes", "Yes"), ("no", "No"), ("decline", "Decline")]
    assert not form.allow_free_text
    assert read(CONFIRM, OptionAnswer(option_id="yes")).content == {"confirm": True}
    assert read(CONFIRM, OptionAnswer(option_id="no")).content == {"confirm": False}
    assert read(CONFIRM, OptionAnswer(option_id="decline")).action == "decline"
    assert read(CONFIRM, OptionAnswer(option_id="maybe")).refused == "'maybe' is not an option of this question"


def test_an_enum_field_becomes_options_with_safe_ids() -> None:
    schema = {"type": "object", "properties": {"color": {"type": "string", "enum": ["red", "dark blue"]}}}
    form = render("Which color?", schema)
    assert [o.id for o in form.options] == ["red", "choice-2", "decline"]  # "dark blue" is no option id
    assert read(schema, OptionAnswer(option_id="choice-2")).content == {"color": "dark blue"}
    titled = {"type": "object", "properties": {"c": {"oneOf": [{"const": "r", "title": "Red"}]}}}
    assert [(o.id, o.label) for o in render("?", titled).options] == [("r", "Red"), ("decline", "Decline")]


def test_a_form_that_asks_for_a_secret_is_declined_only_and_says_why() -> None:
    """A secret field (its name names one, ``"format": "password"``, ``"writeOnly": true``): an answer would be
    kept in clear in the request, ``human.answered`` and the journal, and MCP says a server must send the person
    to a URL for secrets. The question names the fields and why, offers only decline, and shows no value."""
    vault = {"type": "object", "properties": {"db_password": {"type": "string", "enum": ["hunter2", "s3cr3t-xyz"]}}}
    form = render("Which database password should the migration use?", vault)
    shown = " ".join([form.question, form.context, *(o.id + " " + o.label for o in form.options)])
    assert "hunter2" not in shown
    assert "s3cr3t" not in shown
    assert ([o.id for o in form.options], form.allow_free_text, form.declines_only) == (["decline"], False, True)
    assert form.context.startswith("The form asks for a secret (db_password). Secrets are not taken through")
    assert "- db_password (secret, one of 2 values not shown)" in form.context
    assert secret_fields(vault) == ["db_password"]
    # whatever arrives other than decline is refused, even a value the form would accept
    refused = read(vault, TextAnswer(value="hunter2"))
    assert (refused.action, refused.content) == (None, None)
    assert refused.refused == "the form asks for a secret, which is not taken through Temporality: decline"
    assert read(vault, OptionAnswer(option_id="decline")).action == "decline"
    several = {
        "type": "object",
        "properties": {
            "user": {"type": "string", "enum": ["ops"]},
            "pin": {"type": "string", "format": "password"},
            "token": {"type": "string", "writeOnly": True},
        },
    }
    form = render("Sign in", several)
    assert form.declines_only
    assert form.context.startswith("The form asks for a secret (pin, token).")
    assert '- user (one of "ops")' in form.context  # an ordinary field's values are still listed
    assert "- pin (secret)" in form.context
    assert not render("When?", BOOKING).declines_only


def test_a_form_of_several_fields_is_free_text_read_line_by_line_or_as_json() -> None:
    form = render("When?", BOOKING, refused="field 'hours': 12 is greater than the maximum of 8")
    assert form.allow_free_text
    assert [o.id for o in form.options] == ["decline"]
    assert form.context.startswith("Your last answer was refused: field 'hours': 12 is greater than the maximum of 8")
    assert '- day (one of "monday", "tuesday", required): Which day' in form.context
    assert "- hours (integer, required)" in form.context
    assert "- note (string)" in form.context
    got = read(BOOKING, TextAnswer(value="day: Monday\nhours = 3\n"))
    assert (got.action, got.content) == ("accept", {"day": "monday", "hours": 3})
    assert read(BOOKING, TextAnswer(value='{"day": "tuesday", "hours": 8}')).content == {"day": "tuesday", "hours": 8}
    assert read(BOOKING, TextAnswer(value="decline")).action == "decline"


@pytest.mark.parametrize(
    ("text", "refused"),
    [
        ("day: monday\nhours: 12", "field 'hours': 12 is greater than the maximum of 8"),
        ("day: monday\nhours: three", "field 'hours': 'three' is not of type 'integer'"),
        ("day: friday\nhours: 2", "field 'day': 'friday' is not one of ['monday', 'tuesday']"),
        ("day: monday", "'hours' is a required property"),
        ("when: monday", "'when: monday' is not a line 'name: value' for a field of the form (day, hours, note)"),
        ("{not json", "it looks like JSON but is not (Expecting property name enclosed in double quotes)"),
        pytest.param(
            '{"day":' + "[" * 2_044 + "]" * 2_044 + "}", "it looks like JSON but is nested too deeply", id="too-deep"
        ),
        ('{"day": "monday", "hours": 2, "note": {"a": 1}}', "field 'note': a form value is text, a number"),
    ],
)
def test_an_answer_that_does_not_fit_the_form_is_refused_saying_why(text: str, refused: str) -> None:
    got = read(BOOKING, TextAnswer(value=text))
    assert got.action is None
    assert got.refused is not None
    assert got.refused.startswith(refused)


def test_a_schema_that_is_no_form_is_named() -> None:
    assert form_problem(CONFIRM) is None
    assert form_problem({"type": "string"}) == "its requested schema is not an object with properties"
    assert (form_problem({"type": 3}) or "").startswith("its requested schema is not a valid JSON schema")


# --------------------------------------------------------------------------- the machine
def _run(state: RunState, recipients: tuple[str, ...] = ("user:alice",), **changes: Any) -> RunRecord:
    human = HumanPolicy(allowed_recipients=list(recipients), default_timeout_s=600)
    return make_run(
        RUN_ID,
        state,
        **(
            {"title": "Tidy the notes", "launch": LaunchSource(kind="webhook", trigger_id="t"), "human": human}
            | changes
        ),
    )


_ckpt = partial(make_checkpoint, RUN_ID)


def _decide(run: RunRecord, ckpt: Checkpoint, incoming: Incoming) -> Decision:
    return decide(run, ckpt, AGENT, incoming, now=T0)


def _delete_call(call_id: str = "call-del") -> ToolCall:
    return ToolCall(id=call_id, name="notes__delete_note", arguments={"name": "note.txt"})


def _elicited_turn(run: RunRecord, calls: list[ToolCall]) -> tuple[CallTool, Decision]:
    """The provider's reply with ``calls``; the first (the MCP tool) asks for input: the decision after it."""
    first = _decide(run, _ckpt(), ProviderReplied(turn=2, reply=AssistantTurn(tool_calls=calls), elapsed_s=0.1))
    call = first.then
    assert isinstance(call, CallTool)
    asked = ToolElicited("Delete the note note.txt?", CONFIRM, 0)
    return call, _decide(run, _ckpt(), ToolReturned(call.turn, call.index, asked, elapsed_s=0.4))


def _saved(decision: Decision) -> Checkpoint:
    (save,) = [e for e in decision.effects if isinstance(e, SaveCheckpoint)]
    return save.checkpoint


def test_a_call_that_elicits_parks_the_turn_on_its_question_then_the_run_asks_its_person() -> None:
    run = _run(RunState.RUNNING)
    _, done = _elicited_turn(run, [_delete_call(), ToolCall(id="call-in", name="get_input")])
    assert isinstance(done.then, CallTool)  # the turn's other calls go on
    assert done.then.index == 1
    committed = _decide(run, _ckpt(), ToolReturned(done.then.turn, 1, ToolOutput("{}"), elapsed_s=0.5))
    saved = _saved(committed)
    assert committed.then == Boundary()
    assert saved.pending is not None
    assert saved.pending.kind == "elicit"
    assert saved.pending.call_id == "call-del"
    assert saved.elicit is not None
    assert (saved.elicit.index, saved.elicit.turn, saved.elicit.answers) == (0, 2, [])
    assert [m.tool_call_id for m in saved.messages if m.role == "tool"] == ["call-in"]  # the elicited one waits
    called = [e.data for e in committed.effects if isinstance(e, Publish) and isinstance(e.data, RunToolCalled)]
    assert [c.call_id for c in called] == ["call-in"]

    parked = _decide(run, saved, Boundary())
    (requested,) = [e.data for e in parked.effects if isinstance(e, Publish)]
    assert isinstance(requested, HumanRequested)
    assert requested.request_id == saved.pending.request_id
    assert (requested.recipient, requested.question) == ("user:alice", "Delete the note note.txt?")
    assert [o.id for o in requested.options] == ["yes", "no", "decline"]
    assert requested.context.startswith("The tool notes__delete_note asks during a call.")
    assert (
        Transition(RunState.WAITING_FOR_HUMAN, {"waiting_request_id": requested.request_id, "waiting_since": T0})
        in parked.effects
    )
    again = _decide(run, saved, Boundary())  # a replay of the park (a crash before the move) asks the same
    assert [e.data.request_id for e in again.effects if isinstance(e, Publish)] == [requested.request_id]  # a replay


@pytest.mark.parametrize(
    ("calls", "recipients", "why"),
    [
        (
            [
                _delete_call(),
                ToolCall(id="call-ask", name="ask_human", arguments={"recipient": "user:alice", "question": "?"}),
            ],
            ("user:alice",),
            "this reply already waits (ask_human, ask_agent mode=wait): call it again on its own",
        ),
        ([_delete_call()], (), "this run may ask nobody (its trigger allows no recipients)"),
    ],
)
def test_an_elicitation_that_cannot_park_fails_the_call_as_a_tool_error(
    calls: list[ToolCall], recipients: tuple[str, ...], why: str
) -> None:
    run = _run(RunState.RUNNING, recipients)
    _, done = _elicited_turn(run, calls)
    called = [e.data for e in done.effects if isinstance(e, Publish) and isinstance(e.data, RunToolCalled)]
    assert called[0].call_id == "call-del"
    assert why in json.loads(called[0].result_preview)["error"]
    saved = _saved(done)
    assert saved.elicit is None
    assert saved.pending is None or saved.pending.kind == "human"


def test_a_url_mode_elicitation_is_the_link_in_the_question_done_or_decline() -> None:
    form = render_url("Sign in to the calendar.", "https://auth.example.test/login")
    assert form.question == "Sign in to the calendar.\nOpen this link: https://auth.example.test/login"
    assert [o.id for o in form.options] == ["done", "decline"]
    assert not form.allow_free_text
    assert read_url(OptionAnswer(option_id="done")) == "accept"
    assert read_url(OptionAnswer(option_id="decline")) == "decline"
    assert read_url(TextAnswer(value=" Done ")) == "accept"
    assert read_url(TextAnswer(value="later")) == "cancel"


def test_a_url_mode_elicitation_to_a_link_that_is_not_http_fails_the_call() -> None:
    run = _run(RunState.RUNNING)
    first = _decide(
        run, _ckpt(), ProviderReplied(turn=2, reply=AssistantTurn(tool_calls=[_delete_call()]), elapsed_s=0.1)
    )
    call = first.then
    assert isinstance(call, CallTool)
    asked = ToolElicited("Open it.", {}, 0, url="file:///etc/passwd")
    done = _decide(run, _ckpt(), ToolReturned(call.turn, call.index, asked, elapsed_s=0.4))
    called = [e.data for e in done.effects if isinstance(e, Publish) and isinstance(e.data, RunToolCalled)]
    assert "to open a link that is not http(s): file:///etc/passwd" in json.loads(called[0].result_preview)["error"]
    assert _saved(done).elicit is None


def _waiting() -> tuple[RunRecord, Checkpoint, str]:
    run = _run(RunState.RUNNING)
    _, done = _elicited_turn(run, [_delete_call()])
    saved = _saved(done)
    assert saved.pending is not None
    return _run(RunState.RESUMING), saved, saved.pending.request_id


def _outcome(request_id: str, answer: OptionAnswer | TextAnswer | None) -> Incoming:
    if answer is None:
        data: HumanAnswered | HumanExpired = HumanExpired(
            request_id=request_id, run_id=RUN_ID, recipient="user:alice", action="default", waited_s=600
        )
        return human_outcome("human.expired", "evt-x", data)
    answered = HumanAnswered(
        request_id=request_id,
        run_id=RUN_ID,
        recipient="user:alice",
        responder="user:alice",
        answer=answer,
        channel="web",
        waited_s=5,
    )
    return human_outcome("human.answered", "evt-a", answered)


@pytest.mark.parametrize(
    ("answer", "action", "content"),
    [
        (OptionAnswer(option_id="yes"), "accept", {"confirm": True}),
        (OptionAnswer(option_id="decline"), "decline", None),
        (None, "cancel", None),  # expired
    ],
)
def test_the_person_s_outcome_is_recorded_for_the_call_which_is_then_made_again(
    answer: OptionAnswer | None, action: str, content: dict[str, Any] | None
) -> None:
    resuming, ckpt, request_id = _waiting()
    decision = _decide(resuming, ckpt, _outcome(request_id, answer))
    (answering,) = [e for e in decision.effects if isinstance(e, AnswerElicitation)]
    assert answering.repark is None
    assert answering.answer == ElicitAnswer(
        message="Delete the note note.txt?", requested_schema=CONFIRM, action=action, content=content
    )
    assert decision.then == Boundary()
    applied = elicitation_answered(ckpt, answering, T0)
    assert applied is not None
    assert applied.pending is None
    assert applied.elicit is not None
    assert applied.elicit.answers == [answering.answer]
    assert elicitation_answered(applied, answering, T0) is None  # a redelivered outcome changes nothing

    retry = _decide(_run(RunState.RUNNING), applied, Boundary())
    assert isinstance(retry.then, RetryTool)
    assert retry.then.tool is DELETE
    assert retry.then.elicitation == applied.elicit

    done = _decide(_run(RunState.RUNNING), applied, ToolRetried(applied.elicit, ToolOutput("deleted"), elapsed_s=0.3))
    saved = _saved(done)
    assert saved.elicit is None
    assert saved.messages[-1] == Message(
        role="tool", tool_call_id="call-del", name="notes__delete_note", content="deleted"
    )
    assert saved.compute_s == pytest.approx(applied.compute_s + 0.3)
    (called,) = [e for e in done.effects if isinstance(e, Publish) and isinstance(e.data, RunToolCalled)]
    assert called.id_parts == ("2", "0")  # the call's own (turn, index)
    assert done.then == Boundary()


def test_an_answer_that_does_not_fit_is_asked_again_then_cancelled() -> None:
    resuming, ckpt, request_id = _waiting()
    ids = [request_id]
    for attempt in range(1, MAX_REFUSED):
        decision = _decide(resuming, ckpt, _outcome(ids[-1], TextAnswer(value="perhaps")))
        (answering,) = [e for e in decision.effects if isinstance(e, AnswerElicitation)]
        assert answering.answer is None
        assert answering.repark is not None
        assert answering.repark.arguments["attempt"] == attempt
        assert answering.repark.arguments["refused"] == "field 'confirm': 'perhaps' is not of type 'boolean'"
        ids.append(answering.repark.request_id)
        applied = elicitation_answered(ckpt, answering, T0)
        assert applied is not None
        assert applied.pending == answering.repark
        ckpt = applied
    assert len(set(ids)) == MAX_REFUSED
    last = _decide(resuming, ckpt, _outcome(ids[-1], TextAnswer(value="perhaps")))
    (answering,) = [e for e in last.effects if isinstance(e, AnswerElicitation)]
    assert answering.answer is not None
    assert answering.answer.action == "cancel"
    with pytest.raises(PermanentError, match="is not waiting on"):
        elicitation_answered(ckpt, AnswerElicitation("hr-other"), T0)


def test_a_further_question_in_the_retried_call_parks_the_run_again() -> None:
    _, ckpt, request_id = _waiting()
    accepted = ElicitAnswer(
        message="Delete the note note.txt?", requested_schema=CONFIRM, action="accept", content={"confirm": True}
    )
    applied = elicitation_answered(ckpt, AnswerElicitation(request_id, accepted), T0)
    assert applied is not None
    assert applied.elicit is not None
    further = ToolElicited("Also empty the bin?", CONFIRM, 1)
    decision = _decide(_run(RunState.RUNNING), applied, ToolRetried(applied.elicit, further, elapsed_s=0.2))
    saved = _saved(decision)
    assert saved.pending is not None
    assert saved.pending.kind == "elicit"
    assert saved.pending.arguments["position"] == 1
    assert saved.pending.request_id not in (request_id,)
    assert saved.elicit is not None
    assert saved.elicit.answers == [accepted]  # the first answer stays for the next retry
    assert decision.then == Boundary()
