from __future__ import annotations

from executor_processes import processes
from executor_support import executor

__all__ = ["executor", "processes"]
