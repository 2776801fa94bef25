"""Every setting a service reads from the environment is in docs/service-conventions.md's table."""

from __future__ import annotations

import importlib

import pytest
from test_deploy_files import _documented_env

from temporality_protocol.catalog import SERVICES
from temporality_service import ServiceSettings

#: The shared groups (nats, log, process, api) are documented once, as TEMPORALITY_NATS_* and so on.
_GROUPS = {"nats", "log", "process", "api"}


def _env_names(name: str) -> set[str]:
    module = importlib.import_module(f"{SERVICES[name].package}.settings")
    settings: type[ServiceSettings] = module.Settings
    prefix = settings.model_config.get("env_prefix", "")
    names = set()
    for field_name, field in settings.model_fields.items():
        if field_name in _GROUPS:
            continue
        alias = field.validation_alias
        names.add(alias if isinstance(alias, str) else f"{prefix}{field_name}".upper())
    return names


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_service_setting_is_documented(name: str) -> None:
    missing = sorted(_env_names(name) - _documented_env())
    assert not missing, f"add to docs/service-conventions.md's environment table: {missing}"
