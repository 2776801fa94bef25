"""The agent ids a trigger may name, read from the run-executor's agent cards file (``config/agents.yaml``).

Only ``agents[].id`` matters here; every other key of a card is the run-executor's and is ignored, so the
cards can grow without the gateway noticing. The gateway never imports the run-executor: it reads the file.

The file is **re-read while the gateway runs** (:class:`AgentCards`), as the API tokens file is: when a trigger
is validated (the admin API's create, replace, view and preview) and once a second in the background (a
trigger another replica stored is applied with the ids this replica read), the file's state (mtime, ctime,
size, inode) is compared, at most once a second, and a changed file is read again. A card added to the file
(and the run-executor reloaded, docs/operations.md) can get a trigger with no gateway restart. A file that became
unreadable or invalid keeps the ids read before (``triggers.agents_file_invalid`` in the log, once per state of
the file) and the 422 for an unknown agent says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Self

import structlog
import yaml

from temporality_trigger_gateway.errors import TriggerConfigError

if TYPE_CHECKING:
    from temporality_trigger_gateway.store import TriggerRegistry

__all__ = ["RELOAD_EVERY_S", "AgentCards", "AgentIds", "load_agent_ids", "refresh_agents"]

#: How often the agent cards file's state is looked at, at most (the API tokens file's pace).
RELOAD_EVERY_S = 1.0

log = structlog.get_logger(__name__)


class AgentIds(frozenset[str]):
    """A set of agent ids, with ``where`` they were read: the wording of an unknown agent's error."""

    where: str

    def __new__(cls, ids: Iterable[str] = (), where: str = "the agent cards file") -> Self:
        made = super().__new__(cls, ids)
        made.where = where
        return made


def load_agent_ids(path: Path) -> AgentIds:
    """The ``id`` of every card in ``path``; :class:`TriggerConfigError` naming the file when it is unusable."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8-sig"))
    except OSError as exc:
        raise TriggerConfigError(f"{path}: cannot read the agent cards file: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise TriggerConfigError(f"{path}: not valid YAML: {exc}") from None
    cards = data.get("agents") if isinstance(data, dict) else None
    if not isinstance(cards, list):
        raise TriggerConfigError(f"{path}: expected a mapping with an 'agents' list")
    ids: set[str] = set()
    for index, card in enumerate(cards):
        agent_id = card.get("id") if isinstance(card, dict) else None
        if not isinstance(agent_id, str) or not agent_id:
            raise TriggerConfigError(f"{path}: agents[{index}] has no string 'id'")
        ids.add(agent_id)
    return AgentIds(ids, f"the agent cards file {path}")


def _file_version(path: Path) -> tuple[int, ...] | None:
    """What tells a changed file (the file a symlink names: a Kubernetes ConfigMap's update swaps one)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino, st.st_dev)


class AgentCards:
    """The agent cards file, re-read when it changed (module docstring); :meth:`current` is the set to check."""

    def __init__(self, path: Path, *, clock: Callable[[], float] = time.monotonic) -> None:
        """Reads ``path`` now: :class:`TriggerConfigError` when it is unusable (the gateway does not start)."""
        self.path = path
        self._clock = clock
        version = _file_version(path)  # before reading: a change meanwhile is seen at the next look
        self._good = self._ids = load_agent_ids(path)
        self._version: tuple[int, ...] | None = version
        self._refused: tuple[int, ...] | None = None
        self._looked_at = clock()

    def current(self, *, force: bool = False) -> AgentIds:
        """The ids, re-read first if the file changed since it was read (looked at once a second at most,
        unless ``force``); an unusable file keeps the last good ids, whose ``where`` then says why."""
        now = self._clock()
        if not force and now - self._looked_at < RELOAD_EVERY_S:
            return self._ids
        self._looked_at = now
        version = _file_version(self.path) or (-1,)  # (-1,): not there (told once, too)
        if version == self._version:
            self._ids, self._refused = self._good, None  # back as it was read: a later breakage is told again
            return self._ids
        if version == self._refused:
            return self._ids
        try:
            ids = load_agent_ids(self.path)
        except TriggerConfigError as exc:
            log.error("triggers.agents_file_invalid", problem=str(exc), kept_agents=sorted(self._ids))
            self._refused = version
            where = f"the agent cards file {self.path} as last read (its current content is refused: {exc})"
            self._ids = AgentIds(self._good, where[:600])
            return self._ids
        log.info(
            "triggers.agents_reloaded",
            agents_file=str(self.path),
            added=sorted(ids - self._good),
            removed=sorted(self._good - ids),
        )
        self._good = self._ids = ids
        self._version, self._refused = version, None
        return ids

    def follow(self, registry: TriggerRegistry) -> None:
        """Keep ``registry.agents`` current: :func:`refresh_agents` (the admin API) and :meth:`kept_current`."""
        _FOLLOWED[registry] = self
        registry.agents = self._ids

    @contextlib.asynccontextmanager
    async def kept_current(self, registry: TriggerRegistry) -> AsyncIterator[None]:
        """While entered, ``registry.agents`` is refreshed once a second (a record another replica stored is
        checked against the ids of the file as it is now)."""
        self.follow(registry)

        async def loop() -> None:
            while True:
                await asyncio.sleep(RELOAD_EVERY_S)
                refresh_agents(registry)

        task = asyncio.create_task(loop(), name="agent-cards-reload")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


_FOLLOWED: weakref.WeakKeyDictionary[TriggerRegistry, AgentCards] = weakref.WeakKeyDictionary()


def refresh_agents(registry: TriggerRegistry) -> None:
    """Before a validation: ``registry.agents`` as the agent cards file is now (when it is followed)."""
    cards = _FOLLOWED.get(registry)
    if cards is not None:
        registry.agents = cards.current()
