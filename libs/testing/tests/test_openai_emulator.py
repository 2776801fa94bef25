"""The OpenAI emulator refuses an invalid tool name as the real API does (400, OpenAI's error shape), over real HTTP."""

from __future__ import annotations

import httpx

from temporality_testing.openai_emulator import OpenAIEmulator, assistant_text


def _tool(name: str) -> dict[str, object]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


async def _post(emu: OpenAIEmulator, tools: list[dict[str, object]]) -> httpx.Response:
    async with httpx.AsyncClient() as http:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools}
        return await http.post(f"{emu.base_url}/chat/completions", json=body)


async def test_a_tool_name_the_real_api_refuses_is_a_400_and_uses_no_scripted_reply() -> None:
    async with OpenAIEmulator(replies=[assistant_text("ok")]).serve() as emu:
        dotted = await _post(emu, [_tool("get_input"), _tool("odd__read.file")])
        assert dotted.status_code == 400
        assert dotted.json() == {
            "error": {
                "message": "Invalid 'tools[1].function.name': string does not match pattern. Expected a string that "
                "matches the pattern '^[a-zA-Z0-9_-]+$'.",
                "type": "invalid_request_error",
                "param": "tools[1].function.name",
                "code": "invalid_value",
            }
        }
        long = await _post(emu, [_tool("x" * 65)])
        assert long.status_code == 400
        assert long.json()["error"]["code"] == "string_above_max_length"
        assert "got a string with length 65" in long.json()["error"]["message"]

        fine = await _post(emu, [_tool("a-Z_09" + "x" * 58)])  # 64 characters
        assert fine.status_code == 200
        assert fine.json()["choices"][0]["message"]["content"] == "ok"
        assert len(emu.requests) == 3  # every request is recorded, refused ones too
