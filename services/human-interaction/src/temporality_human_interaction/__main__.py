"""``temporality-human-interaction``: the user directory, channel adapters, the request and deadline
consumers, the web-inbox API and the directory API, started by the service runtime.

configure: read the API tokens file and validate the users file (either unusable: exit 2). setup: open
the ``human-directory`` bucket, seed it with the file's users and groups (create-if-absent, each one
created journaled as ``human.directory.changed``), then watch it: the :class:`Directory` every part
reads is the store's, kept current without a restart (ready only once the first snapshot is applied).
It answers the journal's password checks and console-role lookups (:mod:`.passwords`,
``temporality.rpc.human.verify_password`` / ``.console_role``).

``temporality-human-interaction hash-password`` prints the Argon2id hash of a password read from standard
input, for ``password_hash`` in the users file (:func:`.passwords.hash_password_main`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
from collections.abc import AsyncIterator, Awaitable
from datetime import timedelta

import structlog

from temporality_bus import Bus
from temporality_bus.tasks import cancel_and_wait
from temporality_human_interaction.api import create_app
from temporality_human_interaction.chain import ChainRunner
from temporality_human_interaction.channels import ChannelAdapter, WebInboxAdapter
from temporality_human_interaction.channels.lease import InboundLease, lease_key
from temporality_human_interaction.deadlines import DeadlineHandler
from temporality_human_interaction.directory import Directory, DirectoryError, parse_directory, read_directory_file
from temporality_human_interaction.directory_api import group_view, user_view
from temporality_human_interaction.egress import EgressPolicy, PatternError
from temporality_human_interaction.events import SOURCE
from temporality_human_interaction.inbound import AnswerRouter
from temporality_human_interaction.inbox import RetentionSweeper, rebuild_index
from temporality_human_interaction.metrics import HumanMetrics
from temporality_human_interaction.mirror import ChannelMirror
from temporality_human_interaction.notifications import NotificationHandler
from temporality_human_interaction.passwords import ConsoleRoleResponder, PasswordResponder, hash_password_main
from temporality_human_interaction.policies import RunPolicies, RunPolicyHandler
from temporality_human_interaction.records import RecentRecords
from temporality_human_interaction.requests import RequestHandler
from temporality_human_interaction.runs import RunEndHandler
from temporality_human_interaction.settings import Settings
from temporality_human_interaction.store import DirectoryStore, DirectoryWatch, entry_key
from temporality_protocol import derive_id, make_event
from temporality_protocol.catalog import SERVICES
from temporality_protocol.events import HumanDirectoryChanged
from temporality_service import (
    ApiAuth,
    ConfigError,
    Runtime,
    Setup,
    TokenFileError,
    Voucher,
    VouchSecretError,
    serve,
)
from temporality_service.cli import check_arguments

__all__ = ["SPEC", "build_adapters", "check_channel_settings", "configure", "egress_policy", "run", "seed_directory"]

SPEC = SERVICES["human-interaction"]
log = structlog.get_logger(__name__)


def check_channel_settings(settings: Settings) -> None:
    """Half-configured channels fail at start-up (exit 2), before anything connects."""
    if settings.matrix_homeserver is None:
        return
    if settings.matrix_user_id is None:
        raise ConfigError("TEMPORALITY_HUMAN_MATRIX_HOMESERVER is set but TEMPORALITY_HUMAN_MATRIX_USER_ID is not")
    if settings.matrix_password is None and settings.matrix_access_token is None:
        raise ConfigError(
            "TEMPORALITY_HUMAN_MATRIX_HOMESERVER is set but neither TEMPORALITY_HUMAN_MATRIX_PASSWORD nor "
            "TEMPORALITY_HUMAN_MATRIX_ACCESS_TOKEN is"
        )


def egress_policy(settings: Settings) -> EgressPolicy:
    """The egress policy of the settings (HUM-5, SEC-1); a bad extra pattern is a ConfigError naming its key."""
    try:
        return EgressPolicy.build(
            limits=settings.egress_max_chars,
            extra_patterns=settings.egress_redact_patterns,
            default_limit=settings.egress_default_max_chars,
            setting="TEMPORALITY_HUMAN_EGRESS_REDACT_PATTERNS",
        )
    except PatternError as exc:
        raise ConfigError(str(exc)) from exc


def build_adapters(
    settings: Settings, bus: Bus, egress: EgressPolicy | None = None, *, mirror: ChannelMirror | None = None
) -> list[ChannelAdapter]:
    """The transports to start: the web inbox always, each chat transport only when it is configured; each
    sends through ``egress`` (default: the settings' policy). ``mirror``: the replica's mirror of
    ``human-channels``, where a chat transport finds a chat's open questions for a bare message (else: a listing)."""
    policy = egress or egress_policy(settings)
    adapters: list[ChannelAdapter] = [WebInboxAdapter()]
    if settings.telegram_token is not None and settings.telegram_enabled:
        from temporality_human_interaction.channels.telegram import TelegramAdapter  # lazily: python-telegram-bot

        token = settings.telegram_token.get_secret_value()
        adapters.append(
            TelegramAdapter(
                bus,
                token=token,
                base_url=settings.telegram_base_url,
                poll_timeout_s=settings.telegram_poll_timeout_s,
                # one replica at a time polls (issue 11); the lease is per bot (the token's numeric id)
                lease=InboundLease(
                    bus,
                    lease_key("telegram", token.partition(":")[0]),
                    holder=settings.channel_lease_holder,
                    ttl_s=settings.channel_lease_ttl_s,
                    renew_s=settings.channel_lease_renew_s,
                ),
                mirror=mirror,
            )
        )
    if settings.matrix_homeserver is not None:
        check_channel_settings(settings)
        assert settings.matrix_user_id is not None
        from temporality_human_interaction.channels.matrix import MatrixAdapter  # lazily: matrix-nio

        adapters.append(
            MatrixAdapter(
                bus,
                homeserver=settings.matrix_homeserver,
                user_id=settings.matrix_user_id,
                password=settings.matrix_password.get_secret_value() if settings.matrix_password else None,
                access_token=settings.matrix_access_token.get_secret_value() if settings.matrix_access_token else None,
                sync_timeout_s=settings.matrix_sync_timeout_s,
                # one replica at a time syncs (issue 11); the lease is per bot account
                lease=InboundLease(
                    bus,
                    lease_key("matrix", settings.matrix_user_id),
                    holder=settings.channel_lease_holder,
                    ttl_s=settings.channel_lease_ttl_s,
                    renew_s=settings.channel_lease_renew_s,
                ),
                mirror=mirror,
            )
        )
    for adapter in adapters:
        adapter.egress = policy
        adapter.inbox_url = settings.inbox_url
    return adapters


async def seed_directory(bus: Bus, store: DirectoryStore, raw: object, *, by: str) -> int:
    """Create the users file's entries the store does not hold yet, each journaled; how many were created."""
    users, groups = parse_directory(raw)
    created = await store.seed(users, groups, by=by)
    for kind, entry_id, entry, revision in created:
        if entry.user is not None:
            after = user_view(entry_id, entry.user)
        else:
            assert entry.group is not None
            after = group_view(entry_id, entry.group)
        change = HumanDirectoryChanged(
            kind=kind,
            entry_id=entry_id,
            action="created",
            revision=revision,
            changed_by=by,
            changed_fields=sorted(set(after) - {"id", "inbox_token_set", "password_set"}),
            after=after,
        )
        event_id = derive_id("evt", "directory", kind, entry_id, str(revision), "created")
        await bus.publish(
            make_event(change, source=SOURCE, id=event_id, actor=by, correlation_id=entry_key(kind, entry_id))
        )
        log.info("directory.seeded", kind=kind, id=entry_id, revision=revision)
    return len(created)


def configure(settings: Settings) -> Setup[Settings]:
    """Read the API tokens and the user directory and check the channel settings before anything connects
    (invalid: exit 2)."""
    check_channel_settings(settings)
    egress = egress_policy(settings)
    try:
        auth = ApiAuth.from_settings(settings.api)
    except TokenFileError as exc:
        raise ConfigError(str(exc)) from exc
    try:  # a signed-in person's inbox calls, vouched for by the journal (temporality_service.vouch)
        voucher = (
            None if settings.inbox_vouch_secret_file is None else Voucher.from_file(settings.inbox_vouch_secret_file)
        )
    except VouchSecretError as exc:
        raise ConfigError(f"TEMPORALITY_INBOX_VOUCH_SECRET_FILE: {exc}") from exc
    try:
        raw = read_directory_file(settings.users_file)
        seed = Directory.from_mapping(raw)  # validated whole: the same checks as every start
    except DirectoryError as exc:
        raise ConfigError(f"{settings.users_file}: {exc}") from exc
    log.info("directory.file_read", users=len(seed), groups=len(seed.group_ids()), file=str(settings.users_file))
    seeded_by = f"file:{settings.users_file}"

    async def setup(rt: Runtime[Settings]) -> None:
        store = await DirectoryStore.open(rt.bus)
        await seed_directory(rt.bus, store, raw, by=seeded_by)
        directory = Directory()
        watch = DirectoryWatch(directory, store)
        await rt.resources.enter_async_context(watch.watching())
        rt.ready_check("directory-store", watch.check)
        rt.responder(PasswordResponder(rt.bus, directory))  # the console's password sign-in (issue 9)
        rt.responder(ConsoleRoleResponder(rt.bus, directory))  # ... and directory roles for OIDC sign-ins
        adapters: dict[str, ChannelAdapter] = {}
        # deliveries, waits, requests waiting: see .metrics; none with metrics off
        metrics = HumanMetrics(rt.metrics) if rt.metrics is not None else None
        # human-channels as this replica sees it (a KV watch): the retention sweep reads it, and the hot path where
        # a stale value is safe (a policy, the base of a compare-and-set, a request's final state); opened before
        # any consumer runs (its snapshot, the start's one listing of the bucket, is read below)
        mirror = await ChannelMirror.open(rt.bus)
        # the records this replica wrote last: an answer's compare-and-set starts from its request's (no read)
        recent = RecentRecords()
        inbound = AnswerRouter(
            rt.bus,
            directory,
            adapters,
            repair_after_s=rt.settings.answer_repair_after_s,
            egress=egress,
            observer=metrics,
            mirror=mirror,
            recent=recent,
        )
        for adapter in build_adapters(rt.settings, rt.bus, egress, mirror=mirror):
            adapter.attach(inbound)  # every channel hands its answers to the one binding
            adapter.observer = metrics
            adapters[adapter.name] = await rt.resources.enter_async_context(adapter)
        if rt.metrics is not None and metrics is not None:
            metrics.watch_channels(adapters)
            rt.metrics.refresh_every("human requests", functools.partial(metrics.refresh, rt.bus, mirror))
        log.info("channels.ready", channels=sorted(n for n, a in adapters.items() if a.available))
        policies = RunPolicies(rt.bus, wait_deliveries=rt.settings.policy_wait_deliveries, mirror=mirror)  # SEC-1
        # several runs' policies at once (each a create-if-absent of its own key): one at a time, a burst of
        # run.requested left human.requested arriving first and waiting the 0.5 s retry (a quarter of the loops)
        rt.consumer(
            "human-interaction-policies",
            handler=RunPolicyHandler(policies).handle,
            max_inflight=rt.settings.max_inflight,
        )
        requests = RequestHandler(
            rt.bus,
            directory,
            adapters,
            egress=egress,
            policies=policies,
            observer=metrics,
            mirror=mirror,
            recent=recent,
        )
        rt.consumer(
            "human-interaction-requests",
            handler=requests.handle,
            max_inflight=rt.settings.max_inflight,
            # given up: the request completed as stored (listed, expiring), or refused (human.rejected)
            on_dead_letter=requests.on_dead_letter,
        )
        chain = ChainRunner(rt.bus, directory, adapters)  # reminders and escalation (HUM-8)
        await rt.resources.enter_async_context(mirror.watching())  # its snapshot: the start's one listing
        # the indexes: requests an older version stored (or whose entries were lost) are indexed (idempotent),
        # from the snapshot the mirror has just read (not a second listing of the bucket)
        await rebuild_index(rt.bus, entries=mirror.entries())
        sweeper = RetentionSweeper(
            rt.bus,
            retention=timedelta(days=rt.settings.request_retention_days),
            every_s=rt.settings.retention_sweep_every_s,
            resume=requests.resume_parked,  # a parked request whose timer's firing was lost (rolling upgrade)
            mirror=mirror,
        )
        await sweeper.start()
        # one sweep now, beside the start: a lost parked request waits no sweep interval (nor delays readiness)
        await rt.resources.enter_async_context(_in_background(sweeper.sweep_at_start(), "retention sweep at start"))
        deadlines = DeadlineHandler(
            rt.bus,
            on_outcome=inbound.show_outcome,
            chain=chain,
            sweeper=sweeper,
            observer=metrics,
            resume=requests.resume_parked,
            mirror=mirror,
        )
        rt.consumer("human-interaction-deadlines", raw_handler=deadlines.handle)
        run_ends = RunEndHandler(rt.bus, inbound.show_outcome, observer=metrics, mirror=mirror)
        rt.consumer("human-interaction-runs", handler=run_ends.handle)
        notifications = NotificationHandler(rt.bus, directory, adapters, policies=policies)
        rt.consumer(
            "human-interaction-notifications",
            handler=notifications.handle,
            on_dead_letter=notifications.on_dead_letter,  # human.notification_failed
        )
        rt.http(
            create_app(
                rt.settings,
                rt.bus,
                directory,
                inbound,
                store=store,
                auth=auth,
                egress=egress,
                voucher=voucher,
                mirror=mirror,
            )
        )

    return setup


@contextlib.asynccontextmanager
async def _in_background(work: Awaitable[None], name: str) -> AsyncIterator[None]:
    """Run ``work`` as a task while the context is open; cancelled if still running when it closes."""

    async def run() -> None:
        await work

    task = asyncio.create_task(run(), name=name)
    try:
        yield
    finally:
        await cancel_and_wait(task)  # the sweep's KV requests can drop one cancellation (bus.tasks)


COMMANDS = {"hash-password": "read a password on standard input, print its hash for the users file, then exit"}


def run() -> None:
    if check_arguments(SPEC, Settings, commands=COMMANDS) == "hash-password":
        sys.exit(hash_password_main())
    serve(SPEC, Settings, configure)


if __name__ == "__main__":
    run()
