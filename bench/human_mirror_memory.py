"""What the retention mirror (``human-interaction``'s :class:`ChannelMirror`) costs each replica in memory.

Run: ``.venv/bin/python bench/human_mirror_memory.py [--requests 10000]``

Starts its own nats-server (from the wheel, a temp dir, a free loopback port). One real question is taken in
by the real :class:`RequestHandler` and delivered on Telegram (the Bot API emulator) with the web inbox as
fallback target, so its keys in ``human-channels`` are what a real open request leaves there (the run entry,
Telegram's token, message and sent-copy keys; until 2026-12-06 also an inbox entry per person). ``--requests``
copies of those keys (new request, run and token ids, same values otherwise) are then written to the bucket, and
a fresh mirror reads it (the watch's snapshot, as a replica does when it starts). Memory is Python's own
allocation count (``tracemalloc``) held after the snapshot minus before, and -- with a first mirror, tracemalloc
off -- the process's ``VmRSS`` growth after ``malloc_trim``; per open request and per key. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import logging
import re
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import structlog

from temporality_bus import Bus, NatsSettings, live_entries
from temporality_embedded.natsserver import NatsServer
from temporality_human_interaction.channels import WebInboxAdapter
from temporality_human_interaction.channels.refs import BUCKET_HUMAN_CHANNELS
from temporality_human_interaction.channels.telegram import TelegramAdapter
from temporality_human_interaction.directory import Directory
from temporality_human_interaction.mirror import ChannelMirror
from temporality_human_interaction.requests import RequestHandler
from temporality_protocol import HumanOption, HumanPolicy, HumanRequested, make_event, new_id
from temporality_protocol.catalog import ALL_BUCKETS, ALL_STREAMS
from temporality_testing.telegram_emulator import TelegramEmulator

USERS = {
    "users": {
        "alice": {
            "display_name": "Alice Example",
            "inbox_token": "alice-demo-inbox-token-change-me",
            "preferred": "telegram",
            "fallback": ["web"],
            "channels": {"telegram": {"chat_id": 1001}, "web": {}},
        }
    }
}


def say(line: str = "") -> None:
    sys.stdout.write(f"{line}\n")


def _trim() -> None:
    """Hand the allocator's free pages back to the system (glibc), so VmRSS shows what is held."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def _sample(bus: Bus) -> list[tuple[str, bytes]]:
    """The keys one real open question leaves in ``human-channels`` (delivered on Telegram)."""
    from datetime import UTC, datetime, timedelta

    async with TelegramEmulator().serve() as tg:
        telegram = TelegramAdapter(bus, token=tg.token, base_url=tg.base_url, poll_timeout_s=1)
        async with telegram, WebInboxAdapter() as web:
            handler = RequestHandler(bus, Directory.from_mapping(USERS), {telegram.name: telegram, web.name: web})
            data = HumanRequested(
                request_id=new_id("hreq"),
                run_id=new_id("run"),
                agent="reviewer",
                title="Review PR 42: remove the v1 API",
                recipient="user:alice",
                question="Should the v1 API stay for one more release?",
                context="The PR removes /v1; two internal clients still call it.",
                options=[HumanOption(id="keep-v1", label="Keep v1"), HumanOption(id="drop-v1", label="Drop v1")],
                timeout_s=3600,
                expires_at=datetime.now(UTC) + timedelta(hours=1),
                policy=HumanPolicy(allowed_recipients=["user:alice"]),
                turn=3,
            )
            await handler.handle(make_event(data, source="/temporality/run-executor", run_id=data.run_id))
    kv = await bus.kv(BUCKET_HUMAN_CHANNELS)
    return [(str(e.key), bytes(e.value or b"")) for e in await live_entries(kv, timeout_s=10)]


async def main(requests: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(Path(tmp) / "nats")
        server.start()
        try:
            async with Bus.connect(NatsSettings(url=server.url), name="bench-mirror") as bus:
                await bus.ensure(ALL_STREAMS, ALL_BUCKETS)
                sample = await _sample(bus)
                ids = sorted(
                    {m for key, value in sample for m in re.findall(r"(?:hreq|run)-[0-9a-f]+", key + value.decode())}
                )
                say(f"one open request (Telegram): {len(sample)} keys")
                for key, value in sample:
                    say(f"  {key}  ({len(value)} B value)")
                kv = await bus.kv(BUCKET_HUMAN_CHANNELS)
                started = time.monotonic()
                for n in range(requests):
                    fresh = {old: f"{old.split('-')[0]}-{n:08x}{old.split('-')[1][8:]}" for old in ids}
                    puts = []
                    for key, value in sample:
                        text_key, text_value = key, value.decode()
                        for old, new in fresh.items():
                            text_key, text_value = text_key.replace(old, new), text_value.replace(old, new)
                        # Telegram's token and message keys: unique per request too
                        text_key = re.sub(r"^(telegram\.(?:token|msg)\.)(.*)$", rf"\g<1>{n:08x}\g<2>", text_key)
                        puts.append(kv.put(text_key, text_value.encode()))
                    await asyncio.gather(*puts)
                say(f"wrote {requests} copies in {time.monotonic() - started:.1f} s")

                total = requests + 1
                # 1. resident memory, tracemalloc off (its own bookkeeping would count): freed pages handed back
                gc.collect()
                _trim()
                rss_before = _rss_kb()
                first = ChannelMirror(bus, kv)
                async with first.watching():
                    gc.collect()
                    _trim()
                    rss_held = _rss_kb() - rss_before
                    keys = len(first.entries())
                # 2. Python's allocations held by a mirror, counted by tracemalloc
                del first
                gc.collect()
                tracemalloc.start()
                before = tracemalloc.get_traced_memory()[0]
                second = ChannelMirror(bus, kv)
                async with second.watching():
                    gc.collect()
                    held = tracemalloc.get_traced_memory()[0] - before
                    tracemalloc.stop()
                say(f"mirror: {keys} keys for {total} open requests")
                say(
                    f"python heap held (tracemalloc): {held / 2**20:.1f} MiB = {held / total:.0f} B per open request, "
                    f"{held / keys:.0f} B per key; per 10k open requests: {held / total * 10_000 / 2**20:.1f} MiB"
                )
                say(
                    f"VmRSS held (no tracemalloc, after malloc_trim): {rss_held / 1024:.1f} MiB = "
                    f"{rss_held * 1024 / total:.0f} B per open request; per 10k: {rss_held / 1024 * 10_000 / total:.1f} MiB"
                )
        finally:
            server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))  # figures only
    asyncio.run(main(args.requests))
