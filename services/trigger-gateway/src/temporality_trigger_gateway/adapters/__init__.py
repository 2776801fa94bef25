"""Webhook adapters by name: the values a trigger's ``adapter:`` may take."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from temporality_trigger_gateway.adapters.azure_devops import AzureDevOpsPullRequest
from temporality_trigger_gateway.adapters.base import Adapter, SourceEvent

__all__ = ["ADAPTERS", "Adapter", "AzureDevOpsPullRequest", "SourceEvent"]

#: Every adapter this gateway can serve, by name. Stateless instances.
ADAPTERS: Mapping[str, Adapter] = MappingProxyType({a.name: a for a in (AzureDevOpsPullRequest(),)})
