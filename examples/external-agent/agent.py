"""An external agent for Temporality, written from the published protocol alone.

It uses nothing of Temporality's code: only the subjects and JSON Schemas in ``schemas/`` (see
``schemas/asyncapi.yaml``, channels ``agentsRegister``, ``agentsHeartbeat``, ``agentsDeregister``),
nats-py for the transport, jsonschema to check every body it sends and receives, and cryptography's
Ed25519 to sign every request (AP-11; docs/agent-collaboration.md, "Signed messages"). Every request goes on
the agent's own subject, ``temporality.rpc.agents.<agent id>.<operation>``. It

1. registers on ``temporality.rpc.agents.<agent id>.register`` (AP-3) and reads its policy and the negotiated
   protocol version from the reply -- or stops, saying why it was refused;
2. answers the conformance round the reply (or a later heartbeat ack) carries, on
   ``temporality.rpc.agents.<agent id>.conformance`` (PRO-2): ``echo`` and ``reverse`` are capabilities the
   protocol can probe, so they become verified; ``triage`` has no probe and stays unverified.
   ``--conformance wrong`` answers every probe wrongly and ``--conformance ignore`` not at all, to
   see the platform refuse to verify them;
3. heartbeats on ``temporality.rpc.agents.<agent id>.heartbeat`` (AP-4) ``--beats`` times, every ``--period-s``
   seconds (default: half the interval the reply asks for), alternating ``idle`` and ``busy``;
4. deregisters on ``temporality.rpc.agents.<agent id>.deregister`` (``decommissioned``), also when interrupted.

    python examples/external-agent/agent.py keygen --out example-agent.key   # prints the public key
    python examples/external-agent/agent.py --nats-url nats://127.0.0.1:4222 --key-file example-agent.key

Against a NATS with per-user permissions (``make up`` prints the URL of the ``example-agent`` user, and this
agent's whole command line with it, ``--key-file`` and ``--collab-public-key`` included), put the user in the URL (``nats://example-agent:<password>@127.0.0.1:<port>``): the replies then arrive below
``_INBOX.example-agent``, the one inbox prefix that user may subscribe to (``--inbox-prefix`` to override).
A NATS without passwords: ``--creds-file`` (or ``TEMPORALITY_NATS_CREDS_FILE``) a credentials file of a NATS in
operator/JWT mode (``nsc generate creds``), ``--nkey-seed-file`` (or ``TEMPORALITY_NATS_NKEY_SEED_FILE``) a file
with the user's nkey seed (``SU...``) for a server that lists the user by its public nkey (docs/operations.md, "A
NATS without passwords"); one way to authenticate only (with a user in the URL too: exit 2), an empty variable counts
as unset. The URL then names no user: give ``--inbox-prefix _INBOX.<user>`` where the user may subscribe below
that prefix only.
A NATS server with TLS: ``--nats-url tls://...``, and ``--tls-ca ca.pem`` when its certificate comes from a
private CA (nats-py checks it against the system's trust store otherwise).

The agent id must be on agent-collab's allow-list with that public key (``public_key:``). The
repository's ``config/external-agents.yaml`` lists ``example-agent`` without one: ``temporality up`` makes
its key (``<data-dir>/example-agent.key``), gives agent-collab the list with its public key and prints this
command with ``--key-file``; anywhere else add the line ``keygen`` prints. Without ``--key-file`` (or
``TEMPORALITY_AGENT_KEY_FILE``) it sends unsigned requests, which only an agent marked ``allow_unsigned``
(development only) may. Exit codes: 0 done, 2 unusable key file (or NATS credentials), 3 registration
refused, 4 a heartbeat refused, 5 a reply that does not match its schema, 6 no reply in time (or no connection), 7 a task
message refused, 8 a reply not signed by agent-collab.

With ``--collab-public-key`` (agent-collab's public key, the one its ``TEMPORALITY_COLLAB_REPLY_KEY_FILE`` signs
with) it checks every reply's signature before it reads it: ``temporality-agent-reply-v1`` LF request subject
LF reply subject LF key id LF timestamp LF body, headers ``Temporality-Key-Id`` (``--collab-key-id``, default
``agent-collab``), ``Temporality-Timestamp`` and ``Temporality-Signature``.

**Tasks** (``--work``; AP-5, AP-7..AP-9, channels ``agentsTasks`` and ``agentsAct``): instead of ``--beats`` it
heartbeats every period and polls ``temporality.rpc.agents.<agent id>.tasks`` every ``--poll-s`` seconds. A run whose agent
card says ``provider: {kind: external, agent_id: example-agent}`` (``examples/external-agent/agents.yaml``) is
offered to it turn by turn. For each task it streams a ``progress`` event, checkpoints, and asks the first
person the task may ask (``ask_human`` as a ``tool_calls`` action: the run parks until the person answers);
when the answer comes back as the next turn's input it streams a ``partial_result`` and ``metrics``,
checkpoints again and sends the ``result`` (the run completes). Killed, it goes ``offline`` after its heartbeat
deadline; started again it registers, finds its task held by its old session -- the platform hands it back
with the last checkpoint (``resumed``) and publishes ``run.resumed`` -- and carries on where it was:

    python examples/external-agent/agent.py --nats-url nats://127.0.0.1:4222 --work --tasks 1

With ``--handoff-to CARD`` it does not finish the task itself: once the person has answered it **hands the task
off** (AP-6) to the agent card ``CARD`` -- a ``handoff`` action with the handoff document (objective, where the
task stands, the steps done and left, the decision as an artifact, the task's acceptance criteria). The run
completes, handed off, and a run of ``CARD`` carries on in the same saga; the card must offer
``handoff_to_agent`` and the agent must be granted it (``allowed_tools``).

``--think-s`` makes it work on a new task that long before its first action. A run cancelled meanwhile comes back
once in the next poll with ``state: cancelled``: it drops the task (counted as done for ``--tasks``). An action
refused for good (``tool_not_allowed``: a tool it is not granted; ``malformed_request``) is not sent again at
every poll: it fails the task with the refusal as the error (counted as done too); other refusals (the run ended,
the turn moved on) are logged and the next poll says what is left.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import os
import secrets
import ssl
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import nats
import nats.errors
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
)
from jsonschema import Draft202012Validator, ValidationError

log = logging.getLogger("external-agent")

#: The protocol versions this agent speaks, newest first (PRO-3: agent-collab picks the highest common one).
VERSIONS = ["1.0"]
#: The channels' addresses (``x-nats-subject``): every agent sends on its own, its id in place of ``{agent_id}``
#: (its NATS user may publish there only; agent-collab refuses a request signed by another agent).
REGISTER = "temporality.rpc.agents.{agent_id}.register"
HEARTBEAT = "temporality.rpc.agents.{agent_id}.heartbeat"
DEREGISTER = "temporality.rpc.agents.{agent_id}.deregister"
CONFORMANCE = "temporality.rpc.agents.{agent_id}.conformance"
TASKS = "temporality.rpc.agents.{agent_id}.tasks"
ACT = "temporality.rpc.agents.{agent_id}.act"
#: What it declares it can do; the platform probes those the protocol has a check for (PRO-2).
CAPABILITIES = ["echo", "reverse", "triage"]
_DEFAULT_SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


#: Refusals that sending the same action again can never turn into an acceptance (the rest depend on the moment).
FINAL_REFUSALS = frozenset({"tool_not_allowed", "malformed_request"})


class ProtocolFailure(Exception):
    """The exchange cannot go on; ``code`` is the process's exit code."""

    def __init__(self, code: int, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        #: The refusal's reason, when the platform refused a request (``refusal.reason``).
        self.reason = reason


# --------------------------------------------------------------------------- signing (AP-11)
#: The first line of the signing input (docs/agent-collaboration.md, "Signed messages").
SIGNATURE_SCHEME = "temporality-agent-signature-v1"
#: The first line of a reply's signing input.
REPLY_SCHEME = "temporality-agent-reply-v1"
#: How far a signed reply's timestamp may be from this agent's clock.
REPLY_WINDOW_S = 120


def signing_input(subject: str, key_id: str, timestamp: str, nonce: str, body: bytes) -> bytes:
    """scheme LF subject LF key id LF timestamp LF nonce LF body -- the body's exact bytes, last."""
    return "\n".join([SIGNATURE_SCHEME, subject, key_id, timestamp, nonce, ""]).encode() + body


def signature_headers(key: Ed25519PrivateKey, subject: str, key_id: str, body: bytes) -> dict[str, str]:
    """The four headers of one signed request: a new nonce and the current time for every message."""
    timestamp, nonce = str(int(time.time())), secrets.token_urlsafe(16)
    signature = key.sign(signing_input(subject, key_id, timestamp, nonce, body))
    return {
        "Temporality-Key-Id": key_id,
        "Temporality-Timestamp": timestamp,
        "Temporality-Nonce": nonce,
        "Temporality-Signature": base64.b64encode(signature).decode("ascii"),
    }


def check_reply(collab_key: Ed25519PublicKey, key_id: str, request_subject: str, reply_subject: str, msg: Any) -> None:
    """agent-collab signed this reply to this request (its inbox is this request's alone), or ProtocolFailure 8."""
    headers = msg.headers or {}
    stamp, signature = headers.get("Temporality-Timestamp", ""), headers.get("Temporality-Signature")
    if signature is None or headers.get("Temporality-Key-Id") != key_id or not stamp.isascii() or not stamp.isdigit():
        raise ProtocolFailure(8, f"the reply on {request_subject} is not signed by {key_id}")
    signed = "\n".join([REPLY_SCHEME, request_subject, reply_subject, key_id, stamp, ""]).encode() + msg.data
    try:
        collab_key.verify(base64.b64decode(signature, validate=True), signed)
    except (InvalidSignature, ValueError):
        raise ProtocolFailure(8, f"the reply on {request_subject} has a signature that does not verify") from None
    if abs(time.time() - int(stamp)) > REPLY_WINDOW_S:
        raise ProtocolFailure(8, f"the reply on {request_subject} was signed {time.time() - int(stamp):.0f} s ago")


def load_key(path: Path) -> Ed25519PrivateKey:
    """An Ed25519 private key: PEM (PKCS#8, as ``keygen`` writes it) or the 32-byte seed in base64."""
    text = path.read_bytes()
    if text.lstrip().startswith(b"-----BEGIN"):
        key = load_pem_private_key(text, password=None)
    else:
        key = Ed25519PrivateKey.from_private_bytes(base64.b64decode(text.strip(), validate=True))
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path} holds a {type(key).__name__}, not an Ed25519 private key")
    return key


def public_key_of(key: Ed25519PrivateKey) -> str:
    """The public key as the allow-list's ``public_key:`` takes it: the raw 32 bytes in base64."""
    return base64.b64encode(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode("ascii")


def keygen(out: Path) -> int:
    """Write a new private key to ``out`` (PEM, mode 0600) and print the line for the allow-list."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never overwrite a key
    except OSError as exc:
        log.error("cannot write %s: %s", out, exc.strerror or exc)
        return 2
    with os.fdopen(fd, "wb") as file:
        file.write(pem)
    sys.stdout.write(f"public_key: {public_key_of(key)}\n")
    return 0


class Client:
    """Request/reply on the Agent Protocol's subjects, every body checked against its published schema and
    signed with ``key`` (unsigned when it is ``None``: only an ``allow_unsigned`` agent may)."""

    def __init__(
        self,
        nc: Any,
        schemas: Path,
        timeout_s: float,
        *,
        key: Ed25519PrivateKey | None,
        key_id: str,
        collab_key: Ed25519PublicKey | None = None,
        collab_key_id: str = "agent-collab",
    ) -> None:
        self._nc = nc
        self._collab_key = collab_key
        self._collab_key_id = collab_key_id
        self._timeout_s = timeout_s
        self._key = key
        self._key_id = key_id
        self._validators: dict[str, Draft202012Validator] = {}
        for subject in (REGISTER, HEARTBEAT, DEREGISTER, CONFORMANCE, TASKS, ACT):
            name = subject.removeprefix("temporality.rpc.").replace(".{agent_id}", "")  # agents.register
            for kind in ("request", "reply"):
                schema = json.loads((schemas / "rpc" / f"{name}.{kind}.schema.json").read_text(encoding="utf-8"))
                Draft202012Validator.check_schema(schema)
                if schema.get("x-nats-subject") != subject:
                    raise ValueError(f"{name}.{kind}.schema.json is not the schema of {subject}")
                self._validators[f"{subject} {kind}"] = Draft202012Validator(schema)

    async def call(self, channel: str, body: dict[str, Any]) -> dict[str, Any]:
        self._validators[f"{channel} request"].validate(body)  # our own bug if this fails
        payload = json.dumps(body).encode()
        subject = channel.format(agent_id=self._key_id)  # its own subject (the key id is its agent id)
        headers = signature_headers(self._key, subject, self._key_id, payload) if self._key is not None else None
        try:
            msg = await self._nc.request(subject, payload, timeout=self._timeout_s, headers=headers)
        except nats.errors.TimeoutError:
            raise ProtocolFailure(6, f"no reply on {subject} within {self._timeout_s}s") from None
        except nats.errors.NoRespondersError:
            raise ProtocolFailure(6, f"nobody answers on {subject} (is agent-collab running?)") from None
        if self._collab_key is not None:  # agent-collab's signature first: an unproven reply is never read
            check_reply(self._collab_key, self._collab_key_id, subject, msg.subject, msg)
        reply: dict[str, Any] = json.loads(msg.data)
        try:
            self._validators[f"{channel} reply"].validate(reply)
        except ValidationError as exc:
            raise ProtocolFailure(5, f"the reply on {subject} does not match its schema: {exc.message}") from None
        return reply


def _now() -> str:
    return datetime.now(UTC).isoformat()


def probe_answer(probe: dict[str, Any], mode: str) -> str:
    """The answer to one probe (its ``expects`` says the rule): ``echo`` the challenge, ``reverse`` it."""
    challenge = str(probe["challenge"])
    if mode == "wrong":
        return challenge + "?"
    if probe["capability"] == "reverse":
        return challenge[::-1]
    return challenge  # echo (and any probe it does not know: echoing is the honest best effort)


async def answer_round(
    client: Client, agent_id: str, version: str, round_: dict[str, Any], answered: set[int], mode: str
) -> None:
    """Answer a conformance round once (``answered`` remembers which); ``ignore`` never answers."""
    if round_["round"] in answered or mode == "ignore":
        return
    answers = [{"probe_id": p["probe_id"], "answer": probe_answer(p, mode)} for p in round_["probes"]]
    reply = await client.call(
        CONFORMANCE, {"agent_id": agent_id, "protocol_version": version, "round": round_["round"], "answers": answers}
    )
    answered.add(round_["round"])
    if not reply["accepted"]:
        log.warning("conformance answers refused (%s): %s", reply["refusal"]["reason"], reply["refusal"]["detail"])
        return
    verdict = ", ".join(f"{c['name']}={c['status']}" for c in reply["capabilities"])
    log.info("conformance round %d: %s", round_["round"], verdict)


# --------------------------------------------------------------------------- tasks (AP-5, AP-7..AP-9)
class Worker:
    """Takes tasks and does them: one question to a person, then the result (``--work``).

    Its memory is the platform's: every step is checkpointed *before* the action that follows it (AP-7), and
    a restarted worker resumes from the checkpoint its task comes back with (AP-8). Every action carries a
    stable ``action_id`` (task, turn, what), so a retry after a lost reply or a crash changes nothing."""

    def __init__(
        self, client: Client, agent_id: str, version: str, *, think_s: float = 0.0, handoff_to: str | None = None
    ) -> None:
        self.client = client
        self.think_s = think_s
        #: Hand every task off to this agent card once the person has answered, instead of finishing it (AP-6).
        self.handoff_to = handoff_to
        #: When each task was first seen (its first action waits ``think_s`` from then).
        self._seen: dict[str, float] = {}
        self.agent_id = agent_id
        self.version = version
        #: A fresh id per process: a task this worker finds held by another session is being resumed.
        self.session_id = secrets.token_urlsafe(12)
        self.completed = 0
        self.active_run_id: str | None = None
        self._resumed: set[str] = set()

    async def _act(self, task_id: str, turn: int, what: str, kind: str, **fields: Any) -> dict[str, Any]:
        body = {
            "agent_id": self.agent_id,
            "protocol_version": self.version,
            "task_id": task_id,
            "turn": turn,
            "action_id": f"{task_id}:{turn}:{what}",
            "kind": kind,
            **fields,
        }
        reply = await self.client.call(ACT, body)
        if not reply["accepted"]:
            refusal = reply["refusal"]
            raise ProtocolFailure(7, f"{kind} refused ({refusal['reason']}): {refusal['detail']}", refusal["reason"])
        return reply

    async def _stream(self, task_id: str, turn: int, what: str, kind: str, message: str, **data: Any) -> None:
        event = {"kind": kind, "message": message, "data": data}
        await self._act(task_id, turn, what, "event", event=event)

    async def _checkpoint(self, task: dict[str, Any], turn: int, step: str, **state: Any) -> None:
        checkpoint = {
            "run_id": task["run_id"],
            "timestamp": _now(),
            "execution_state": {"step": step, "turn": turn, **state},
            "memory_snapshot": {"objective": task["objective"]},
            "artifact_references": [],
        }
        await self._act(task["task_id"], turn, f"ckpt-{step}", "checkpoint", checkpoint=checkpoint)

    async def poll(self) -> None:
        reply = await self.client.call(
            TASKS, {"agent_id": self.agent_id, "protocol_version": self.version, "session_id": self.session_id}
        )
        if not reply["accepted"]:
            refusal = reply["refusal"]
            raise ProtocolFailure(7, f"task poll refused ({refusal['reason']}): {refusal['detail']}")
        self.active_run_id = reply["tasks"][0]["task"]["run_id"] if reply["tasks"] else None
        for assignment in reply["tasks"]:
            try:
                await self.handle(assignment)
            except ProtocolFailure as refused:
                if refused.code != 7:
                    raise
                log.warning("task %s: %s", assignment["task"]["task_id"], refused)
                if refused.reason in FINAL_REFUSALS:
                    await self.give_up(assignment, str(refused))
                # otherwise (e.g. task_ended: its run was cancelled meanwhile) the next poll says what is left

    async def give_up(self, assignment: dict[str, Any], why: str) -> None:
        """An action the platform will never accept as it is (a tool it is not granted, a body it cannot read):
        sending it again at every poll would only wait out the run's budget -- fail the task, saying why."""
        task_id, turn = assignment["task"]["task_id"], assignment["turn"]
        try:
            await self._act(task_id, turn, "fail-refused", "failure", error=f"cannot go on: {why}"[:4096])
        except ProtocolFailure as refused:
            if refused.code != 7:
                raise
            log.warning("task %s: %s", task_id, refused)  # ended meanwhile: nothing left to fail
        self._seen.pop(task_id, None)
        self.completed += 1
        log.warning("task %s failed: %s", task_id, why)

    async def handle(self, assignment: dict[str, Any]) -> None:
        task, turn = assignment["task"], assignment["turn"]
        task_id = task["task_id"]
        if assignment["state"] == "cancelled":  # its run was cancelled: told once, stop working on it
            log.info("task %s cancelled (its run %s was cancelled): dropping it", task_id, task["run_id"])
            self._seen.pop(task_id, None)
            self.completed += 1
            return
        saved = assignment["checkpoint"]
        if assignment["resumed"] and task_id not in self._resumed:
            self._resumed.add(task_id)
            current = saved is not None and saved["run_id"] == task["run_id"]  # AP-8: is the context current?
            step = saved["execution_state"].get("step") if current and saved else None
            log.info(
                "resuming task %s at turn %d from checkpoint %s (step %s)",
                task_id,
                turn,
                saved["checkpoint_id"] if saved else None,
                step,
            )
        if assignment["acted"]:
            return  # this turn has our action (sent before a restart): the platform is carrying it out
        answers = [i["content"] for i in assignment["inputs"] if i["tool"] == "ask_human"]
        if time.monotonic() - self._seen.setdefault(task_id, time.monotonic()) < self.think_s:
            return  # still working on it (--think-s): the next poll comes back to it
        if not answers:
            people = task["context"].get("people") or []
            if not people:
                await self._act(task_id, turn, "fail", "failure", error="nobody to ask about this task")
                return
            log.info("task %s: asking %s", task_id, people[0])
            await self._stream(task_id, turn, "progress", "progress", "read the task; a person must decide", step=1)
            await self._checkpoint(task, turn, "asking", recipient=people[0])
            question = {
                "recipient": people[0],
                "question": f"{task['objective']}: go ahead?",
                "context": "Asked by the example external agent.",
                "options": [{"id": "yes", "label": "Go ahead"}, {"id": "no", "label": "Stop"}],
            }
            await self._act(task_id, turn, "act", "tool_calls", calls=[{"name": "ask_human", "arguments": question}])
            return
        answer = answers[-1]
        try:
            outcome = json.loads(answer)
        except ValueError:
            outcome = {}
        if isinstance(outcome, dict) and outcome.get("status") in ("rejected", "expired"):
            log.warning("task %s: the question was not answered: %s", task_id, answer)
            await self._act(task_id, turn, "fail", "failure", error=f"the question was not answered: {answer}")
            self.completed += 1
            return
        log.info("task %s: answered: %s", task_id, answer)
        await self._stream(task_id, turn, "partial", "partial_result", "the person answered", answer=answer)
        await self._checkpoint(task, turn, "answered", answer=answer)
        await self._stream(task_id, turn, "metrics", "metrics", "done", turns=turn)
        if self.handoff_to is not None:
            reply = await self._act(task_id, turn, "handoff", "handoff", handoff=self._handoff(task, answer))
            self.completed += 1
            # the child run that takes the task on (optional in the reply: absent from a platform before it)
            child = reply.get("child_run_id")
            log.info("task %s handed off to %s: child run %s", task_id, self.handoff_to, child or "(not told)")
            return
        await self._act(task_id, turn, "result", "result", result=f"Done: {task['objective']} -- decision: {answer}")
        self.completed += 1
        log.info("task %s completed", task_id)

    def _handoff(self, task: dict[str, Any], answer: str) -> dict[str, Any]:
        """The AP-6 handoff document: everything the next agent needs, nothing it must look up first."""
        people = task["context"].get("people") or []
        return {
            "agent": self.handoff_to,
            "objective": task["objective"],
            "current_status": f"a person decided: {answer}"[:4096],
            "completed_steps": [f"asked {people[0] if people else 'a person'} whether to go ahead"],
            "remaining_steps": ["carry out the decision", "report the outcome"],
            "artifacts": [f"decision: {answer}"[:4096]],
            "memory_links": [f"run:{task['run_id']}"],
            "open_questions": [],
            "constraints": [],
            "acceptance_criteria": list(task["acceptance_criteria"]),
        }


async def work(client: Client, args: argparse.Namespace, version: str, period: float, answered: set[int]) -> None:
    """``--work``: heartbeat every ``period``, poll for tasks every ``--poll-s``, until ``--tasks`` are done."""
    worker = Worker(client, args.agent_id, version, think_s=args.think_s, handoff_to=args.handoff_to)
    last_beat = 0.0
    beats = 0
    while args.tasks == 0 or worker.completed < args.tasks:
        try:
            last_beat, beats = await _work_step(client, args, version, period, answered, worker, last_beat, beats)
        except ProtocolFailure as failure:
            if failure.code != 6:
                raise
            # agent-collab is restarting, or a reply was lost: try again (every message is signed afresh,
            # every action has a stable action_id, so repeating a step is safe)
            log.warning("%s; retrying", failure)
            await asyncio.sleep(0.5)


async def _work_step(
    client: Client,
    args: argparse.Namespace,
    version: str,
    period: float,
    answered: set[int],
    worker: Worker,
    last_beat: float,
    beats: int,
) -> tuple[float, int]:
    """One round of ``work``: a heartbeat when one is due, a poll, a pause."""
    if time.monotonic() - last_beat >= period:
        beats += 1
        ack = await client.call(
            HEARTBEAT,
            {
                "agent_id": args.agent_id,
                "timestamp": _now(),
                "current_state": "busy" if worker.active_run_id else "idle",
                "active_run_id": worker.active_run_id,
                "resource_usage": {"beats": float(beats)},
                "protocol_version": version,
            },
        )
        if not ack["accepted"]:
            refusal = ack["refusal"]
            raise ProtocolFailure(4, f"heartbeat refused ({refusal['reason']}): {refusal['detail']}")
        if ack.get("conformance") is not None:
            await answer_round(client, args.agent_id, version, ack["conformance"], answered, args.conformance)
        last_beat = time.monotonic()
    await worker.poll()
    await asyncio.sleep(args.poll_s)
    return last_beat, beats


def inbox_prefix_for(nats_url: str) -> str:
    """Where this agent's replies arrive: ``_INBOX.<NATS user>`` when the URL names a user -- an external agent's
    NATS user may subscribe below that prefix only (docs/agent-collaboration.md, "NATS permissions") -- else
    nats-py's default ``_INBOX`` (a server without authentication)."""
    user = urlsplit(nats_url.split(",")[0].strip()).username
    return f"_INBOX.{user}" if user else "_INBOX"


def nats_auth(args: argparse.Namespace) -> dict[str, str] | str:
    """nats-py's ``connect()`` arguments for ``--creds-file`` / ``--nkey-seed-file`` (``TEMPORALITY_NATS_CREDS_FILE``
    / ``TEMPORALITY_NATS_NKEY_SEED_FILE``, as the services read them), or why they cannot be used: one way to
    authenticate only (a user in ``--nats-url`` is the third), and a file that can be read."""
    ways = [name for name, given in (("a user in --nats-url", urlsplit(args.nats_url.split(",")[0].strip()).username),
            ("--creds-file", args.creds_file), ("--nkey-seed-file", args.nkey_seed_file)) if given]  # fmt: skip
    if len(ways) > 1:
        return f"{' and '.join(ways)}: give one way to authenticate to NATS"
    for flag, path in (("--creds-file", args.creds_file), ("--nkey-seed-file", args.nkey_seed_file)):
        if path is not None and not os.access(path, os.R_OK):
            return f"{flag} {path}: not a readable file"
    if args.creds_file is not None:  # nats-py reads it again at every reconnection: a rotated file is used
        return {"user_credentials": str(args.creds_file)}
    if args.nkey_seed_file is not None:  # the client signs the server's nonce: no secret crosses the wire
        return {"nkeys_seed": str(args.nkey_seed_file)}
    return {}


async def run(args: argparse.Namespace) -> int:
    key_file = args.key_file or os.environ.get("TEMPORALITY_AGENT_KEY_FILE")
    key: Ed25519PrivateKey | None = None
    if key_file:
        try:
            key = load_key(Path(key_file))
        except (OSError, ValueError, TypeError) as exc:
            log.error("cannot use the key file %s: %s", key_file, exc)
            return 2
    else:
        log.warning("no --key-file: sending unsigned requests (only an allow_unsigned agent may)")
    collab_key: Ed25519PublicKey | None = None
    if args.collab_public_key:
        try:
            raw = base64.b64decode(args.collab_public_key, validate=True)
            collab_key = Ed25519PublicKey.from_public_bytes(raw)
        except ValueError as exc:
            log.error("cannot use --collab-public-key: %s", exc)
            return 2
    else:
        log.warning("no --collab-public-key: replies are not checked for agent-collab's signature")
    auth = nats_auth(args)
    if isinstance(auth, str):
        log.error("%s", auth)
        return 2
    tls: ssl.SSLContext | None = None
    if args.tls_ca:
        try:
            tls = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(args.tls_ca))
        except (OSError, ssl.SSLError) as exc:
            log.error("cannot use the CA file %s: %s", args.tls_ca, exc)
            return 2

    async def on_nats_error(exc: Exception) -> None:  # one line, not nats-py's traceback per attempt
        log.warning("nats: %r", exc)

    try:
        # nats-py retries a first connection like a reconnect (every 2 s, 60 times): bounded here, so that an
        # unreachable server or a certificate the CA does not vouch for ends the agent with exit 6 soon
        nc = await asyncio.wait_for(
            nats.connect(
                args.nats_url,
                name=f"external-agent-{args.agent_id}",
                connect_timeout=5,
                tls=tls,
                inbox_prefix=args.inbox_prefix or inbox_prefix_for(args.nats_url),
                error_cb=on_nats_error,
                **auth,
            ),
            timeout=args.connect_within_s,
        )
    except (OSError, TimeoutError, nats.errors.Error) as exc:
        log.error("cannot connect to %s: %r", args.nats_url, exc)
        return 6
    client = Client(
        nc,
        args.schemas,
        args.timeout_s,
        key=key,
        key_id=args.agent_id,
        collab_key=collab_key,
        collab_key_id=args.collab_key_id,
    )
    version: str | None = None
    try:
        reply = await client.call(
            REGISTER,
            {
                "agent_id": args.agent_id,
                "protocol_version": VERSIONS[0],
                "protocol_versions": VERSIONS[1:],
                "provider": "example",
                "model": "rule-based-0",
                "capabilities": CAPABILITIES,
                "supported_tools": [
                    "get_input",
                    "shell",
                    *(["ask_human", "notify"] if args.work else []),
                    *(["handoff_to_agent"] if args.work and args.handoff_to else []),
                ],
                "max_context_size": 16000,
            },
        )
        if reply["outcome"] != "registered":
            refusal = reply["refusal"]
            raise ProtocolFailure(3, f"registration refused ({refusal['reason']}): {refusal['detail']}")
        version = reply["protocol_version"]
        period = args.period_s if args.period_s is not None else reply["heartbeat_interval_s"] / 2
        log.info(
            "registered: version %s, allowed tools %s, heartbeat every %.1fs",
            version,
            reply["policy"]["allowed_tools"],
            period,
        )
        answered: set[int] = set()
        if reply.get("conformance") is not None:
            await answer_round(client, args.agent_id, version, reply["conformance"], answered, args.conformance)
        if args.work:
            await work(client, args, version, period, answered)
        for beat in range(0 if args.work else args.beats):
            if beat:
                await asyncio.sleep(period)  # the heartbeat period itself
            state = "busy" if beat % 2 else "idle"
            ack = await client.call(
                HEARTBEAT,
                {
                    "agent_id": args.agent_id,
                    "timestamp": _now(),
                    "current_state": state,
                    "active_run_id": None,
                    "resource_usage": {"beats": float(beat + 1)},
                    "protocol_version": version,
                },
            )
            if not ack["accepted"]:
                refusal = ack["refusal"]
                raise ProtocolFailure(4, f"heartbeat refused ({refusal['reason']}): {refusal['detail']}")
            if ack.get("conformance") is not None:  # still open: the answers were lost, or it is a new round
                await answer_round(client, args.agent_id, version, ack["conformance"], answered, args.conformance)
            log.info("heartbeat %d: %s, offline at %s unless another comes", beat + 1, ack["state"], ack["offline_at"])
    except ProtocolFailure as failure:
        log.error("%s", failure)
        return failure.code
    finally:
        if version is not None:
            try:
                done = await client.call(
                    DEREGISTER, {"agent_id": args.agent_id, "protocol_version": version, "reason": "example done"}
                )
                log.info("deregistered: %s", done["state"] or done["refusal"])
            except ProtocolFailure as failure:
                log.error("deregistration failed: %s", failure)
        await nc.drain()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["keygen"]:
        gen = argparse.ArgumentParser(prog="agent.py keygen", description="Make the agent's Ed25519 key pair.")
        gen.add_argument("--out", type=Path, required=True, help="where to write the private key (PEM, mode 0600)")
        return keygen(gen.parse_args(argv[1:]).out)
    parser = argparse.ArgumentParser(description="An external agent speaking Temporality's Agent Protocol.")
    parser.add_argument("--nats-url", default="nats://127.0.0.1:4222")
    parser.add_argument(
        "--inbox-prefix",
        default=None,
        help="where replies arrive (default: _INBOX.<user> when --nats-url names a user, else _INBOX)",
    )
    parser.add_argument(
        "--tls-ca",
        type=Path,
        default=os.environ.get("TEMPORALITY_AGENT_NATS_TLS_CA_FILE"),
        help="the CA (PEM) that signed the NATS server's certificate, for a tls:// server with a private CA "
        "(default: $TEMPORALITY_AGENT_NATS_TLS_CA_FILE; unset: the system's trust store)",
    )
    parser.add_argument(
        "--creds-file",
        type=Path,
        default=os.environ.get("TEMPORALITY_NATS_CREDS_FILE") or None,
        help="a NATS credentials file (operator/JWT mode, as `nsc generate creds` writes it) instead of a user in "
        "--nats-url (default: $TEMPORALITY_NATS_CREDS_FILE)",
    )
    parser.add_argument(
        "--nkey-seed-file",
        type=Path,
        default=os.environ.get("TEMPORALITY_NATS_NKEY_SEED_FILE") or None,
        help="a file with the NATS user's nkey seed (SU...) instead of a user in --nats-url "
        "(default: $TEMPORALITY_NATS_NKEY_SEED_FILE)",
    )
    parser.add_argument("--agent-id", default="example-agent")
    parser.add_argument("--schemas", type=Path, default=_DEFAULT_SCHEMAS, help="the published schemas/ folder")
    parser.add_argument("--beats", type=int, default=3, help="heartbeats to send before deregistering")
    parser.add_argument("--period-s", type=float, default=None, help="seconds between heartbeats")
    parser.add_argument("--timeout-s", type=float, default=5.0, help="how long to wait for each reply")
    parser.add_argument(
        "--connect-within-s", type=float, default=15.0, help="give up (exit 6) when NATS is not reached within this"
    )
    parser.add_argument("--work", action="store_true", help="take tasks and do them (instead of --beats heartbeats)")
    parser.add_argument("--tasks", type=int, default=0, help="with --work: stop after this many tasks (0: never)")
    parser.add_argument("--poll-s", type=float, default=1.0, help="with --work: seconds between task polls")
    parser.add_argument(
        "--think-s",
        type=float,
        default=0.0,
        help="with --work: seconds it works on a new task before its first action (heartbeating and polling meanwhile)",
    )
    parser.add_argument(
        "--handoff-to",
        default=None,
        metavar="CARD",
        help="with --work: once the person has answered, hand each task off to this agent card (AP-6) "
        "instead of finishing it",
    )
    parser.add_argument(
        "--conformance",
        choices=["answer", "wrong", "ignore"],
        default="answer",
        help="how to treat the platform's conformance probes (wrong/ignore: see it refuse to verify)",
    )
    parser.add_argument(
        "--key-file", type=Path, default=None, help="its Ed25519 private key (default: $TEMPORALITY_AGENT_KEY_FILE)"
    )
    parser.add_argument(
        "--collab-public-key",
        default=os.environ.get("TEMPORALITY_AGENT_COLLAB_PUBLIC_KEY"),
        help="agent-collab's Ed25519 public key (raw 32 bytes, base64): every reply must be signed with it "
        "(default: $TEMPORALITY_AGENT_COLLAB_PUBLIC_KEY; unset: replies are not checked)",
    )
    parser.add_argument(
        "--collab-key-id", default="agent-collab", help="the key id agent-collab signs its replies with"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
