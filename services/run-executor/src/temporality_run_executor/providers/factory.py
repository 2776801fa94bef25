"""One provider per agent card, created on first use and closed at shutdown."""

from __future__ import annotations

import os

from temporality_run_executor.agents import AgentCard
from temporality_run_executor.providers.base import Provider
from temporality_run_executor.providers.openai import OpenAICompatible
from temporality_run_executor.providers.script import BUILTIN_SCRIPTS, Script, ScriptError, load_script
from temporality_run_executor.providers.scripted import ScriptedProvider

__all__ = ["ProviderCache", "ProviderConfigError"]


class ProviderConfigError(Exception):
    pass


class ProviderCache:
    def __init__(self, *, scripted_think_s: float = 0.0, scripted_crash_on: str | None = None) -> None:
        self._think_s = scripted_think_s
        self._crash_on = scripted_crash_on
        self._providers: dict[str, Provider] = {}

    def __call__(self, card: AgentCard) -> Provider:
        if card.id not in self._providers:
            self._providers[card.id] = self._build(card)
        return self._providers[card.id]

    def _build(self, card: AgentCard) -> Provider:
        cfg = card.provider
        if cfg.kind == "scripted":
            return ScriptedProvider(self._script(card), think_s=self._think_s, crash_on=self._crash_on)
        if not cfg.base_url or not cfg.model:
            raise ProviderConfigError(f"agent {card.id}: an openai provider needs base_url and model")
        api_key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
        return OpenAICompatible(
            base_url=cfg.base_url,
            model=cfg.model,
            api_key=api_key,
            api_key_env=cfg.api_key_env,
            api_key_header=cfg.api_key_header,
            timeout_s=cfg.timeout_s,
            max_retries=cfg.max_retries,
            backoff_s=cfg.retry_backoff_s,
            backoff_max_s=cfg.retry_backoff_max_s,
        )

    @staticmethod
    def _script(card: AgentCard) -> Script:
        cfg = card.provider
        if isinstance(cfg.script, Script):
            return cfg.script
        try:
            if cfg.script_file is not None:
                return load_script(cfg.script_file)
            path = BUILTIN_SCRIPTS / f"{cfg.script}.yaml"
            if not path.is_file():
                known = ", ".join(sorted(p.stem for p in BUILTIN_SCRIPTS.glob("*.yaml")))
                raise ProviderConfigError(
                    f"agent {card.id}: provider.script: no script named {cfg.script!r} (known: {known})"
                )
            return load_script(path)
        except ScriptError as exc:
            raise ProviderConfigError(f"agent {card.id}: provider script: {exc}") from exc

    def validate(self, cards: list[AgentCard]) -> None:
        """Fail at start-up, not at the first run, on a bad provider config: a script that does not load, an
        openai provider without base_url or model, an ``api_key_env`` naming a variable that is unset or empty
        (requests would go out with no key and every run fail with a 401 naming nothing)."""
        for card in cards:
            env = card.provider.api_key_env if card.provider.kind == "openai" else None
            if env is not None and not os.environ.get(env, "").strip():
                state = "is not set" if env not in os.environ else "is empty"
                raise ProviderConfigError(
                    f"agent {card.id}: provider.api_key_env: the variable {env} {state} in the executor's "
                    "environment (set it to the endpoint's API key, or drop api_key_env for an endpoint that "
                    "needs none)"
                )
            self(card)

    async def aclose(self) -> None:
        for provider in self._providers.values():
            await provider.aclose()
        self._providers.clear()
