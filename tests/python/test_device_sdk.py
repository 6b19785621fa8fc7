"""The Python device SDK (python/dk_device) against a real `dk vessel`.

The SDK's wheel is installed alone in a virtualenv of its own (made fresh
by `cargo xtask python`, which builds the wheel with maturin), where the
devices run: the thermostat of examples/python/thermostat.py, whose
manifest declares its range and its event, and the programs of
sdk_devices.py. The person answers through the admin API; the agent is
the official Python MCP client (this virtualenv's, as in
test_mcp_client.py). Run by `cargo xtask ci`:

    python tests/python/test_device_sdk.py --dk target/debug/dk \\
        --device-python target/python-sdk-venv/bin/python

Each case prints `PASS name` or `FAIL name: why`; the last line is
`python tests: N passed, N failed, N skipped`, and the exit code is 1 when
a case failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from test_mcp_client import (PATIENCE, Vessel, check, http_client, run_cases, text_of,
                             wait_for, wait_for_async)

ROOT = Path(__file__).resolve().parents[2]
THERMOSTAT_PROGRAM = ROOT / "examples" / "python" / "thermostat.py"
DEVICES_PROGRAM = Path(__file__).resolve().parent / "sdk_devices.py"

THERMOSTAT = "hall-thermostat"
SET_TARGET = "device__hall_thermostat__set_target"
READ_TEMPERATURE = "device__hall_thermostat__read_temperature"
THERMOSTAT_EVENTS = "dk://devices/hall-thermostat/events"

ECHO = "py-echo"
ECHO_EVENTS = "dk://devices/py-echo/events"


def echo_tool(capability: str) -> str:
    return f"device__py_echo__{capability}"


class Program:
    """A device program in the SDK's virtualenv, its output in a file."""

    def __init__(self, python: Path, root: Path, name: str, args: list[str],
                 env: dict[str, str] | None = None):
        self.output = root / f"{name}.out"
        self.log = open(self.output, "wb")
        self.process = subprocess.Popen(
            [str(python), *args], stdin=subprocess.DEVNULL, stdout=self.log,
            stderr=subprocess.STDOUT, env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"})

    def lines(self) -> list[str]:
        return self.output.read_text(errors="replace").splitlines()

    def line_after(self, prefix: str) -> str | None:
        return next((line[len(prefix):] for line in self.lines() if line.startswith(prefix)), None)

    def interrupt(self) -> int:
        """Ctrl-C, as the person would press it; the exit code."""
        self.process.send_signal(signal.SIGINT)
        try:
            return self.process.wait(PATIENCE)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"Ctrl-C did not stop it:\n{self.text()}") from None

    def text(self) -> str:
        return "\n".join(self.lines())

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.log.close()


class SdkSuite:
    """The cases, run in order against one vessel."""

    def __init__(self, dk: Path, python: Path, vessel: Vessel, root: Path):
        self.dk = dk
        self.python = python
        self.vessel = vessel
        self.root = root
        self.home = root / "home"
        self.url = f"ws://{vessel.devices}/device"
        self.programs: list[Program] = []
        self.thermostat: Program | None = None
        self.echo: Program | None = None
        self.agent = vessel.add_agent("sdk-agent", [THERMOSTAT, ECHO])

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Program:
        # Each run its own output: a restarted program's is read alone.
        program = Program(self.python, self.root, f"{name}-{len(self.programs)}", args, env)
        self.programs.append(program)
        return program

    def start_thermostat(self) -> Program:
        # No --key-file: the key goes to dk's home, here DK_HOME.
        return self.start("thermostat", [str(THERMOSTAT_PROGRAM), self.url, "--period", "0.2"],
                          {"DK_HOME": str(self.home)})

    def close(self) -> None:
        for program in self.programs:
            program.close()

    def consent_request(self, device: str) -> dict[str, Any]:
        def request() -> dict[str, Any] | None:
            _, pending = self.vessel.admin("GET", "/v1/pending")
            return next((p for p in pending or [] if p.get("kind") == "consent"
                         and p["request"]["deviceId"] == device), None)

        return wait_for(f"{device}'s pairing request", request)

    def connected(self, device: str, yes: bool = True) -> None:
        def seen() -> bool | None:
            _, devices = self.vessel.admin("GET", "/v1/devices")
            on = any(d["id"] == device and d["connected"] for d in devices or [])
            return True if on == yes else None

        wait_for(f"{device} to be {'connected' if yes else 'gone'}", seen)

    def pending_consents(self) -> list[dict[str, Any]]:
        _, pending = self.vessel.admin("GET", "/v1/pending")
        return [p for p in pending or [] if p.get("kind") == "consent"]

    # -- installing ----------------------------------------------------------

    async def test_the_wheel_runs_alone_in_a_fresh_virtualenv(self) -> None:
        out = subprocess.run(
            [str(self.python), "-c",
             "import importlib.util, dk_device; print(dk_device.__file__); "
             "print(importlib.util.find_spec('mcp') is None)"],
            capture_output=True, text=True, timeout=PATIENCE, check=False)
        check(out.returncode == 0, f"import failed: {out.stderr}")
        where, no_mcp = out.stdout.split()
        check(Path(where).is_relative_to(Path(self.python).parent.parent),
              f"dk_device imported from {where}, not the SDK's virtualenv")
        check(no_mcp == "True", "the SDK's virtualenv holds the MCP client too")

    async def test_errors_are_typed_without_a_vessel(self) -> None:
        out = subprocess.run([str(self.python), str(DEVICES_PROGRAM), "offline"],
                             capture_output=True, text=True, timeout=PATIENCE, check=False)
        check(out.returncode == 0 and out.stdout.strip().endswith("ok"),
              f"offline checks: {out.stdout}{out.stderr}")

    # -- the thermostat of examples/python -----------------------------------

    async def test_the_thermostat_pairs_showing_its_range_and_event(self) -> None:
        self.thermostat = self.start_thermostat()
        prompt = self.consent_request(THERMOSTAT)
        request = prompt["request"]
        set_target = next(c for c in request["capabilities"] if c["name"] == "set_target")
        celsius = next(p for p in set_target["params"] if p["name"] == "celsius")
        check(celsius["bounds"] == "from 5 to 30 °C", f"celsius: {celsius}")
        check([e["name"] for e in request.get("events", [])] == ["temperature_changed"],
              f"events: {request.get('events')}")
        shown = wait_for("the code the thermostat shows",
                         lambda: self.thermostat.line_after("    Pairing code: "))
        check(shown.split()[0] == request["code"],
              f"the thermostat shows {shown}, the person {request['code']}")
        status, _ = await self.vessel.admin_async(
            "POST", f"/v1/pending/{prompt['id']}/consent",
            {"approved": True, "grant": ["read_temperature", "set_target", "temperature_changed"]})
        check(status == 204, f"consent answered {status}")
        self.connected(THERMOSTAT)
        key = self.home / "devices" / f"{THERMOSTAT}.key"
        check(key.is_file(), f"no key in dk's home: {sorted(self.home.rglob('*'))}")
        check(stat.S_IMODE(key.stat().st_mode) == 0o600, f"key mode {oct(key.stat().st_mode)}")

    async def paired_thermostat(self) -> Program:
        """The thermostat, paired: by the case that pairs it, or now when
        `-k` left that case out."""
        if self.thermostat is None:
            await self.test_the_thermostat_pairs_showing_its_range_and_event()
        check(self.thermostat is not None, "no thermostat")
        return self.thermostat

    async def paired_echo(self) -> Program:
        """The echo device, paired, as `paired_thermostat`."""
        if self.echo is None:
            await self.test_an_asyncio_device_pairs_with_its_code()
        check(self.echo is not None, "no echo device")
        return self.echo

    async def test_an_agent_calls_the_python_handlers(self) -> None:
        await self.paired_thermostat()
        async with http_client(self.vessel.url, self.agent) as client:
            listed = await client.list_tools(cache_mode="bypass")
            tool = next(t for t in listed.tools if t.name == SET_TARGET)
            celsius = tool.input_schema["properties"]["celsius"]
            check((celsius.get("minimum"), celsius.get("maximum")) == (5, 30), f"schema: {celsius}")
            result = await client.call_tool(SET_TARGET, {"celsius": 22, "mode": "heat"})
            check(not result.is_error, f"set_target refused: {text_of(result)}")
            check(result.structured_content["target"] == 22, f"result: {result.structured_content}")
            # read_temperature is an `async def` handler.
            result = await client.call_tool(READ_TEMPERATURE, {})
            check(not result.is_error, f"read_temperature refused: {text_of(result)}")
            reading = result.structured_content
            check(reading["target"] == 22 and reading["mode"] == "heat", f"reading: {reading}")
        check("call: set_target 22 heat" in self.thermostat.lines(), self.thermostat.text())

    async def test_35_degrees_is_refused_by_its_bound_and_never_reaches_python(self) -> None:
        await self.paired_thermostat()
        async with http_client(self.vessel.url, self.agent) as client:
            result = await client.call_tool(SET_TARGET, {"celsius": 35})
            check(result.is_error, f"35 °C went through: {result}")
            check('"celsius" must be at most 30 °C' in text_of(result), f"reason: {text_of(result)}")
            check(self.pending_consents() == [] and not any(
                p.get("kind") == "approval" for p in self.vessel.admin("GET", "/v1/pending")[1]),
                "the person was asked")
            # Frames to a device go in order on its one connection: once a
            # later call has reached the handler, an earlier one would have.
            result = await client.call_tool(SET_TARGET, {"celsius": 21})
            check(not result.is_error, f"21 °C refused: {text_of(result)}")
        calls = [line for line in self.thermostat.lines() if line.startswith("call: set_target")]
        check("call: set_target 21 None" in calls, f"calls: {calls}")
        check(not any(" 35" in line for line in calls), f"35 °C reached the handler: {calls}")

    async def test_the_declared_event_reaches_the_agent(self) -> None:
        await self.paired_thermostat()
        async with http_client(self.vessel.url, self.agent) as client:
            result = await client.call_tool(SET_TARGET, {"celsius": 21})
            check(not result.is_error, f"21 °C refused: {text_of(result)}")
        async with http_client(self.vessel.url, self.agent) as client:
            async def readings() -> list[dict[str, Any]] | None:
                read = await client.read_resource(THERMOSTAT_EVENTS)
                events = json.loads(read.contents[0].text)["events"]
                changed = [e for e in events if e.get("capability") == "temperature_changed"
                           and e.get("data", {}).get("target") == 21]
                return changed or None

            changed = await wait_for_async("temperature_changed with the new target", readings)
            data = changed[-1]["data"]
            check(set(data) == {"current", "target", "mode"}, f"data: {data}")

    async def test_a_restarted_thermostat_reconnects_by_key_without_a_prompt(self) -> None:
        await self.paired_thermostat()
        code = self.thermostat.interrupt()
        check(code == 0 and self.thermostat.lines()[-1] == "stopped",
              f"exit {code}:\n{self.thermostat.text()}")
        self.connected(THERMOSTAT, False)
        self.thermostat = self.start_thermostat()

        def back() -> bool | None:
            check(self.pending_consents() == [], "the person was asked again")
            _, devices = self.vessel.admin("GET", "/v1/devices")
            return True if any(d["id"] == THERMOSTAT and d["connected"]
                               for d in devices or []) else None

        wait_for("the thermostat back", back)
        check(self.thermostat.line_after("    Pairing code: ") is None,
              f"it paired again:\n{self.thermostat.text()}")
        async with http_client(self.vessel.url, self.agent) as client:
            result = await client.call_tool(READ_TEMPERATURE, {})
            check(not result.is_error, f"refused after the restart: {text_of(result)}")

    # -- handlers of every sort, with run_async ------------------------------

    async def test_an_asyncio_device_pairs_with_its_code(self) -> None:
        self.echo = self.start("echo", [str(DEVICES_PROGRAM), "echo", self.url,
                                        str(self.root / "echo.key")])
        prompt = self.consent_request(ECHO)
        shown = wait_for("the echo's code", lambda: self.echo.line_after("code: "))
        check(shown == prompt["request"]["code"], f"shown {shown}, asked {prompt['request']['code']}")
        status, _ = await self.vessel.admin_async(
            "POST", f"/v1/pending/{prompt['id']}/consent",
            {"approved": True,
             "grant": ["add", "fail", "nap", "opaque", "hold", "ping", "pinged"]})
        check(status == 204, f"consent answered {status}")
        self.connected(ECHO)

    async def test_handlers_answer_or_fail_with_their_message(self) -> None:
        await self.paired_echo()
        async with http_client(self.vessel.url, self.agent) as client:
            result = await client.call_tool(echo_tool("add"), {"a": 2, "b": 40.5})
            check(not result.is_error and result.structured_content == {"sum": 42.5},
                  f"add: {result}")
            result = await client.call_tool(echo_tool("fail"), {"why": "the boiler is off"})
            check(result.is_error and text_of(result) == "device error: the boiler is off",
                  f"fail: {text_of(result)}")
            result = await client.call_tool(echo_tool("opaque"), {})
            check(result.is_error and 'result of "opaque" is not JSON' in text_of(result),
                  f"opaque: {text_of(result)}")
            # Two `async def` calls at once, on the program's own loop.
            naps = await asyncio.gather(
                client.call_tool(echo_tool("nap"), {"seconds": 0.2}),
                client.call_tool(echo_tool("nap"), {"seconds": 0.1}))
            for nap in naps:
                check(not nap.is_error and nap.structured_content["loop"] is True, f"nap: {nap}")
            result = await client.call_tool(echo_tool("nap"), {"seconds": 0})
            check(result.is_error and text_of(result) == "device error: a nap of no time",
                  f"nap 0: {text_of(result)}")
            result = await client.call_tool(echo_tool("nap"), {"seconds": 9})
            check(result.is_error and '"seconds" must be at most 5' in text_of(result),
                  f"nap 9: {text_of(result)}")
        check(not any("nap" in line and '9' in line for line in self.echo.lines()
                      if line.startswith("call:")), "nap 9 reached the handler")

    async def test_a_blocking_handler_leaves_the_connection_serving(self) -> None:
        await self.paired_echo()
        async with http_client(self.vessel.url, self.agent) as client:
            held = asyncio.create_task(client.call_tool(echo_tool("hold"), {"seconds": 3}))
            await wait_for_async("the hold call to reach its handler", lambda: asyncio.to_thread(
                lambda: True if any(line.startswith("call: hold") for line in self.echo.lines())
                else None))
            # While `hold` sleeps in its handler, another call is answered.
            result = await client.call_tool(echo_tool("add"), {"a": 1, "b": 2})
            check(not result.is_error and result.structured_content == {"sum": 3}, f"add: {result}")
            check(not held.done(), "add was answered only after hold returned")
            result = await asyncio.wait_for(held, PATIENCE)
            check(not result.is_error and result.structured_content == {"held": 3}, f"hold: {result}")

    async def test_an_event_emitted_by_a_handler_keeps_its_params(self) -> None:
        await self.paired_echo()
        async with http_client(self.vessel.url, self.agent) as client:
            result = await client.call_tool(echo_tool("ping"), {"n": 7})
            check(not result.is_error, f"ping 7: {text_of(result)}")
            result = await client.call_tool(echo_tool("ping"), {"n": 11})
            check(result.is_error and '"n" must be at most 10' in text_of(result),
                  f"ping 11: {text_of(result)}")

            async def pinged() -> list[Any] | None:
                read = await client.read_resource(ECHO_EVENTS)
                events = json.loads(read.contents[0].text)["events"]
                found = [e["data"]["n"] for e in events if e.get("capability") == "pinged"]
                return found or None

            check(await wait_for_async("the pinged event", pinged) == [7], "events differ")

    async def test_ctrl_c_cancels_run_async_and_closes_the_connection(self) -> None:
        await self.paired_echo()
        code = self.echo.interrupt()
        check(code == 0 and self.echo.lines()[-1] == "stopped", f"exit {code}:\n{self.echo.text()}")
        self.connected(ECHO, False)

    # -- a refusal ------------------------------------------------------------

    async def test_a_refused_pairing_raises_pairing_error(self) -> None:
        program = self.start("refused", [str(DEVICES_PROGRAM), "refused", self.url,
                                         str(self.root / "refused.key")])
        prompt = self.consent_request("py-refused")
        status, _ = await self.vessel.admin_async(
            "POST", f"/v1/pending/{prompt['id']}/consent", {"approved": False})
        check(status == 204, f"refusal answered {status}")
        try:
            code = program.process.wait(PATIENCE)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after the refusal:\n{program.text()}") from None
        check(code == 3 and any(line.startswith("raised PairingError: pairing refused")
                                for line in program.lines()), f"exit {code}:\n{program.text()}")


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dk", required=True, type=Path, help="the dk binary")
    parser.add_argument("--device-python", required=True, type=Path,
                        help="the interpreter of the virtualenv holding the dk_device wheel")
    parser.add_argument("-k", dest="only", help="run only cases whose name contains this")
    options = parser.parse_args()
    dk = options.dk.resolve()
    results: list[tuple[str, str, str]] = []
    root = Path(tempfile.mkdtemp(prefix="dk-python-sdk-"))
    try:
        vessel = Vessel(dk, root / "vessel", [])
        suite = SdkSuite(dk, options.device_python.absolute(), vessel, root)
        try:
            await run_cases(suite, results, options.only)
        except Exception:
            print(vessel.read_log(), file=sys.stderr)
            raise
        finally:
            suite.close()
            vessel.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    passed = sum(1 for _, outcome, _ in results if outcome == "pass")
    failed = sum(1 for _, outcome, _ in results if outcome == "fail")
    skipped = sum(1 for _, outcome, _ in results if outcome == "skip")
    print(f"python tests: {passed} passed, {failed} failed, {skipped} skipped", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
