"""A stopped ``temporality up`` data directory copied elsewhere is a complete backup (docs/operations.md, "Backup and
restore"): started on the copy, with the original gone, the parked run is still waiting, the same API token and
NATS password are in force, and the answer resumes the run to its end."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import httpx
import pytest
from e2e_support import ALICE
from test_embedded_supervision import Up, park_a_run, run_reaches

from temporality_testing.waiting import eventually

pytestmark = pytest.mark.e2e


async def _answer(up: Up, run_id: str) -> None:
    base = f"http://127.0.0.1:{up.ports['human']}"
    async with httpx.AsyncClient(timeout=10) as http:

        async def question() -> str | None:
            listed = (await http.get(f"{base}/inbox", headers=ALICE)).json()["requests"]
            return next((r["id"] for r in listed if r["run_id"] == run_id), None)

        request_id = await eventually(question, timeout_s=60, what=f"the question of {run_id} in alice's inbox")
        answer = await http.post(f"{base}/requests/{request_id}/answer", json={"option_id": "keep-v1"}, headers=ALICE)
        assert answer.status_code == 200, answer.text
    await run_reaches(up, run_id, "completed")


@pytest.mark.timeout(400)
def test_a_stopped_data_dir_copied_elsewhere_restores_everything(tmp_path: Path) -> None:
    original, copy = tmp_path / "data", tmp_path / "restored"
    up = Up(original)
    try:
        up.ready()
        run_id = asyncio.run(park_a_run(up))
        token = up.token()
    finally:
        assert up.interrupt() == 0, up.output
    passwords = json.loads((original / "nats-users.json").read_text(encoding="utf-8"))

    shutil.copytree(original, copy, symlinks=True)
    shutil.rmtree(original)  # the copy must stand alone

    up = Up(copy)
    try:
        up.ready()
        assert up.token() == token
        assert json.loads((copy / "nats-users.json").read_text(encoding="utf-8")) == passwords
        asyncio.run(run_reaches(up, run_id, "waiting_for_human"))
        asyncio.run(_answer(up, run_id))
    finally:
        assert up.interrupt() == 0, up.output
