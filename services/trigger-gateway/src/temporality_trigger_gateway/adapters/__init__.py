"""Webhook sources by name: the values a trigger's ``adapter:`` may take. One module per source."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from temporality_trigger_gateway.adapters.azure_devops import AzureDevOpsPullRequest
from temporality_trigger_gateway.adapters.azure_devops_build import AzureDevOpsBuild
from temporality_trigger_gateway.adapters.azure_devops_push import AzureDevOpsPush
from temporality_trigger_gateway.adapters.azure_devops_work_item import AzureDevOpsWorkItem
from temporality_trigger_gateway.adapters.base import Adapter, SourceEvent, WebhookRequest
from temporality_trigger_gateway.adapters.generic import Generic
from temporality_trigger_gateway.adapters.github import GitHub
from temporality_trigger_gateway.adapters.gitlab import GitLab
from temporality_trigger_gateway.adapters.mindmap import MindmapTestCase

__all__ = [
    "ADAPTERS",
    "Adapter",
    "AzureDevOpsBuild",
    "AzureDevOpsPullRequest",
    "AzureDevOpsPush",
    "AzureDevOpsWorkItem",
    "Generic",
    "GitHub",
    "GitLab",
    "MindmapTestCase",
    "SourceEvent",
    "WebhookRequest",
]

#: Every source this gateway can serve, by name. Stateless instances.
ADAPTERS: Mapping[str, Adapter] = MappingProxyType(
    {
        a.name: a
        for a in (
            AzureDevOpsPullRequest(),
            AzureDevOpsWorkItem(),
            AzureDevOpsPush(),
            AzureDevOpsBuild(),
            GitHub(),
            GitLab(),
            Generic(),
            MindmapTestCase(),
        )
    }
)
