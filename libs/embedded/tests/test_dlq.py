"""``temporality dlq`` against a real nats-server and a real consumer: a poison message is listed and shown,
re-driven to the consumer once its cause is fixed, purged; dry runs change nothing; bad input exits 2."""

from __future__ import annotations

import asyncio
import io
import subprocess
import sysconfig
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from temporality_bus import Bus, Consumer, Delivery, NatsSettings, PermanentError
from temporality_embedded import dlq
from temporality_embedded.natsserver import NatsServer
from temporality_embedded.stack import Stack, StackConfig
from temporality_protocol import Envelope, RunFailed, make_event
from temporality_protocol.catalog import DLQ_PREFIX, DLQ_STREAM, EVENTS_STREAM, ConsumerSpec, subject_for


class Poisoned:
    """A consumer's handler that refuses (a permanent error) every event until :attr:`fixed`, then records it."""

    def __init__(self) -> None:
        self.fixed = False
        self.handled: list[str] = []
        self.seen = asyncio.Event()

    async def __call__(self, event: Envelope, delivery: Delivery) -> None:
        if not self.fixed:
            raise PermanentError(f"no agent card for {event.id}")
        self.handled.append(event.id)
        self.seen.set()


def _spec(durable: str) -> ConsumerSpec:
    return ConsumerSpec(durable, EVENTS_STREAM.name, (subject_for("run.failed"),), "test", backoff_s=(0.1,))


def _event(run_id: str) -> Envelope:
    # the payload holds a credential-like value and a secret in its text: `show` must not print either
    data = RunFailed(
        run_id=run_id, reason="r", error="call failed: Authorization: Bearer abcdefghijklmnopqrstuvwxyz0123"
    )
    return make_event(data, source="/test", id=f"evt-{run_id}")


@asynccontextmanager
async def _running(bus: Bus, spec: ConsumerSpec, handler: Poisoned) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(Consumer(bus, spec, handler=handler).run(stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def _until(check: Callable[[], Awaitable[bool]], what: str, within_s: float = 15.0) -> None:
    deadline = time.monotonic() + within_s
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def _letters(bus: Bus, durable: str) -> list[dlq.DeadLetter]:
    return await dlq.scan(bus, durable)


async def _cli(settings: NatsSettings, *argv: str) -> tuple[int, str, str]:
    """``temporality dlq ARGV`` in a thread (it runs its own event loop): exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    code = await asyncio.to_thread(dlq.main, [*argv, "--nats-url", settings.url], out, err)
    return code, out.getvalue(), err.getvalue()


async def _dead_letter(bus: Bus, durable: str, run_id: str) -> dlq.DeadLetter:
    await bus.publish(_event(run_id))

    async def there() -> bool:
        return any(letter.event_id == f"evt-{run_id}" for letter in await _letters(bus, durable))

    await _until(there, f"the dead letter of {run_id}")
    return next(letter for letter in await _letters(bus, durable) if letter.event_id == f"evt-{run_id}")


async def test_list_show_redrive_after_the_fix(bus: Bus, nats_settings: NatsSettings) -> None:
    spec = _spec("t-dlq-redrive")
    handler = Poisoned()
    async with _running(bus, spec, handler):
        letter = await _dead_letter(bus, spec.durable, "r1")

        code, out, _ = await _cli(nats_settings, "list")
        assert code == 0
        row = next(line for line in out.splitlines() if line.strip().startswith(str(letter.seq)))
        assert spec.durable in row
        assert "PermanentError: no agent card for evt-r1" in row
        assert "run.failed evt-r1" in row
        assert f"{subject_for('run.failed')}#{letter.original_seq}" in row

        code, out, _ = await _cli(nats_settings, "list", "--consumer", "someone-else")
        assert (code, out) == (0, "no dead letters of someone-else in TEMPORALITY_DLQ\n")

        code, out, _ = await _cli(nats_settings, "show", str(letter.seq))
        assert code == 0
        assert '"run_id": "r1"' in out
        assert '"id": "evt-r1"' in out
        assert "Temporality-Error: PermanentError: no agent card for evt-r1" in out
        assert "abcdefghijklmnopqrstuvwxyz0123" not in out, "a secret in the payload was shown"
        assert "[REDACTED:" in out

        # a dry run changes nothing: the letter stays, nothing is published
        before = (await bus.js.stream_info(EVENTS_STREAM.name)).state.last_seq
        code, out, err = await _cli(nats_settings, "redrive", str(letter.seq))
        assert code == 0
        assert out.startswith("DRY RUN (nothing changed; --yes to act): would redrive 1 dead letter(s):")
        assert f"{spec.durable} (which gave up on it) gets it again" in out
        assert "dlq.redriven" not in err
        assert [x.seq for x in await _letters(bus, spec.durable)] == [letter.seq]
        assert (await bus.js.stream_info(EVENTS_STREAM.name)).state.last_seq == before
        assert handler.handled == []

        handler.fixed = True  # the cause is fixed (the agent card deployed)
        code, out, err = await _cli(nats_settings, "redrive", str(letter.seq), "--yes")
        assert code == 0, err
        assert f"redriven {letter.seq} -> {EVENTS_STREAM.name} seq" in out
        assert '"event": "dlq.redriven"' in err
        assert '"event_id": "evt-r1"' in err
        await asyncio.wait_for(handler.seen.wait(), 15)
        assert handler.handled == ["evt-r1"]
        assert await _letters(bus, spec.durable) == []

        redriven = await bus.js.get_msg(
            EVENTS_STREAM.name, seq=(await bus.js.stream_info(EVENTS_STREAM.name)).state.last_seq
        )
        assert redriven.headers is not None
        assert redriven.headers[dlq.REDRIVEN_FROM_HEADER] == f"{DLQ_STREAM.name}#{letter.seq}"
        assert redriven.headers[dlq.REDRIVEN_CONSUMER_HEADER] == spec.durable
        assert dlq.ERROR_HEADER not in redriven.headers


async def test_redrive_by_consumer_takes_only_its_letters(bus: Bus, nats_settings: NatsSettings) -> None:
    mine, other = _spec("t-dlq-mine"), _spec("t-dlq-other")
    handler_mine, handler_other = Poisoned(), Poisoned()
    async with _running(bus, mine, handler_mine), _running(bus, other, handler_other):
        await bus.publish(_event("c1"))
        await bus.publish(_event("c2"))

        async def both() -> bool:
            return len(await _letters(bus, mine.durable)) == 2 and len(await _letters(bus, other.durable)) == 2

        await _until(both, "two dead letters for each consumer")
        handler_mine.fixed = True
        code, out, err = await _cli(nats_settings, "redrive", "--consumer", mine.durable, "--yes")
        assert code == 0, err
        assert "2 dead letter(s) redriven" in out
        await _until(lambda: _true(len(handler_mine.handled) == 2), "both handled by the fixed consumer")
        assert sorted(handler_mine.handled) == ["evt-c1", "evt-c2"]
        assert await _letters(bus, mine.durable) == []
        # the other consumer got the republished events too (it is still broken: they are dead-lettered again),
        # and its own letters were never touched
        await _until(lambda: _count(bus, other.durable, 4), "the other consumer's second copies")


async def _true(value: bool) -> bool:
    return value


async def _count(bus: Bus, durable: str, n: int) -> bool:
    return len(await _letters(bus, durable)) == n


async def test_purge_dry_run_then_for_real(bus: Bus, nats_settings: NatsSettings) -> None:
    spec = _spec("t-dlq-purge")
    handler = Poisoned()
    async with _running(bus, spec, handler):
        first = await _dead_letter(bus, spec.durable, "p1")
        second = await _dead_letter(bus, spec.durable, "p2")
    code, out, err = await _cli(nats_settings, "purge", "--consumer", spec.durable)
    assert code == 0
    assert "DRY RUN" in out
    assert "dlq.purged" not in err
    assert [x.seq for x in await _letters(bus, spec.durable)] == [first.seq, second.seq]

    code, out, err = await _cli(nats_settings, "purge", str(first.seq), "--yes")
    assert code == 0, err
    assert f"purged {first.seq}" in out
    assert '"event": "dlq.purged"' in err
    assert [x.seq for x in await _letters(bus, spec.durable)] == [second.seq]
    assert handler.handled == []


async def test_bad_input_exits_2_and_changes_nothing(bus: Bus, nats_settings: NatsSettings) -> None:
    spec = _spec("t-dlq-bad")
    async with _running(bus, spec, Poisoned()):
        letter = await _dead_letter(bus, spec.durable, "b1")
    code, out, err = await _cli(nats_settings, "show", "99999")
    assert (code, out) == (2, "")
    assert "no dead letter at TEMPORALITY_DLQ sequence 99999" in err
    # one bad sequence among good ones: nothing is done to any
    code, out, err = await _cli(nats_settings, "redrive", str(letter.seq), "99999", "--yes")
    assert (code, out) == (2, "")
    assert "99999" in err
    assert [x.seq for x in await _letters(bus, spec.durable)] == [letter.seq]
    code, out, err = await _cli(nats_settings, "purge", "--yes")
    assert (code, out) == (2, "")
    assert "exactly one" in err
    # a firing of a timer cannot be re-driven: refused, kept
    await bus.publish_raw(
        f"{DLQ_PREFIX}.t-dlq-timer",
        b"{}",
        {"Temporality-Original-Subject": "temporality.timers.fired.human.k1", "Temporality-Consumer": "t-dlq-timer"},
    )
    timer_letter = (await _letters(bus, "t-dlq-timer"))[0]
    code, out, err = await _cli(nats_settings, "redrive", str(timer_letter.seq), "--yes")
    assert (code, out) == (2, "")
    assert "timer firing" in err
    assert len(await _letters(bus, "t-dlq-timer")) == 1

    # the installed command: a sequence that is no number, and one that holds no letter
    temporality = str(Path(sysconfig.get_path("scripts")) / "temporality")
    for argv, says in ((["show", "abc"], "not a DLQ sequence"), (["show", "99999"], "no dead letter")):
        done = await asyncio.to_thread(
            subprocess.run,
            [temporality, "dlq", *argv, "--nats-url", nats_settings.url],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 2, (done.stdout, done.stderr)
        assert says in done.stderr
        assert done.stdout == ""


async def test_unreachable_nats_exits_1() -> None:
    out, err = io.StringIO(), io.StringIO()
    code = await asyncio.to_thread(dlq.main, ["list", "--nats-url", "nats://127.0.0.1:1"], out, err)
    assert code == 1
    assert "error: NATS at nats://127.0.0.1:1" in err.getvalue()
    assert out.getvalue() == ""


async def test_against_temporality_ups_users_via_its_data_dir(tmp_path: Path) -> None:
    """``--data-dir`` of a `temporality up` (its NATS port file and temporality-admin's password): lists and
    purges as the admin; a service's user, which may not delete from the DLQ, gets exit 1 and a clear error."""
    data_dir = tmp_path / "data"
    stack = Stack(StackConfig(data_dir=data_dir, config_dir=tmp_path, nats_auth=True))
    server = NatsServer(data_dir / "nats", users=stack._nats_users())
    server.start()
    try:
        port = server.url.rsplit(":", 1)[1]
        (data_dir / "nats-port").write_text(f"{port}\n", encoding="utf-8")
        admin = stack.nats_admin
        assert admin is not None
        settings = NatsSettings(url=server.url, user=admin[0], password=admin[1], drain_timeout_s=2.0)
        async with Bus.connect(settings, name="test") as bus:
            await bus.ensure([DLQ_STREAM, EVENTS_STREAM])
            await bus.publish_raw(
                f"{DLQ_PREFIX}.t-auth",
                b'{"x": 1}',
                {dlq.ORIGINAL_SUBJECT_HEADER: subject_for("run.failed"), dlq.ERROR_HEADER: "PermanentError: boom"},
            )
            seq = (await _letters(bus, "t-auth"))[0].seq

            out, err = io.StringIO(), io.StringIO()
            code = await asyncio.to_thread(dlq.main, ["list", "--data-dir", str(data_dir)], out, err)
            assert code == 0, err.getvalue()
            assert "PermanentError: boom" in out.getvalue()

            password_file = tmp_path / "pw"
            password_file.write_text(stack._nats_passwords["run-executor"], encoding="utf-8")
            argv = ["purge", str(seq), "--yes", "--nats-url", server.url, "--user", "run-executor"]
            out, err = io.StringIO(), io.StringIO()
            code = await asyncio.to_thread(dlq.main, [*argv, "--password-file", str(password_file)], out, err)
            assert code == 1, (out.getvalue(), err.getvalue())
            assert "is the user dlq-operator" in err.getvalue()
            assert [x.seq for x in await _letters(bus, "t-auth")] == [seq]

            out, err = io.StringIO(), io.StringIO()
            argv = ["purge", str(seq), "--yes", "--data-dir", str(data_dir)]
            code = await asyncio.to_thread(dlq.main, argv, out, err)
            assert code == 0, err.getvalue()
            assert '"user": "temporality-admin"' in err.getvalue()
            assert await _letters(bus, "t-auth") == []
    finally:
        server.stop()
