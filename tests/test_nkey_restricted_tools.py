"""The timers migration and ``temporality dlq`` authenticated by an nkey seed file (no user name, as with the
chart's ``nats.auth.credsSecret``) on a real nats-server whose users have exactly the permissions the project
derives for them (``timers-migrate``, ``dlq-operator``): both ask for their replies below their own inbox
(``_INBOX.timers-migrate``, ``_INBOX.dlq-operator``), the only one those permissions let them read, not ``_INBOX``."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest
from test_timers_migrate_role import MIGRATE_COMMAND, migrate_process, older_release

from temporality_bus import Bus, NatsSettings
from temporality_embedded import NatsServer, dlq
from temporality_protocol.catalog import DLQ_STREAM, EVENTS_STREAM
from temporality_protocol.permissions import TIMERS_MIGRATION_USER, Permissions, timers_migration_permissions
from temporality_testing.nats_auth import NkeyUser, nkey_auth_config, nkey_user

SEED = "TEMPORALITY_NATS_NKEY_SEED_FILE"


def _nkey_server(root: Path, users: dict[str, tuple[NkeyUser, Permissions | None]]) -> NatsServer:
    """A nats-server on ``root`` whose users are known by their public nkeys only, each with its permissions
    (``None``: full access)."""
    config = nkey_auth_config(
        root / "nkey-auth.conf",
        [(user, None if permissions is None else permissions.as_config()) for user, permissions in users.values()],
    )
    return NatsServer(root, config_file=config)


@pytest.mark.timeout(240)
async def test_the_timers_migration_runs_with_an_nkey_seed_file_and_its_restricted_permissions(
    tmp_path: Path,
) -> None:
    root = tmp_path / "nats"
    await older_release(root)  # a legacy TEMPORALITY_TIMERS stream to move
    migrator = nkey_user(tmp_path / "keys", TIMERS_MIGRATION_USER)
    server = _nkey_server(root, {TIMERS_MIGRATION_USER: (migrator, timers_migration_permissions())})
    server.start()
    try:
        env = {"TEMPORALITY_NATS_URL": server.url, SEED: str(migrator.seed_file)}
        code, out = await migrate_process(MIGRATE_COMMAND, env)
        assert code == 0, out
        assert "migrated TEMPORALITY_TIMERS" in out, out
        code, out = await migrate_process(MIGRATE_COMMAND, env)  # the next upgrade's Job
        assert code == 0, out
        assert "nothing to migrate" in out, out
    finally:
        server.stop()


async def test_temporality_dlq_lists_with_an_nkey_seed_file_and_the_operator_s_restricted_permissions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    admin = nkey_user(tmp_path / "keys", "admin")
    operator = nkey_user(tmp_path / "keys", dlq.OPERATOR_USER)
    server = _nkey_server(
        tmp_path / "nats", {"admin": (admin, None), dlq.OPERATOR_USER: (operator, dlq.operator_permissions())}
    )
    server.start()
    try:
        async with Bus.connect(
            NatsSettings(url=server.url, nkey_seed_file=admin.seed_file), name="layout"
        ) as bus:  # what the journal lays out
            await bus.ensure([EVENTS_STREAM, DLQ_STREAM])
        monkeypatch.setenv(SEED, str(operator.seed_file))
        out, err = io.StringIO(), io.StringIO()
        code = await asyncio.to_thread(dlq.main, ["list", "--nats-url", server.url], out, err)
        assert code == 0, out.getvalue() + err.getvalue()
        assert "no dead letters" in out.getvalue().lower() or out.getvalue() == "", out.getvalue()
    finally:
        server.stop()
