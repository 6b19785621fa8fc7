"""Device programs on the dk_device SDK for tests/python/test_device_sdk.py,
run in the virtualenv that holds the SDK's wheel alone (no MCP client):

    python sdk_devices.py offline
        checks what needs no vessel (typed errors, the key file's place,
        events queued before a run) and prints `ok`, or fails;
    python sdk_devices.py echo URL KEY_FILE
        a device of several handlers (plain, blocking and `async def`,
        failing, not JSON, emitting an event), run with `await Device.run_async`; it
        prints `code: NNNNNN` for the pairing code, `call: NAME {input}` as
        each call reaches a handler, and `stopped` when Ctrl-C cancels it;
    python sdk_devices.py refused URL KEY_FILE
        a device whose pairing the test refuses: prints the exception
        `Device.run` raised and exits 3.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import dk_device
from dk_device import (ConnectError, CredentialError, Device, DeviceError, EventError,
                       ManifestError, PairingError)

ECHO = {
    "dk": 1, "id": "py-echo", "name": "Python echo", "kind": "echo", "version": "1.0.0",
    "capabilities": [
        {"name": "add", "kind": "actuator", "description": "Add two numbers.",
         "params": {"a": {"type": "number", "required": True},
                    "b": {"type": "number", "required": True}}},
        {"name": "fail", "kind": "actuator", "description": "Fail, saying why.",
         "params": {"why": {"type": "string", "required": True}}},
        {"name": "nap", "kind": "sensor", "description": "Sleep a while, then answer.",
         "params": {"seconds": {"type": "number", "required": True,
                                "minimum": 0, "maximum": 5}}},
        {"name": "opaque", "kind": "sensor", "description": "Answer what JSON cannot carry."},
        {"name": "hold", "kind": "sensor", "description": "Block a while, then answer.",
         "params": {"seconds": {"type": "number", "required": True,
                                "minimum": 0, "maximum": 5}}},
        {"name": "ping", "kind": "actuator", "description": "Send the pinged event.",
         "params": {"n": {"type": "number", "required": True}}},
    ],
    "events": [
        {"name": "pinged", "description": "A ping, numbered.",
         "params": {"n": {"type": "number", "required": True, "integer": True,
                          "minimum": 0, "maximum": 10}}},
    ],
}

REFUSED = {
    "id": "py-refused", "name": "Python refused", "kind": "bell", "version": "1.0.0",
    "capabilities": [{"name": "ring", "kind": "actuator", "description": "Ring."}],
}


def say(text: str) -> None:
    print(text, flush=True)


def expect(kind: type[BaseException], text: str, action: Any) -> None:
    """Fails unless `action()` raises `kind` with `text` in its message."""
    try:
        action()
    except kind as error:
        if text not in str(error):
            raise AssertionError(f"{kind.__name__} says {str(error)!r}, not {text!r}") from error
        return
    raise AssertionError(f"no {kind.__name__} ({text!r})")


def offline() -> None:
    for kind in (ManifestError, PairingError, CredentialError, ConnectError, EventError):
        assert issubclass(kind, DeviceError), kind
        assert kind.__module__ == "dk_device", kind.__module__
    with tempfile.TemporaryDirectory() as scratch:
        broken = Path(scratch, "broken.json")
        broken.write_text("{not json")
        expect(ManifestError, "invalid manifest", lambda: Device.from_manifest(broken))
        expect(ManifestError, "cannot read the manifest", lambda: Device.from_manifest(
            Path(scratch, "missing.json")))
    expect(ManifestError, 'manifest id "Bad Id" must be lower case words',
           lambda: Device({**ECHO, "id": "Bad Id"}))
    # The extension's own checks, with dk's reason.
    bounded = json.loads(json.dumps(ECHO))
    bounded["capabilities"][2]["params"]["seconds"]["minimum"] = 9
    expect(ManifestError, "invalid manifest", lambda: Device(bounded))

    dev = Device(ECHO)
    assert dev.id == "py-echo" and dev.name == "Python echo", (dev.id, dev.name)
    assert dev.capabilities == ["add", "fail", "nap", "opaque", "hold", "ping"], dev.capabilities
    assert dev.events == ["pinged"], dev.events
    expect(ManifestError, 'handler given for no capability named "subtract"',
           lambda: dev.capability("subtract")(lambda: None))
    dev.capability("add")(lambda a, b: a + b)
    expect(ManifestError, 'handler given twice for capability "add"',
           lambda: dev.capability("add")(lambda a, b: a - b))
    # A capability without a handler is refused before any connection.
    expect(ManifestError, 'no handler for capability "fail"',
           lambda: dev.run("ws://127.0.0.1:9/device", key_file=os.devnull))

    # Events: declared, within their params, JSON; queued before a run.
    dev.emit("pinged", {"n": 3})
    expect(EventError, '"n" must be at most 10', lambda: dev.emit("pinged", {"n": 11}))
    expect(EventError, '"n" must be a whole number', lambda: dev.emit("pinged", {"n": 2.5}))
    expect(EventError, 'unknown capability "pong"', lambda: dev.emit("pong", {}))
    expect(EventError, "event data is not JSON", lambda: dev.emit("pinged", {"n": float("nan")}))
    expect(EventError, "event data is not JSON", lambda: dev.emit("pinged", {"n": object()}))
    small = Device(ECHO, event_queue=1)
    small.emit("pinged", {"n": 1})
    expect(EventError, "the event queue is full", lambda: small.emit("pinged", {"n": 2}))

    # The key file's place: dk's home, as every dk device keeps it.
    saved = {name: os.environ.pop(name, None) for name in ("DK_HOME", "XDG_DATA_HOME", "HOME")}
    try:
        os.environ.update(DK_HOME="/srv/dk", XDG_DATA_HOME="/x", HOME="/h")
        assert dev.default_key_file == Path("/srv/dk/devices/py-echo.key"), dev.default_key_file
        del os.environ["DK_HOME"]
        assert dev.default_key_file == Path("/x/dk/devices/py-echo.key"), dev.default_key_file
        del os.environ["XDG_DATA_HOME"]
        assert dev.default_key_file == Path("/h/.local/share/dk/devices/py-echo.key")
        os.environ["DK_HOME"] = "relative"
        expect(CredentialError, "DK_HOME must be an absolute path", lambda: dev.default_key_file)
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value

    # A URL that can never be used stops the run at once.
    full = Device(REFUSED)
    full.capability("ring")(lambda: {"rang": True})
    expect(ConnectError, "cannot use the vessel URL", lambda: full.run(
        "http://127.0.0.1:9/device", key_file=os.devnull))
    assert not full.running
    full.stop()  # nothing runs: nothing happens
    say("ok")


async def echo(url: str, key_file: str) -> None:
    dev = Device(ECHO)

    @dev.capability("add")
    def add(a: float, b: float) -> dict[str, float]:
        say(f"call: add {json.dumps({'a': a, 'b': b})}")
        return {"sum": a + b}

    @dev.capability("fail")
    def fail(why: str) -> None:
        say(f"call: fail {json.dumps({'why': why})}")
        raise RuntimeError(why)

    @dev.capability("nap")
    async def nap(seconds: float) -> dict[str, Any]:
        say(f"call: nap {json.dumps({'seconds': seconds})}")
        await asyncio.sleep(seconds)
        if seconds == 0:
            # An `async def` handler's failure, raised after an await.
            raise RuntimeError("a nap of no time")
        # Awaited on this program's own loop, the one `run_async` runs on.
        return {"slept": seconds, "loop": asyncio.get_running_loop() is main_loop}

    @dev.capability("opaque")
    def opaque() -> object:
        say("call: opaque {}")
        return object()

    @dev.capability("hold", blocking=True)
    def hold(seconds: float) -> dict[str, float]:
        # Blocks its thread; the connection goes on serving other calls.
        say(f"call: hold {json.dumps({'seconds': seconds})}")
        time.sleep(seconds)
        return {"held": seconds}

    @dev.capability("ping")
    def ping(n: float) -> dict[str, float]:
        say(f"call: ping {json.dumps({'n': n})}")
        dev.emit("pinged", {"n": n})
        return {"pinged": n}

    main_loop = asyncio.get_running_loop()
    await dev.run_async(url, key_file=key_file, on_code=lambda code: say(f"code: {code}"),
                        on_connection=lambda up, why: say("connected" if up else f"lost: {why}"))


def refused(url: str, key_file: str) -> int:
    dev = Device(REFUSED)
    dev.capability("ring")(lambda: {"rang": True})
    try:
        dev.run(url, key_file=key_file, on_code=lambda code: say(f"code: {code}"))
    except DeviceError as error:
        say(f"raised {type(error).__name__}: {error}")
        return 3
    say("returned")
    return 0


def main() -> int:
    say(f"dk_device from {Path(dk_device.__file__).parent}")
    match sys.argv[1:]:
        case ["offline"]:
            offline()
            return 0
        case ["echo", url, key_file]:
            try:
                asyncio.run(echo(url, key_file))
            except KeyboardInterrupt:
                say("stopped")
            return 0
        case ["refused", url, key_file]:
            return refused(url, key_file)
        case _:
            print(__doc__, file=sys.stderr)
            return 2


if __name__ == "__main__":
    sys.exit(main())
