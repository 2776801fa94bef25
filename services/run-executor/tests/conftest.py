from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from executor_processes import processes
from executor_support import executor

from temporality_testing.openai_emulator import OpenAIEmulator

__all__ = ["emulator", "executor", "processes"]


@pytest.fixture
async def emulator() -> AsyncIterator[OpenAIEmulator]:
    """The OpenAI-compatible endpoint emulator over real HTTP (the provider's seam), scripted by the test."""
    async with OpenAIEmulator().serve() as emu:
        yield emu
