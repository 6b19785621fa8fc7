"""The official Python MCP client (the `mcp` package, pinned in
requirements.txt) against a real `dk vessel` with a simulated lamp
(`dk device simulate lamp`), over streamable HTTP and through the `dk mcp`
stdio bridge; a camera written here (a v1 device on a raw WebSocket)
whose screenshots reach the client as image content; and a bell written
the same way, on which calls the client gives up while the person is asked
are checked never to ring, and a slow call to run once; and `dk device
voice` on a PulseAudio server of the test's own (its microphone a null
sink's monitor the test plays into with `pacat`, its speaker a null sink
whose monitor it records with `parec`): a tone the agent hears through
`listen` comes back as audio content at its frequency, silence ends it
after the hangover, `say` and `play` reach the speaker, the person is told
who listens and for how long and cannot remember a yes to it without a
rule, and bad input is refused clearly while the device stays up. The
voice cases are skipped when PulseAudio, its tools or espeak-ng are
missing, unless `DK_REQUIRE_PEERS` is set.

Run by `cargo xtask ci` in the virtualenv it keeps under `target/`:

    python tests/python/test_mcp_client.py --dk target/debug/dk

Each case prints `PASS name`, `FAIL name: why` or `SKIP name: why`; the last
line is `python tests: N passed, N failed, N skipped`, and the exit code is 1
when a case failed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import io
import json
import math
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
import wave
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Awaitable, Callable

import httpx2
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

# How long any one wait may take before the case fails. Generous: the
# machine may be loaded; nothing is asserted about time.
PATIENCE = 60.0

LAMP = "desk-lamp"
READ = "device__desk_lamp__read_light"
SET = "device__desk_lamp__set_light"
STROBE = "device__desk_lamp__strobe"
READ_MORE = "read_more"

# set_light is refused by a rule; strobe asks the person every time (its
# manifest says `confirm`).
RULES = """\
version: 1
policies:
  - name: lamp-stays-put
    action: device_use
    condition: "deviceId equals desk-lamp and capability equals set_light"
    decision: block
    message: "The lamp stays as it is"
"""
BLOCK_REASON = "The lamp stays as it is"


class Vessel:
    """A `dk vessel` process with its admin API, MCP listener and a paired,
    connected simulated lamp; stopped by `close`."""

    def __init__(self, dk: Path, root: Path, extra_args: list[str], rules_text: str = RULES):
        self.dk = dk
        self.root = root
        self.data = root / "data"
        self.token_file = root / "admin-token"
        root.mkdir(parents=True, exist_ok=True)
        rules = root / "rules.yaml"
        rules.write_text(rules_text)
        self.log = open(root / "vessel.log", "wb")
        self.process = subprocess.Popen(
            [str(dk), "vessel", "--no-prompt",
             "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
             "--mcp-listen", "127.0.0.1:0",
             "--data-dir", str(self.data), "--admin-token-file", str(self.token_file),
             "--policies", str(rules), *extra_args],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        self.lamp: subprocess.Popen[bytes] | None = None
        address = wait_for("vessel.json", self._address)
        self.devices = address["devices"]
        self.admin_addr = address["admin"]
        self.mcp = address["mcp"]
        self.url = f"http://{self.mcp}/mcp"
        self.admin_token = self.token_file.read_text().strip()

    def _address(self) -> dict[str, Any] | None:
        if self.process.poll() is not None:
            raise RuntimeError(f"dk vessel exited: {self.process.returncode}\n{self.read_log()}")
        try:
            return json.loads((self.data / "vessel.json").read_text())
        except (OSError, ValueError):
            return None

    def read_log(self) -> str:
        self.log.flush()
        return (self.root / "vessel.log").read_text(errors="replace")

    def admin(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """One admin API request: the status and the JSON answer (or None)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://{self.admin_addr}{path}", data=data, method=method,
            headers={"Authorization": f"Bearer {self.admin_token}",
                     "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=PATIENCE) as answer:
                status, text = answer.status, answer.read()
        except urllib.error.HTTPError as error:
            status, text = error.code, error.read()
        return status, (json.loads(text) if text.strip() else None)

    async def admin_async(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return await asyncio.to_thread(self.admin, method, path, body)

    def pair_lamp(self, grant: list[str]) -> None:
        self.lamp = subprocess.Popen(
            [str(self.dk), "device", "simulate", "lamp", "--vessel", f"ws://{self.devices}/device",
             "--key-file", str(self.root / "lamp.key")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.approve_pairing(LAMP, grant)

    def approve_pairing(self, device: str, grant: list[str]) -> None:
        """Grants `grant` to `device`'s pairing request, once it comes, and
        waits for the device to connect."""

        def consent() -> int | None:
            _, pending = self.admin("GET", "/v1/pending")
            for prompt in pending or []:
                if prompt.get("kind") == "consent" and prompt["request"]["deviceId"] == device:
                    return prompt["id"]
            return None

        prompt = wait_for(f"{device}'s pairing request", consent)
        status, _ = self.admin("POST", f"/v1/pending/{prompt}/consent",
                               {"approved": True, "grant": grant})
        check(status == 204, f"consent answered {status}")

        def connected() -> bool | None:
            _, devices = self.admin("GET", "/v1/devices")
            return True if any(d["id"] == device and d["connected"] for d in devices or []) else None

        wait_for(f"{device} to connect", connected)

    def audit_entries(self) -> list[dict[str, Any]]:
        """The last 1,000 entries of the audit log, read with `dk audit tail`
        while the vessel runs."""
        out = subprocess.run(
            [str(self.dk), "audit", "tail", "--json", "-n", "1000", "--data-dir", str(self.data)],
            env={**os.environ, "DK_HOME": str(self.root / "audit-home")},
            stdin=subprocess.DEVNULL, capture_output=True, timeout=PATIENCE, check=False)
        check(out.returncode == 0, f"dk audit tail: {out.stderr.decode(errors='replace')}")
        return [json.loads(line) for line in out.stdout.decode().splitlines() if line.strip()]

    def add_agent(self, name: str, scope: list[str], role: str = "user") -> str:
        status, body = self.admin("POST", "/v1/agents", {"name": name, "scope": scope, "role": role})
        check(status == 201, f"adding agent {name}: {status} {body}")
        return body["credential"]

    def close(self) -> None:
        for process in (self.lamp, self.process):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
        self.log.close()


def wait_for(what: str, probe: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + PATIENCE
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


async def wait_for_async(what: str, probe: Callable[[], Awaitable[Any]]) -> Any:
    deadline = time.monotonic() + PATIENCE
    while True:
        value = await probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def check(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def http_client(url: str, credential: str | None, *, extra_headers: dict[str, str] | None = None,
                **kwargs: Any) -> Client:
    """A client over streamable HTTP with the agent's bearer credential (and
    `extra_headers` on every request)."""
    headers = {} if credential is None else {"Authorization": f"Bearer {credential}"}
    headers.update(extra_headers or {})
    transport = streamable_http_client(url, http_client=create_mcp_http_client(headers=headers))
    return Client(transport, read_timeout_seconds=PATIENCE, **kwargs)


def session_recording_client(url: str, credential: str, seen: list[str], **kwargs: Any) -> Client:
    """A client over streamable HTTP that notes every `Mcp-Session-Id` the
    server hands it in `seen`."""

    async def note(response: httpx2.Response) -> None:
        session = response.headers.get("mcp-session-id")
        if session and session not in seen:
            seen.append(session)

    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {credential}"},
        timeout=httpx2.Timeout(30.0, read=300.0),
        event_hooks={"response": [note]})
    transport = streamable_http_client(url, http_client=http)
    return Client(transport, read_timeout_seconds=PATIENCE, **kwargs)


def stdio_client(dk: Path, url: str, credential: str, **kwargs: Any) -> Client:
    """A client that launches `dk mcp`, as a desktop MCP client would."""
    params = StdioServerParameters(command=str(dk), args=["mcp", "--vessel", url],
                                   env={"DK_AGENT_CREDENTIAL": credential})
    return Client(params, read_timeout_seconds=PATIENCE, **kwargs)


def names(listed: types.ListToolsResult) -> list[str]:
    return [tool.name for tool in listed.tools]


def text_of(result: types.CallToolResult) -> str:
    return " ".join(getattr(block, "text", "") for block in result.content)


async def listed_names(client: Client) -> list[str]:
    return names(await client.list_tools(cache_mode="bypass"))


class Suite:
    """The cases, run in order against one vessel."""

    def __init__(self, dk: Path, vessel: Vessel):
        self.dk = dk
        self.vessel = vessel
        self.main = vessel.add_agent("main", [LAMP])
        self.narrow = vessel.add_agent("narrow", [f"{LAMP}:read_light"])
        self.forger = vessel.add_agent("forger", [f"{LAMP}:read_light"])
        self.runner = vessel.add_agent("runner", [f"{LAMP}:read_light"])
        self.intruder = vessel.add_agent("intruder", [LAMP])

    # -- over streamable HTTP, the client's default (server/discover) ------

    async def test_negotiates_the_2026_lifecycle(self) -> None:
        async with http_client(self.vessel.url, self.main) as client:
            check(client.protocol_version == "2026-07-28", f"negotiated {client.protocol_version}")

    async def test_lists_only_granted_tools_in_scope(self) -> None:
        async with http_client(self.vessel.url, self.main) as client:
            listed = await client.list_tools(cache_mode="bypass")
            check(names(listed) == [READ, SET, STROBE, READ_MORE], f"tools: {names(listed)}")
            read = listed.tools[0]
            check(read.annotations is not None and read.annotations.read_only_hint is True,
                  f"read_light annotations: {read.annotations}")
            strobe = listed.tools[2]
            check("asked to approve every call" in (strobe.description or ""),
                  f"strobe description: {strobe.description}")

    async def test_calls_an_allowed_tool(self) -> None:
        async with http_client(self.vessel.url, self.main) as client:
            result = await client.call_tool(READ, {})
            check(not result.is_error, f"refused: {text_of(result)}")
            check(isinstance(result.structured_content, dict), f"result: {result}")
            check("on" in result.structured_content, f"result: {result.structured_content}")

    async def test_a_rule_refuses_a_call_with_its_reason(self) -> None:
        async with http_client(self.vessel.url, self.main) as client:
            result = await client.call_tool(SET, {"on": True})
            check(result.is_error, f"not refused: {result}")
            check(BLOCK_REASON in text_of(result), f"reason: {text_of(result)}")

    async def approval(self, approved: bool) -> types.CallToolResult:
        async with http_client(self.vessel.url, self.main) as client:
            call = asyncio.create_task(client.call_tool(STROBE, {}))

            async def pending() -> int | None:
                if call.done():
                    raise AssertionError(f"answered before the person: {call.result()}")
                _, prompts = await self.vessel.admin_async("GET", "/v1/pending")
                for prompt in prompts or []:
                    if prompt.get("kind") == "approval":
                        return prompt["id"]
                return None

            prompt = await wait_for_async("the approval prompt", pending)
            status, _ = await self.vessel.admin_async(
                "POST", f"/v1/pending/{prompt}/approval", {"approved": approved})
            check(status == 204, f"approval answered {status}")
            return await asyncio.wait_for(call, PATIENCE)

    async def test_a_call_waits_for_the_persons_yes(self) -> None:
        result = await self.approval(True)
        check(not result.is_error, f"refused after a yes: {text_of(result)}")

    async def test_a_call_the_person_refuses(self) -> None:
        result = await self.approval(False)
        check(result.is_error, f"not refused after a no: {result}")
        check(text_of(result) != "", "no reason given")

    async def test_list_changed_after_a_revoke_and_a_grant(self) -> None:
        async with http_client(self.vessel.url, self.main) as client:
            async with client.listen(tools_list_changed=True) as events:
                status, _ = await self.vessel.admin_async(
                    "DELETE", f"/v1/devices/{LAMP}/grants/set_light")
                check(status == 204, f"revoke answered {status}")
                event = await asyncio.wait_for(anext(events), PATIENCE)
                check(type(event).__name__ == "ToolsListChanged", f"event: {event!r}")
                check(SET not in await listed_names(client), "set_light still listed")
                status, _ = await self.vessel.admin_async(
                    "PUT", f"/v1/devices/{LAMP}/grants/set_light")
                check(status == 204, f"grant answered {status}")
                event = await asyncio.wait_for(anext(events), PATIENCE)
                check(type(event).__name__ == "ToolsListChanged", f"event: {event!r}")
                check(SET in await listed_names(client), "set_light not listed again")

    async def test_no_credential_is_refused_with_no_tools(self) -> None:
        refused = False
        try:
            async with http_client(self.vessel.url, None) as client:
                await client.list_tools(cache_mode="bypass")
        except Exception:  # noqa: BLE001 - any refusal will do; the raw check below names it
            refused = True
        check(refused, "a client without a credential was served")
        async with httpx2.AsyncClient() as raw:
            answer = await raw.post(
                self.vessel.url,
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
                headers={"Accept": "application/json, text/event-stream"})
        check(answer.status_code == 401, f"status {answer.status_code}")
        check("device__" not in answer.text, f"answer names a tool: {answer.text}")
        check(answer.headers.get("www-authenticate", "").startswith("Bearer"),
              f"headers: {answer.headers}")

    async def test_a_narrow_scope_sees_and_calls_only_its_part(self) -> None:
        async with http_client(self.vessel.url, self.narrow) as client:
            listed = await listed_names(client)
            check(listed == [READ, READ_MORE], f"narrow agent sees {listed}")
            result = await client.call_tool(READ, {})
            check(not result.is_error, f"refused: {text_of(result)}")
            result = await client.call_tool(SET, {"on": True})
            check(result.is_error, "an out-of-scope call went through")
            check('is not in the scope of agent "narrow"' in text_of(result),
                  f"reason: {text_of(result)}")

    async def test_a_made_up_session_id_does_not_escape_a_run_budget(self) -> None:
        # Each call from a fresh client naming a session the vessel never
        # issued, all in one run of at most 4 calls: the run is the agent's
        # whatever the session, so 4 go through, and no made-up id reaches a
        # decision record.
        made_up = [uuid.uuid4().hex for _ in range(10)]
        run = {"dk/run": "forged", "dk/runLimits": {"maxToolCalls": 4}}
        outcomes = []
        for session in made_up:
            async with http_client(self.vessel.url, self.forger,
                                   extra_headers={"Mcp-Session-Id": session}) as client:
                outcomes.append(await client.call_tool(READ, {}, meta=run))
        allowed = [r for r in outcomes if not r.is_error]
        refused = [r for r in outcomes if r.is_error]
        check(len(allowed) == 4, f"{len(allowed)} of 10 calls went through")
        for result in refused:
            check('the budget of run "forged" is spent' in text_of(result),
                  f"reason: {text_of(result)}")
        status, decisions = await self.vessel.admin_async("GET", "/v1/decisions")
        check(status == 200, f"decisions answered {status}")
        mine = [d for d in decisions if d.get("agentId") == "forger"]
        check(len(mine) == 10, f"{len(mine)} decisions recorded")
        check(all(d.get("sessionId") is None for d in mine),
              f"sessions recorded: {sorted({d.get('sessionId') for d in mine} - {None})}")

    async def test_a_run_named_in_meta_is_refused_past_its_budget(self) -> None:
        # The `_meta` run key of tools/call: past the run's maxToolCalls every
        # call of the run is refused, and recorded; calls outside the run, and
        # in another run, go on. A limit the vessel does not enforce is
        # refused with why.
        spent = ('[8dk-deny] run limit maxToolCalls of 3 exceeded: '
                 'the budget of run "py-task-1" is spent')
        task = {"dk/run": "py-task-1", "dk/runLimits": {"maxToolCalls": 3}}
        async with http_client(self.vessel.url, self.runner, mode="legacy") as client:
            for i in range(3):
                result = await client.call_tool(READ, {}, meta=task)
                check(not result.is_error, f"call {i} refused: {text_of(result)}")
            for meta in (task, {"dk/run": "py-task-1"}):
                result = await client.call_tool(READ, {}, meta=meta)
                check(result.is_error and text_of(result) == spent, f"past the run: {text_of(result)}")
            for meta in (None, {"dk/run": "py-task-2"}):
                result = await client.call_tool(READ, {}, meta=meta)
                check(not result.is_error, f"outside the run ({meta}): {text_of(result)}")
            result = await client.call_tool(
                READ, {}, meta={"dk/run": "py-task-3", "dk/runLimits": {"maxTurns": 4}})
            check(result.is_error and "the vessel does not enforce maxTurns" in text_of(result),
                  f"maxTurns: {text_of(result)}")
        # The same run from a client of the other lifecycle is still spent.
        async with http_client(self.vessel.url, self.runner) as client:
            result = await client.call_tool(READ, {}, meta={"dk/run": "py-task-1"})
            check(result.is_error and text_of(result) == spent, f"other lifecycle: {text_of(result)}")
        status, decisions = await self.vessel.admin_async("GET", "/v1/decisions")
        check(status == 200, f"decisions answered {status}")
        refused = [d for d in decisions if d.get("agentId") == "runner" and not d["allowed"]]
        check([d["reason"] for d in refused].count(spent) == 3, f"refusals recorded: {refused}")

    # -- the older initialize handshake ------------------------------------

    async def test_initialize_handshake_lists_and_calls(self) -> None:
        async with http_client(self.vessel.url, self.main, mode="legacy") as client:
            check(client.protocol_version == "2025-11-25", f"negotiated {client.protocol_version}")
            check(await listed_names(client) == [READ, SET, STROBE, READ_MORE], "tools differ")
            result = await client.call_tool(READ, {})
            check(not result.is_error, f"refused: {text_of(result)}")

    async def test_initialize_handshake_hears_list_changed(self) -> None:
        heard: asyncio.Queue[str] = asyncio.Queue()

        async def on_message(message: Any) -> None:
            if isinstance(message, types.ToolListChangedNotification):
                await heard.put(message.method)

        async with http_client(self.vessel.url, self.main, mode="legacy",
                               message_handler=on_message) as client:
            await listed_names(client)
            await self.revoke_and_grant_set_light(heard)

    async def test_another_agent_cannot_use_a_session(self) -> None:
        heard: asyncio.Queue[str] = asyncio.Queue()

        async def on_message(message: Any) -> None:
            if isinstance(message, types.ToolListChangedNotification):
                await heard.put(message.method)

        sessions: list[str] = []
        async with session_recording_client(self.vessel.url, self.main, sessions, mode="legacy",
                                            message_handler=on_message) as client:
            check(await listed_names(client) == [READ, SET, STROBE, READ_MORE], "tools differ")
            check(len(sessions) == 1, f"sessions: {sessions}")
            headers = {"Authorization": f"Bearer {self.intruder}",
                       "Mcp-Session-Id": sessions[0],
                       "MCP-Protocol-Version": client.protocol_version,
                       "Accept": "application/json, text/event-stream"}
            listing = {"jsonrpc": "2.0", "id": 9, "method": "tools/list", "params": {}}
            answers = {}
            # POST would call in the session, GET hear its notifications,
            # DELETE end it. One connection each: a refusal leaves the body
            # of the request unread, so the vessel may close the connection.
            for method in ("POST", "GET", "DELETE"):
                async with httpx2.AsyncClient(timeout=PATIENCE) as raw:
                    answers[method] = await raw.request(
                        method, self.vessel.url, headers=headers,
                        json=listing if method == "POST" else None)
            for method, answer in answers.items():
                check(answer.status_code == 404, f"{method}: {answer.status_code} {answer.text}")
                check("device__" not in answer.text, f"{method} answer names a tool: {answer.text}")
            # The session is alive and its own client still hears it.
            result = await client.call_tool(READ, {})
            check(not result.is_error, f"refused: {text_of(result)}")
            await self.revoke_and_grant_set_light(heard)

    async def revoke_and_grant_set_light(self, heard: asyncio.Queue[str]) -> None:
        # The standalone stream opens after the handshake; a change made before
        # it is open would go unheard, so the revoke is repeated until heard.
        async def revoke_heard() -> bool | None:
            await self.vessel.admin_async("PUT", f"/v1/devices/{LAMP}/grants/set_light")
            await self.vessel.admin_async("DELETE", f"/v1/devices/{LAMP}/grants/set_light")
            try:
                await asyncio.wait_for(heard.get(), 0.5)
                return True
            except TimeoutError:
                return None

        await wait_for_async("list_changed after a revoke", revoke_heard)
        while not heard.empty():
            heard.get_nowait()
        await self.vessel.admin_async("PUT", f"/v1/devices/{LAMP}/grants/set_light")
        method = await asyncio.wait_for(heard.get(), PATIENCE)
        check(method == "notifications/tools/list_changed", f"heard {method}")

    # -- through the dk mcp stdio bridge -----------------------------------

    async def test_stdio_bridge_lists_and_calls(self) -> None:
        async with stdio_client(self.dk, self.vessel.url, self.main) as client:
            check(client.protocol_version == "2026-07-28", f"negotiated {client.protocol_version}")
            check(await listed_names(client) == [READ, SET, STROBE, READ_MORE], "tools differ")
            result = await client.call_tool(READ, {})
            check(not result.is_error, f"refused: {text_of(result)}")
            result = await client.call_tool(SET, {"on": True})
            check(result.is_error and BLOCK_REASON in text_of(result), f"not refused: {result}")

    async def test_stdio_bridge_carries_subscriptions_listen(self) -> None:
        async with stdio_client(self.dk, self.vessel.url, self.main) as client:
            async with client.listen(tools_list_changed=True) as events:
                # The listen stays open while other requests go through.
                check(SET in await listed_names(client), "set_light not listed")
                status, _ = await self.vessel.admin_async(
                    "DELETE", f"/v1/devices/{LAMP}/grants/set_light")
                check(status == 204, f"revoke answered {status}")
                event = await asyncio.wait_for(anext(events), PATIENCE)
                check(type(event).__name__ == "ToolsListChanged", f"event: {event!r}")
                check(SET not in await listed_names(client), "set_light still listed")
                status, _ = await self.vessel.admin_async(
                    "PUT", f"/v1/devices/{LAMP}/grants/set_light")
                check(status == 204, f"grant answered {status}")
                event = await asyncio.wait_for(anext(events), PATIENCE)
                check(type(event).__name__ == "ToolsListChanged", f"event: {event!r}")

    async def test_stdio_bridge_with_the_initialize_handshake(self) -> None:
        heard: asyncio.Queue[str] = asyncio.Queue()

        async def on_message(message: Any) -> None:
            if isinstance(message, types.ToolListChangedNotification):
                await heard.put(message.method)

        async with stdio_client(self.dk, self.vessel.url, self.main, mode="legacy",
                                message_handler=on_message) as client:
            check(client.protocol_version == "2025-11-25", f"negotiated {client.protocol_version}")
            check(await listed_names(client) == [READ, SET, STROBE, READ_MORE], "tools differ")
            result = await client.call_tool(READ, {})
            check(not result.is_error, f"refused: {text_of(result)}")
            await self.revoke_and_grant_set_light(heard)

    async def test_stdio_bridge_waits_for_the_person_without_blocking(self) -> None:
        async with stdio_client(self.dk, self.vessel.url, self.main) as client:
            call = asyncio.create_task(client.call_tool(STROBE, {}))

            async def pending() -> int | None:
                _, prompts = await self.vessel.admin_async("GET", "/v1/pending")
                for prompt in prompts or []:
                    if prompt.get("kind") == "approval":
                        return prompt["id"]
                return None

            prompt = await wait_for_async("the approval prompt", pending)
            # While the call waits, other requests go through the bridge.
            result = await client.call_tool(READ, {})
            check(not result.is_error, f"refused: {text_of(result)}")
            check(not call.done(), "the waiting call was answered before the person")
            await self.vessel.admin_async("POST", f"/v1/pending/{prompt}/approval", {"approved": True})
            result = await asyncio.wait_for(call, PATIENCE)
            check(not result.is_error, f"refused after a yes: {text_of(result)}")


class ReadMoreSuite:
    """`read_more`, against a vessel whose threshold (16 bytes) makes a lamp
    reading a large result; run only when the vessel has the option."""

    THRESHOLD = 16

    def __init__(self, dk: Path, vessel: Vessel):
        self.dk = dk
        self.vessel = vessel
        self.main = vessel.add_agent("main", [LAMP])

    async def read_all(self, client: Client) -> None:
        first = await client.call_tool(READ, {})
        check(not first.is_error, f"refused: {text_of(first)}")
        page = first.structured_content
        check(isinstance(page, dict) and page.get("truncated") is True, f"not paged: {page}")
        check(page["offset"] == 0 and isinstance(page["handle"], str), f"first page: {page}")
        chunks = [page["chunk"]]
        while page["nextOffset"] is not None:
            check(len(chunks) <= page["totalBytes"], "paging does not move on")
            result = await client.call_tool(
                READ_MORE, {"handle": page["handle"], "offset": page["nextOffset"]})
            check(not result.is_error, f"read_more refused: {text_of(result)}")
            page = result.structured_content
            check(len(page["chunk"].encode()) <= max(self.THRESHOLD, 4), f"chunk too long: {page}")
            chunks.append(page["chunk"])
        joined = "".join(chunks)
        check(len(joined.encode()) == first.structured_content["totalBytes"],
              f"{len(joined.encode())} bytes joined, {first.structured_content['totalBytes']} told")
        reading = json.loads(joined)
        check(isinstance(reading, dict) and "on" in reading, f"joined result: {reading}")
        check(len(chunks) > 1, "one chunk only")
        unknown = await client.call_tool(READ_MORE, {"handle": "rm_nothing", "offset": 0})
        check(unknown.is_error and "unknown" in text_of(unknown), f"unknown handle: {unknown}")

    async def read_by_handle(self, client: Client) -> None:
        listed = await client.list_tools(cache_mode="bypass")
        read_more = next(t for t in listed.tools if t.name == READ_MORE)
        check(read_more.input_schema.get("required") == ["handle"],
              f"read_more schema: {read_more.input_schema}")
        first = await client.call_tool(READ, {})
        page = first.structured_content
        check(isinstance(page, dict) and page.get("truncated") is True, f"not paged: {page}")
        chunks = [page["chunk"]]
        while page["truncated"]:
            check(len(chunks) <= page["totalBytes"], "paging does not move on")
            result = await client.call_tool(READ_MORE, {"handle": page["handle"]})
            check(not result.is_error, f"read_more refused: {text_of(result)}")
            page = result.structured_content
            check(page["offset"] == len("".join(chunks).encode()), f"out of order: {page}")
            chunks.append(page["chunk"])
        joined = "".join(chunks)
        check(len(joined.encode()) == page["totalBytes"], f"{len(joined.encode())} bytes joined")
        check("on" in json.loads(joined), f"joined result: {joined}")
        done = await client.call_tool(READ_MORE, {"handle": page["handle"]})
        check(done.is_error and "has no more" in text_of(done), f"past the end: {done}")
        again = await client.call_tool(READ_MORE, {"handle": page["handle"], "offset": 0})
        check(not again.is_error and again.structured_content["chunk"] == chunks[0],
              f"read again: {again}")

    async def test_read_more_pages_a_large_result(self) -> None:
        async with http_client(self.vessel.url, self.main) as client:
            await self.read_all(client)

    async def test_read_more_with_the_handle_alone(self) -> None:
        async with http_client(self.vessel.url, self.main) as client:
            await self.read_by_handle(client)
        async with http_client(self.vessel.url, self.main, mode="legacy") as client:
            await self.read_by_handle(client)

    async def test_read_more_through_the_stdio_bridge(self) -> None:
        async with stdio_client(self.dk, self.vessel.url, self.main, mode="legacy") as client:
            await self.read_all(client)


# A 2x1 PNG: a red pixel, then a blue one.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000020000000108020000007b40e8dd"
    "0000000d4944415478da63f8cf0004ff01070001ff3d7d8c490000000049454e44ae426082")
CAMERA = "camera"
SCREENSHOT = "device__camera__screenshot"
CAMERA_MANIFEST = {
    "id": CAMERA, "name": "Camera", "kind": "camera", "version": "1",
    "capabilities": [{"name": "screenshot", "kind": "sensor",
                      "description": "A picture of the screen."}],
}


def screenshot_result() -> dict[str, Any]:
    """What the camera answers: the shape `dk device desktop` gives a screenshot."""
    data = base64.b64encode(PNG).decode()
    return {"width": 2, "height": 1, "blacked_out": 0,
            "image": {"type": "image", "mimeType": "image/png", "data": data}}


class RawDevice:
    """A device speaking plain 8DK v1, which the vessel takes on loopback,
    on a WebSocket written here (the standard library has none): it says
    `device:hello` with `manifest`, notes every `device:invoke` it receives
    (so a test can check on the device what reached it), and answers each
    with `answer(capability)` after `delay(capability)` seconds, from a
    thread of its own so that pings are still answered meanwhile."""

    def __init__(self, devices: str, manifest: dict[str, Any]):
        host, port = devices.rsplit(":", 1)
        self.socket = socket.create_connection((host, int(port)), timeout=PATIENCE)
        key = base64.b64encode(os.urandom(16)).decode()
        self.socket.sendall(
            f"GET /device HTTP/1.1\r\nHost: {devices}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode())
        self.buffer = b""
        while b"\r\n\r\n" not in self.buffer:
            self.buffer += self.read_some()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        check(head.startswith(b"HTTP/1.1 101"), f"upgrade answered {head!r}")
        self.writing = threading.Lock()
        self.send(0x1, json.dumps({"type": "device:hello", "manifest": manifest}).encode())
        self.invoked: list[str] = []
        self.answering: list[threading.Thread] = []
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    @property
    def calls(self) -> int:
        return len(self.invoked)

    def calls_of(self, capability: str) -> int:
        return self.invoked.count(capability)

    def answer(self, capability: str) -> Any:
        return {}

    def delay(self, capability: str) -> float:
        return 0.0

    def read_some(self) -> bytes:
        data = self.socket.recv(65536)
        if not data:
            raise ConnectionError("the vessel closed the connection")
        return data

    def read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            self.buffer += self.read_some()
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def send(self, opcode: int, payload: bytes) -> None:
        """One masked frame, as a client sends them."""
        n = len(payload)
        if n < 126:
            header = bytes([0x80 | opcode, 0x80 | n])
        elif n < 1 << 16:
            header = bytes([0x80 | opcode, 0x80 | 126]) + n.to_bytes(2, "big")
        else:
            header = bytes([0x80 | opcode, 0x80 | 127]) + n.to_bytes(8, "big")
        mask = os.urandom(4)
        with self.writing:
            self.socket.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def frame(self) -> tuple[int, bytes]:
        """The next frame from the vessel (never masked nor fragmented here)."""
        first, second = self.read(2)
        n = second & 0x7F
        if n == 126:
            n = int.from_bytes(self.read(2), "big")
        elif n == 127:
            n = int.from_bytes(self.read(8), "big")
        return first & 0x0F, self.read(n)

    def serve(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            while True:
                opcode, payload = self.frame()
                if opcode == 0x8:
                    return
                if opcode == 0x9:
                    self.send(0xA, payload)
                    continue
                message = json.loads(payload)
                if message.get("type") == "device:invoke":
                    capability = message["capability"]
                    self.invoked.append(capability)
                    answering = threading.Thread(
                        target=self.finish, args=(message["callId"], capability), daemon=True)
                    self.answering.append(answering)
                    answering.start()

    def finish(self, call_id: str, capability: str) -> None:
        time.sleep(self.delay(capability))
        answer = {"type": "device:result", "callId": call_id, "ok": True,
                  "result": self.answer(capability)}
        with contextlib.suppress(OSError):
            self.send(0x1, json.dumps(answer).encode())

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.socket.shutdown(socket.SHUT_RDWR)
        self.socket.close()
        self.thread.join(PATIENCE)
        for answering in self.answering:
            answering.join(PATIENCE)


class Camera(RawDevice):
    """A camera whose every call answers `screenshot_result()`, so that no
    device program has to return pictures."""

    def __init__(self, devices: str):
        super().__init__(devices, CAMERA_MANIFEST)

    def answer(self, capability: str) -> Any:
        return screenshot_result()


class ImageSuite:
    """Image results, from the camera above, paired on the lamp's vessel."""

    def __init__(self, dk: Path, vessel: Vessel, camera: Camera):
        self.dk = dk
        self.vessel = vessel
        self.viewer = vessel.add_agent("viewer", [CAMERA])
        vessel.approve_pairing(CAMERA, ["screenshot"])

    async def check_image(self, client: Client) -> None:
        result = await client.call_tool(SCREENSHOT, {})
        check(not result.is_error, f"refused: {text_of(result)}")
        check(len(result.content) == 2, f"content: {result.content}")
        image, text = result.content
        check(isinstance(image, types.ImageContent), f"not an image first: {image!r}")
        check(image.mime_type == "image/png", f"type {image.mime_type}")
        check(base64.b64decode(image.data, validate=True) == PNG, "not the camera's bytes")
        described = {"width": 2, "height": 1, "blacked_out": 0,
                     "image": {"type": "image", "mimeType": "image/png", "bytes": len(PNG)}}
        check(isinstance(text, types.TextContent) and json.loads(text.text) == described,
              f"text: {text!r}")
        check(result.structured_content == described, f"structured: {result.structured_content}")

    async def test_a_screenshot_is_image_content(self) -> None:
        async with http_client(self.vessel.url, self.viewer) as client:
            await self.check_image(client)
        async with http_client(self.vessel.url, self.viewer, mode="legacy") as client:
            await self.check_image(client)

    async def test_a_screenshot_through_the_stdio_bridge(self) -> None:
        async with stdio_client(self.dk, self.vessel.url, self.viewer) as client:
            await self.check_image(client)


BELL = "bell"
RING = "device__bell__ring"
CHIME = "device__bell__chime"
PLAY = "device__bell__play"
BELL_MANIFEST = {
    "id": BELL, "name": "Bell", "kind": "bell", "version": "1",
    "capabilities": [
        {"name": "ring", "kind": "actuator", "description": "Ring the bell.", "confirm": True},
        {"name": "chime", "kind": "actuator", "description": "Chime once."},
        {"name": "play", "kind": "actuator", "description": "Play a tune, which takes 8 seconds."},
    ],
}
# As long as a desktop `type` call may last.
PLAY_SECONDS = 8.0
ABANDONED = "abandoned by the caller before the device was reached"


class Bell(RawDevice):
    """A bell whose `ring` asks the person every time, whose `chime` answers
    at once and whose `play` answers after `PLAY_SECONDS`."""

    def __init__(self, devices: str):
        super().__init__(devices, BELL_MANIFEST)

    def answer(self, capability: str) -> Any:
        return {capability: True}

    def delay(self, capability: str) -> float:
        return PLAY_SECONDS if capability == "play" else 0.0


class AbandonSuite:
    """Calls their client gives up on while the person is asked: the prompt
    is withdrawn, a later answer changes nothing (checked on the device:
    the bell never rings), and the decision says the call was abandoned;
    and a slow call that runs once. Paired on the lamp's vessel."""

    def __init__(self, dk: Path, vessel: Vessel, bell: Bell):
        self.dk = dk
        self.vessel = vessel
        self.bell = bell
        self.ringer = vessel.add_agent("ringer", [BELL])
        vessel.approve_pairing(BELL, ["ring", "chime", "play"])

    async def ring_prompts(self) -> set[int]:
        _, prompts = await self.vessel.admin_async("GET", "/v1/pending")
        return {p["id"] for p in prompts or []
                if p.get("kind") == "approval" and p["request"]["tool"] == RING}

    async def ring_prompt(self, earlier: set[int], call: asyncio.Task[Any] | None = None) -> int:
        """The bell's approval prompt that is not among `earlier`, once it comes."""

        async def pending() -> int | None:
            if call is not None and call.done():
                raise AssertionError(f"answered before the person: {call.result()}")
            return next(iter(await self.ring_prompts() - earlier), None)

        return await wait_for_async("the bell's approval prompt", pending)

    async def abandoned_decisions(self) -> list[dict[str, Any]]:
        _, decisions = await self.vessel.admin_async("GET", "/v1/decisions")
        rings = [d for d in decisions or [] if d.get("tool") == RING]
        check(not any(d["allowed"] for d in rings), f"a ring was allowed: {rings}")
        return [d for d in rings if d.get("reason") == ABANDONED and d.get("agentId") == "ringer"]

    def audited_abandoned(self) -> int:
        """How many abandoned rings the audit log holds."""
        return sum(1 for e in self.vessel.audit_entries()
                   if e["kind"] == "decision" and e["entry"].get("tool") == RING
                   and e["entry"].get("reason") == ABANDONED)

    async def check_withdrawn(self, how: str, prompt: int, abandon: Callable[[], Awaitable[None]]) -> None:
        """Abandons the call `prompt` asks about with `abandon`, then checks
        that the prompt goes, a yes finds nothing, the bell never rings and
        the decision says abandoned. Prints how long the prompt stayed."""
        before = len(await self.abandoned_decisions())
        audited_before = await asyncio.to_thread(self.audited_abandoned)
        started = time.monotonic()
        await abandon()
        deadline = started + PATIENCE
        while True:
            _, prompts = await self.vessel.admin_async("GET", "/v1/pending")
            if not any(p["id"] == prompt for p in prompts or []):
                gone = time.monotonic()
                break
            check(time.monotonic() < deadline, f"the prompt stayed listed after {how}")
            await asyncio.sleep(0.002)
        status, answer = await self.vessel.admin_async(
            "POST", f"/v1/pending/{prompt}/approval", {"approved": True})
        check(status == 404, f"a yes after {how} answered {status} {answer}")
        # Frames to one device go in order on its one connection: once a
        # later call is answered, a ring sent before it would have arrived.
        async with http_client(self.vessel.url, self.ringer) as client:
            result = await client.call_tool(CHIME, {})
            check(not result.is_error, f"chime refused: {text_of(result)}")
        check(self.bell.calls_of("ring") == 0, f"the bell rang after {how}: {self.bell.invoked}")

        async def recorded() -> bool | None:
            return True if len(await self.abandoned_decisions()) == before + 1 else None

        await wait_for_async(f"the abandoned call recorded after {how}", recorded)

        def audited() -> bool | None:
            return True if self.audited_abandoned() == audited_before + 1 else None

        await wait_for_async(f"the abandoned call in the audit log after {how}",
                             lambda: asyncio.to_thread(audited))
        print(f"  prompt withdrawn {(gone - started) * 1000:.1f} ms after {how}", flush=True)

    async def abandon_task(self, client: Client, how: str) -> None:
        earlier = await self.ring_prompts()
        call = asyncio.create_task(client.call_tool(RING, {}))
        prompt = await self.ring_prompt(earlier, call)

        async def abandon() -> None:
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await call

        await self.check_withdrawn(how, prompt, abandon)

    async def test_a_call_its_client_drops_is_withdrawn(self) -> None:
        # The 2026-07-28 client abandons a request by closing its POST.
        async with http_client(self.vessel.url, self.ringer) as client:
            await self.abandon_task(client, "the client closed its request")

    async def test_a_call_its_client_cancels_in_a_session_is_withdrawn(self) -> None:
        # The initialize client sends notifications/cancelled, and DELETEs
        # the session on the way out.
        async with http_client(self.vessel.url, self.ringer, mode="legacy") as client:
            await self.abandon_task(client, "the client cancelled in its session")

    async def test_a_call_whose_client_dies_is_withdrawn(self) -> None:
        # The agent's process is killed mid-call: its connections close and
        # nothing more is said, in either lifecycle.
        for mode in ("auto", "legacy"):
            earlier = await self.ring_prompts()
            agent = subprocess.Popen(
                [sys.executable, __file__, "--dk", str(self.dk), "--call-and-wait",
                 self.vessel.url, RING, mode],
                env={**os.environ, "DK_AGENT_CREDENTIAL": self.ringer},
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
            try:
                prompt = await self.ring_prompt(earlier)

                async def kill() -> None:
                    agent.kill()

                await self.check_withdrawn(f"the {mode} client was killed", prompt, kill)
            finally:
                agent.kill()
                agent.wait()

    async def test_a_call_dropped_through_the_stdio_bridge_is_withdrawn(self) -> None:
        for mode in ("auto", "legacy"):
            async with stdio_client(self.dk, self.vessel.url, self.ringer, mode=mode) as client:
                await self.abandon_task(client, f"the {mode} client cancelled through dk mcp")

    async def test_a_slow_call_runs_once(self) -> None:
        # A call as long as the longest desktop `type` is made once, whoever
        # carries it: nothing is sent again, before or after it returns.
        clients = [("over HTTP", lambda: http_client(self.vessel.url, self.ringer)),
                   ("in a session", lambda: http_client(self.vessel.url, self.ringer, mode="legacy")),
                   ("through dk mcp", lambda: stdio_client(self.dk, self.vessel.url, self.ringer))]
        for how, make in clients:
            before = self.bell.calls_of("play")
            async with make() as client:
                result = await client.call_tool(PLAY, {})
                check(not result.is_error, f"play {how} refused: {text_of(result)}")
                # Anything sent again would reach the bell before a later
                # call of it is answered.
                result = await client.call_tool(CHIME, {})
                check(not result.is_error, f"chime refused: {text_of(result)}")
            ran = self.bell.calls_of("play") - before
            check(ran == 1, f"play {how} ran {ran} times")


# -- the voice device -------------------------------------------------------

VOICE = "voice"
LISTEN = "device__voice__listen"
SAY = "device__voice__say"
PLAY_SOUND = "device__voice__play"
RATE = 16000
MIC_SINK = "dk_mic"
SPEAKER_SINK = "dk_speaker"
# listen's hangover: this much quiet after sound ends a recording.
HANGOVER_MS = 800
PULSE_PROGRAMS = ["/usr/bin/pulseaudio", "/usr/bin/pactl", "/usr/bin/pacat", "/usr/bin/parec",
                  "/usr/bin/espeak-ng"]
# The voice kind admitted; the `trusted` agent's `listen` allowed by a rule,
# so a yes to it may be remembered.
VOICE_CONFIG = """\
[streaming.voice]
enabled = true
requireApproval = false
sandbox = "voice-sandbox"

[streaming.voice.limits]
maxChunkBytes = 65536
"""
VOICE_RULES = """\
version: 1
policies:
  - name: trusted-may-listen
    action: device_use
    condition: "agentId equals trusted and capability equals listen"
    decision: allow
    message: "the trusted agent may listen when I said so"
"""


def voice_peers_missing() -> str | None:
    missing = [p for p in PULSE_PROGRAMS if not Path(p).is_file()]
    if not missing:
        return None
    why = f"missing {', '.join(missing)} (cargo xtask peers)"
    if os.environ.get("DK_REQUIRE_PEERS"):
        raise AssertionError(f"{why} and DK_REQUIRE_PEERS is set")
    return why


class Pulse:
    """A PulseAudio daemon of the test's own, as dk-testkit starts one: its
    socket and state in a temporary directory, two null sinks at 16 kHz
    mono, `dk_mic` (the device's microphone is its monitor) and
    `dk_speaker` (the device's speaker)."""

    def __init__(self, root: Path):
        self.root = root
        for sub in ("run", "state", "home"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        self.socket = root / "native"
        self.server = f"unix:{self.socket}"
        self.env = {**os.environ, "HOME": str(root / "home"), "XDG_RUNTIME_DIR": str(root / "run"),
                    "PULSE_RUNTIME_PATH": str(root / "run"), "PULSE_STATE_PATH": str(root / "state")}
        self.log = open(root / "pulse.log", "wb")
        self.process = subprocess.Popen(
            ["/usr/bin/pulseaudio", "-n", "--daemonize=no", "--use-pid-file=no",
             "--exit-idle-time=-1", "--log-target=stderr", "--log-level=warning",
             f"--load=module-native-protocol-unix socket={self.socket} auth-anonymous=1",
             f"--load=module-null-sink sink_name={MIC_SINK} rate={RATE} channels=1",
             f"--load=module-null-sink sink_name={SPEAKER_SINK} rate={RATE} channels=1"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.log, env=self.env)
        wait_for("pulseaudio", lambda: True if SPEAKER_SINK in self.pactl("list", "short", "sinks")
                 else None)

    def pactl(self, *args: str) -> str:
        out = subprocess.run(["/usr/bin/pactl", "--server", self.server, *args], env=self.env,
                             stdin=subprocess.DEVNULL, capture_output=True, timeout=PATIENCE,
                             check=False)
        return out.stdout.decode(errors="replace") if out.returncode == 0 else ""

    def feed(self, samples: list[int]) -> subprocess.Popen[bytes]:
        """Plays `samples` (16 kHz mono) into the microphone's sink, in real
        time, on a `pacat` of its own."""
        player = subprocess.Popen(
            ["/usr/bin/pacat", "--playback", f"--server={self.server}", f"--device={MIC_SINK}",
             f"--rate={RATE}", "--channels=1", "--format=s16le", "--raw", "--latency-msec=20"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=self.env)
        assert player.stdin is not None
        threading.Thread(target=lambda: (player.stdin.write(pcm(samples)), player.stdin.close()),
                         daemon=True).start()
        return player

    def record(self) -> "Recorder":
        return Recorder(self)

    def report(self) -> str:
        """Whether the daemon still runs, and what it logged: for a failed
        case, since its files go with the test's directory."""
        code = self.process.poll()
        state = "running" if code is None else f"exited with {code}"
        self.log.flush()
        logged = (self.root / "pulse.log").read_text(errors="replace")[-4000:]
        return f"pulseaudio: {state}; its log:\n{logged}"

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.log.close()


class Recorder:
    """What the speaker plays, recorded by `parec` from its monitor until
    `stop`."""

    def __init__(self, pulse: Pulse):
        self.file = open(pulse.root / f"recorded-{uuid.uuid4().hex}.raw", "w+b")
        self.process = subprocess.Popen(
            ["/usr/bin/parec", f"--server={pulse.server}", f"--device={SPEAKER_SINK}.monitor",
             f"--rate={RATE}", "--channels=1", "--format=s16le", "--raw", "--latency-msec=20"],
            stdin=subprocess.DEVNULL, stdout=self.file, stderr=subprocess.DEVNULL, env=pulse.env)

    def stop(self) -> list[int]:
        self.process.terminate()
        self.process.wait()
        self.file.seek(0)
        data = self.file.read()
        self.file.close()
        return samples_of_pcm(data)


def tone(hz: float, ms: int, rate: int = RATE, amplitude: int = 12000) -> list[int]:
    count = rate * ms // 1000
    return [int(amplitude * math.sin(2 * math.pi * hz * i / rate)) for i in range(count)]


def pcm(samples: list[int]) -> bytes:
    return struct.pack(f"<{len(samples)}h", *samples)


def samples_of_pcm(data: bytes) -> list[int]:
    count = len(data) // 2
    return list(struct.unpack(f"<{count}h", data[:count * 2]))


def wav_file(samples: list[int], rate: int, channels: int) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(channels)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes(pcm([s for s in samples for _ in range(channels)]))
    return out.getvalue()


def wav_samples(data: bytes) -> tuple[int, int, list[int]]:
    """A WAV's rate, channels and samples, read by the standard library."""
    with wave.open(io.BytesIO(data), "rb") as reader:
        check(reader.getsampwidth() == 2, f"{reader.getsampwidth()} bytes a sample")
        return (reader.getframerate(), reader.getnchannels(),
                samples_of_pcm(reader.readframes(reader.getnframes())))


def frequency(samples: list[int], rate: int = RATE) -> float:
    """The frequency of the tone in `samples`, from the median length of
    its cycles (between rising zero crossings, placed between samples)."""
    crossings = [i + (-a) / (b - a) for i, (a, b) in enumerate(zip(samples, samples[1:]))
                 if a < 0 <= b]
    check(len(crossings) > 10, f"{len(crossings)} cycles: no tone")
    cycles = sorted(b - a for a, b in zip(crossings, crossings[1:]))
    return rate / cycles[len(cycles) // 2]


def loudest_dbfs(samples: list[int], window: int = 1600) -> float:
    """The level of the loudest `window` samples (100 ms at 16 kHz), in dBFS."""
    best = 0.0
    for start in range(0, max(len(samples) - window, 1), window):
        part = samples[start:start + window]
        if part:
            best = max(best, math.sqrt(sum(s * s for s in part) / len(part)))
    return 20 * math.log10(best / 32768) if best > 0 else -96.0


class VoiceSuite:
    """`dk device voice` on a PulseAudio server of the test's own, paired
    with a vessel that admits the voice kind."""

    def __init__(self, dk: Path, vessel: Vessel, pulse: Pulse):
        self.dk = dk
        self.vessel = vessel
        self.pulse = pulse
        self.log = open(vessel.root / "voice.log", "wb")
        self.device = subprocess.Popen(
            [str(dk), "device", "voice", "--vessel", f"ws://{vessel.devices}/device",
             "--key-file", str(vessel.root / "voice.key"), "--server", pulse.server,
             "--source", f"{MIC_SINK}.monitor", "--sink", SPEAKER_SINK],
            stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT)
        vessel.approve_pairing(VOICE, ["listen", "listen_stream", "say", "play", "stop"])
        self.listener = vessel.add_agent("listener", [VOICE])
        self.trusted = vessel.add_agent("trusted", [VOICE])

    def close(self) -> None:
        if self.device.poll() is None:
            self.device.kill()
            self.device.wait()
        self.log.close()

    async def approval(self, call: asyncio.Task[Any]) -> dict[str, Any]:
        """The approval `call` waits on, once it is listed."""

        async def pending() -> dict[str, Any] | None:
            if call.done():
                raise AssertionError(f"answered before the person: {call.result()}")
            _, prompts = await self.vessel.admin_async("GET", "/v1/pending")
            for prompt in prompts or []:
                if prompt.get("kind") == "approval":
                    return prompt
            return None

        return await wait_for_async("the approval prompt", pending)

    async def answer(self, prompt: dict[str, Any], body: dict[str, Any]) -> int:
        status, _ = await self.vessel.admin_async(
            "POST", f"/v1/pending/{prompt['id']}/approval", body)
        return status

    async def microphone_live(self) -> None:
        async def live() -> bool | None:
            _, status = await self.vessel.admin_async("GET", "/v1/status")
            return True if (status or {}).get("microphones") else None

        await wait_for_async("the microphone live", live)

    async def test_listen_hears_a_tone_and_silence_ends_it(self) -> None:
        async with http_client(self.vessel.url, self.listener) as client:
            call = asyncio.create_task(client.call_tool(LISTEN, {"max_seconds": 10}))
            prompt = await self.approval(call)
            request = prompt["request"]
            check(request["agentId"] == "listener", f"asked for {request}")
            check(request["microphone"] == {"maxSeconds": 10}, f"microphone: {request}")
            check(await self.answer(prompt, {"approved": True}) == 204, "not answered")
            await self.microphone_live()
            player = self.pulse.feed(tone(440.0, 1500) + [0] * (RATE * 3))
            result = await asyncio.wait_for(call, PATIENCE)
            player.kill()
            player.wait()
        check(not result.is_error, f"refused: {text_of(result)}")
        audio = [c for c in result.content if isinstance(c, types.AudioContent)]
        check(len(audio) == 1, f"content: {result.content}")
        check(audio[0].mime_type == "audio/wav", f"type {audio[0].mime_type}")
        rate, channels, samples = wav_samples(base64.b64decode(audio[0].data, validate=True))
        check((rate, channels) == (RATE, 1), f"{rate} Hz, {channels} channels")
        loud = [i for i, s in enumerate(samples) if abs(s) >= 1000]
        check(bool(loud), "nothing heard")
        heard = frequency(samples[loud[0]:loud[-1]])
        check(abs(heard - 440.0) <= 440.0 * 0.02, f"{heard:.1f} Hz")
        # Silence ended it after the hangover, to the frame.
        quiet_ms = (len(samples) - 1 - loud[-1]) * 1000 // RATE
        check(HANGOVER_MS <= quiet_ms <= HANGOVER_MS + 40, f"{quiet_ms} ms of quiet at the end")
        described = json.loads(" ".join(c.text for c in result.content
                                        if isinstance(c, types.TextContent)))
        check(described["ended"] == "silence", f"result: {described}")
        check(described["audio"] == {"type": "audio", "mimeType": "audio/wav",
                                     "bytes": len(base64.b64decode(audio[0].data))},
              f"result: {described}")
        # The microphone is off again.
        _, status = await self.vessel.admin_async("GET", "/v1/status")
        check("microphones" not in status, f"status: {status}")

    async def test_a_yes_to_listen_is_remembered_only_where_a_rule_allows_it(self) -> None:
        remember = {"approved": True, "remember": {"scope": "capability", "minutes": 5}}
        async with http_client(self.vessel.url, self.listener) as client:
            call = asyncio.create_task(client.call_tool(LISTEN, {"max_seconds": 1}))
            prompt = await self.approval(call)
            check(not prompt.get("canRemember"), f"rememberable without a rule: {prompt}")
            check(await self.answer(prompt, remember) == 409, "a remembered yes was taken")
            check(await self.answer(prompt, {"approved": True}) == 204, "not answered")
            result = await asyncio.wait_for(call, PATIENCE)
            check(not result.is_error, f"refused: {text_of(result)}")
        async with http_client(self.vessel.url, self.trusted) as client:
            call = asyncio.create_task(client.call_tool(LISTEN, {"max_seconds": 1}))
            prompt = await self.approval(call)
            check(prompt.get("canRemember") is True, f"not rememberable under a rule: {prompt}")
            check(await self.answer(prompt, remember) == 201, "the remembered yes was refused")
            check(not (await asyncio.wait_for(call, PATIENCE)).is_error, "refused")
            # Remembered: the next one is not asked.
            result = await asyncio.wait_for(client.call_tool(LISTEN, {"max_seconds": 1}), PATIENCE)
            check(not result.is_error, f"refused: {text_of(result)}")

    async def test_say_and_play_reach_the_speaker(self) -> None:
        async with http_client(self.vessel.url, self.listener) as client:
            recorder = self.pulse.record()
            result = await client.call_tool(SAY, {"text": "hello"})
            heard = recorder.stop()
            check(not result.is_error, f"refused: {text_of(result)}")
            check(loudest_dbfs(heard) > -30.0, f"speech at {loudest_dbfs(heard):.1f} dBFS")
            sound = base64.b64encode(wav_file(tone(523.0, 1000, 44100, 10000), 44100, 2)).decode()
            recorder = self.pulse.record()
            result = await client.call_tool(PLAY_SOUND, {"audio": sound})
            heard = recorder.stop()
            check(not result.is_error, f"refused: {text_of(result)}")
            loud = [i for i, s in enumerate(heard) if abs(s) >= 1000]
            check(bool(loud), "nothing played")
            played = frequency(heard[loud[0]:loud[-1]])
            check(abs(played - 523.0) <= 523.0 * 0.02, f"{played:.1f} Hz")

    async def test_bad_input_is_refused_clearly_and_the_device_stays_up(self) -> None:
        async with http_client(self.vessel.url, self.listener) as client:
            result = await client.call_tool(LISTEN, {})
            check(result.is_error, f"listen without max_seconds ran: {result}")
            check("max_seconds" in text_of(result), f"reason: {text_of(result)}")
            # Out of the bounds the device declares: refused by the vessel
            # before the person is asked (nothing waits in /v1/pending).
            for value, why in [(21, '"max_seconds" must be at most 20'),
                               (0, '"max_seconds" must be at least 1'),
                               (2.5, '"max_seconds" must be a whole number')]:
                result = await client.call_tool(LISTEN, {"max_seconds": value})
                check(result.is_error and why in text_of(result), f"reason: {text_of(result)}")
            _, pending = await self.vessel.admin_async("GET", "/v1/pending")
            check(pending == [], f"the person was asked: {pending}")
            result = await client.call_tool(SAY, {"text": "a" * 1001})
            check(result.is_error and '"text" must be at most 1000 characters' in text_of(result),
                  f"reason: {text_of(result)}")
            truncated = wav_file(tone(440.0, 100), RATE, 1)[:100]
            huge = bytearray(wav_file(tone(440.0, 100), RATE, 1))
            huge[40:44] = struct.pack("<I", 0xFFFFFFFF)
            for sound, why in [
                (b"not a sound", "the audio is not WAV (RIFF WAVE) or Opus (Ogg)"),
                (truncated, "the WAV is cut short: its data chunk says 3200 bytes and 56 follow"),
                (bytes(huge),
                 "the WAV is cut short: its data chunk says 4294967295 bytes and 3200 follow"),
            ]:
                result = await client.call_tool(
                    PLAY_SOUND, {"audio": base64.b64encode(sound).decode()})
                check(result.is_error and why in text_of(result), f"reason: {text_of(result)}")
            result = await client.call_tool(PLAY_SOUND, {"audio": "not base64!"})
            check(result.is_error, f"not base64 played: {result}")
            # Still up, and still speaking.
            result = await client.call_tool(SAY, {"text": "still here"})
            check(not result.is_error, f"refused: {text_of(result)}")
        check(self.device.poll() is None, "dk device voice exited")


async def call_and_wait(url: str, tool: str, mode: str) -> None:
    """The agent of `test_a_call_whose_client_dies_is_withdrawn`: calls
    `tool` and waits for it, until it is killed."""
    async with http_client(url, os.environ["DK_AGENT_CREDENTIAL"], mode=mode) as client:
        await client.call_tool(tool, {})
        await asyncio.sleep(PATIENCE)


async def run_voice(dk: Path, root: Path, results: list[tuple[str, str, str]],
                    only: str | None) -> None:
    """The voice cases, on a vessel and a PulseAudio server of their own;
    each skipped when a peer is missing (failed when they are required)."""
    names = [n.removeprefix("test_") for n in vars(VoiceSuite) if n.startswith("test_")]
    names = [n for n in names if not only or only in n]
    if not names:
        return
    missing = voice_peers_missing()
    if missing:
        for name in names:
            print(f"SKIP {name}: {missing}", flush=True)
            results.append((name, "skip", missing))
        return
    config = root / "voice-vessel.toml"
    config.write_text(VOICE_CONFIG)
    pulse = Pulse(root / "pulse")
    earlier = len(results)
    vessel = Vessel(dk, root / "voice", ["--config", str(config)], VOICE_RULES)
    suite = None
    try:
        suite = VoiceSuite(dk, vessel, pulse)
        await run_cases(suite, results, only)
    except Exception:
        print(vessel.read_log(), file=sys.stderr)
        raise
    finally:
        if suite is not None:
            suite.close()
        vessel.close()
        if any(outcome == "fail" for _, outcome, _ in results[earlier:]):
            print(pulse.report(), file=sys.stderr, flush=True)
        pulse.close()


async def run_cases(suite: Any, results: list[tuple[str, str, str]], only: str | None) -> None:
    # In the order they are written: each case leaves the grants as it found them.
    for name in [n for n in vars(type(suite)) if n.startswith("test_")]:
        if only and only not in name:
            continue
        case = name.removeprefix("test_")
        try:
            await asyncio.wait_for(getattr(suite, name)(), PATIENCE * 3)
        except Exception as error:  # noqa: BLE001 - every failure is reported, then counted
            # An assertion inside a client's task group comes wrapped.
            while len(getattr(error, "exceptions", ())) == 1:
                error = error.exceptions[0]
            detail = "".join(traceback.format_exception_only(type(error), error)).strip()
            if isinstance(error, TimeoutError):
                detail = "timed out"
            print(f"FAIL {case}: {detail}", flush=True)
            if os.environ.get("DK_PYTHON_TRACEBACK"):
                traceback.print_exc()
            results.append((case, "fail", detail))
        else:
            print(f"PASS {case}", flush=True)
            results.append((case, "pass", ""))


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dk", required=True, type=Path, help="the dk binary")
    parser.add_argument("-k", dest="only", help="run only cases whose name contains this")
    parser.add_argument("--call-and-wait", nargs=3, metavar=("URL", "TOOL", "MODE"),
                        help="be the agent that calls TOOL and waits until it is killed")
    options = parser.parse_args()
    if options.call_and_wait:
        await call_and_wait(*options.call_and_wait)
        return 0
    dk = options.dk.resolve()
    results: list[tuple[str, str, str]] = []
    root = Path(tempfile.mkdtemp(prefix="dk-python-"))
    try:
        vessel = Vessel(dk, root / "main", [])
        try:
            vessel.pair_lamp(["read_light", "set_light", "strobe"])
            await run_cases(Suite(dk, vessel), results, options.only)
            camera = Camera(vessel.devices)
            try:
                await run_cases(ImageSuite(dk, vessel, camera), results, options.only)
            finally:
                camera.close()
            bell = Bell(vessel.devices)
            try:
                await run_cases(AbandonSuite(dk, vessel, bell), results, options.only)
            finally:
                bell.close()
        except Exception:
            print(vessel.read_log(), file=sys.stderr)
            raise
        finally:
            vessel.close()
        vessel = Vessel(dk, root / "read-more",
                        ["--mcp-read-more-threshold", str(ReadMoreSuite.THRESHOLD)])
        try:
            vessel.pair_lamp(["read_light"])
            await run_cases(ReadMoreSuite(dk, vessel), results, options.only)
        finally:
            vessel.close()
        await run_voice(dk, root, results, options.only)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    passed = sum(1 for _, outcome, _ in results if outcome == "pass")
    failed = sum(1 for _, outcome, _ in results if outcome == "fail")
    skipped = sum(1 for _, outcome, _ in results if outcome == "skip")
    print(f"python tests: {passed} passed, {failed} failed, {skipped} skipped", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
