"""Make a dk device in Python.

A device is its manifest (what it can sense and do, and the events it
sends) and a handler for each capability. dk's Rust client does the rest:
it pairs with a vessel by the code the person compares, keeps its key in
dk's home, reconnects with backoff, refuses calls outside the manifest's
declared bounds before a handler sees them, and refuses events whose data
does not keep their declared params::

    from dk_device import Device

    dev = Device.from_manifest("thermostat.json")

    @dev.capability("set_target")
    def set_target(celsius: float, mode: str = "auto") -> dict:
        return {"target": celsius, "mode": mode}

    dev.emit("temperature_changed", {"current": 19.5, "target": 21, "mode": "heat"})
    dev.run("ws://127.0.0.1:7777/device")

Handlers are called with the call's input as keyword arguments and return
anything `json.dumps` takes; an exception's message is the call's error.
A plain handler runs on the connection's thread, so it should return at
once, or be declared `blocking=True`; an `async def` handler runs on an
asyncio loop: `run_async`'s, or one `run` keeps on a thread of its own.
See docs/PYTHON.md.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, Callable, TypeVar

from dk_device._native import (
    ConnectError,
    CredentialError,
    DeviceError,
    EventError,
    ManifestError,
    NativeDevice,
    PairingError,
    Reply,
    Stopper,
)

__all__ = [
    "ConnectError",
    "CredentialError",
    "Device",
    "DeviceError",
    "EventError",
    "ManifestError",
    "PairingError",
]

log = logging.getLogger("dk_device")

Handler = TypeVar("Handler", bound=Callable[..., Any])

# What the vessel may wait for in the events queue by default.
DEFAULT_EVENT_QUEUE = 64


def print_code(code: str) -> None:
    """Shows the pairing code, as every dk device does."""
    print(f"\n    Pairing code: {code} — check it matches the vessel's prompt\n", flush=True)


class Device:
    """A dk device: a validated manifest and a handler for each capability.

    Make one with `Device.from_manifest(path)` or `Device(manifest)`, where
    `manifest` is the manifest's JSON text or a dict. A manifest dk refuses
    raises `ManifestError` with dk's reason.
    """

    def __init__(self, manifest: str | dict[str, Any], *, event_queue: int = DEFAULT_EVENT_QUEUE):
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        self._native = NativeDevice(text, event_queue)
        self._handlers: dict[str, Callable[..., Any]] = {}

    @classmethod
    def from_manifest(cls, path: str | os.PathLike[str], *,
                      event_queue: int = DEFAULT_EVENT_QUEUE) -> Device:
        """The device whose manifest is the JSON file at `path`."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise ManifestError(f"cannot read the manifest `{os.fspath(path)}`: {error}") from None
        return cls(text, event_queue=event_queue)

    @property
    def id(self) -> str:
        """The manifest's id."""
        return self._native.id

    @property
    def name(self) -> str:
        """The manifest's name."""
        return self._native.name

    @property
    def capabilities(self) -> list[str]:
        """The capabilities' names, in the manifest's order."""
        return self._native.capabilities

    @property
    def events(self) -> list[str]:
        """The declared events' names, in the manifest's order."""
        return self._native.events

    @property
    def default_key_file(self) -> Path:
        """Where the device keeps its key unless `key_file=` names another:
        `devices/<id>.key` in dk's home (`$DK_HOME`, else
        `$XDG_DATA_HOME/dk`, else `~/.local/share/dk`)."""
        return Path(self._native.default_key_file)

    @property
    def running(self) -> bool:
        """Whether `run` or `run_async` is running the device."""
        return self._native.running

    def capability(self, name: str, *, blocking: bool = False) -> Callable[[Handler], Handler]:
        """Decorates the handler of capability `name`.

        The handler is called with the call's input as keyword arguments
        (a param the person's agent left out is not passed: give it a
        default) and returns the call's result, anything `json.dumps`
        takes. An exception it raises fails the call, its message being
        the error the agent reads. A name the manifest does not declare,
        or one given a handler already, raises `ManifestError`.

        A plain handler runs on the device's connection thread, which
        serves nothing else until it returns: keep it quick (read a pin,
        set a relay). One that sleeps or waits on hardware is declared
        `blocking=True`: the connection goes on serving meanwhile. An
        `async def` handler is awaited on an asyncio loop and may take its
        time.
        """

        def register(handler: Handler) -> Handler:
            if not callable(handler):
                raise TypeError(f"the handler of {name!r} must be callable")
            self._native.handle(name, blocking)
            self._handlers[name] = handler
            return handler

        return register

    def emit(self, event: str, data: Any) -> None:
        """Queues `event` with `data` for the vessel, without waiting.

        `event` is an event the manifest declares (or, as 8DK devices do, a
        capability's name); `data` must keep the event's declared params.
        Events wait in the queue while the device is not connected, or not
        running yet, and go out when it is. Raises `EventError` when the
        event is not declared, the data does not keep its params or is not
        JSON, or the queue is full.
        """
        try:
            text = json.dumps(data, allow_nan=False)
        except (TypeError, ValueError) as error:
            raise EventError(f"event data is not JSON: {error}") from None
        self._native.emit(event, text)

    def run(self, url: str, *, key_file: str | os.PathLike[str] | None = None,
            on_code: Callable[[str], Any] | None = None,
            on_connection: Callable[[bool, str | None], Any] | None = None,
            tls_root: str | os.PathLike[str] | None = None) -> None:
        """Runs the device against the vessel's device route `url`
        (`ws://host:7777/device`, or `wss://` behind a TLS proxy) until
        `stop()` is called, Ctrl-C (which raises `KeyboardInterrupt` once
        the connection is closed), or an error retrying cannot fix.

        The first run pairs: `on_code(code)` is given the 6-digit code the
        person compares with the vessel's prompt (printed when not given).
        The key is kept in `key_file` (by default `default_key_file`), so
        later runs reconnect without asking the person. Connections that
        drop are opened again with growing, jittered waits;
        `on_connection(connected, why)` hears of each.
        `tls_root` names a PEM file of the roots a `wss://` vessel is
        checked against, instead of the system's.

        The GIL is released while the device waits. Raises
        `PairingError`, `CredentialError` or `ConnectError` (all
        `DeviceError`s) when the device cannot go on, and `ManifestError`
        when a capability has no handler.
        """
        stopper = Stopper()
        loop: asyncio.AbstractEventLoop | None = None
        thread: threading.Thread | None = None
        if any(inspect.iscoroutinefunction(h) for h in self._handlers.values()):
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="dk-device asyncio",
                                      daemon=True)
            thread.start()
        try:
            self._run(url, stopper, loop, key_file=key_file, on_code=on_code,
                      on_connection=on_connection, tls_root=tls_root)
        finally:
            if loop is not None and thread is not None:
                loop.call_soon_threadsafe(loop.stop)
                thread.join()
                loop.close()

    async def run_async(self, url: str, *, key_file: str | os.PathLike[str] | None = None,
                        on_code: Callable[[str], Any] | None = None,
                        on_connection: Callable[[bool, str | None], Any] | None = None,
                        tls_root: str | os.PathLike[str] | None = None) -> None:
        """`run`, awaited: the device runs on a worker thread and its
        `async def` handlers on the running loop, as do `on_code` and
        `on_connection` when given. Cancelling the task stops the device
        (the connection is closed once the calls in flight had their
        grace) before the cancellation goes on."""
        loop = asyncio.get_running_loop()
        stopper = Stopper()

        def on_loop(callback: Callable[..., Any] | None) -> Callable[..., Any] | None:
            if callback is None:
                return None
            return lambda *args: loop.call_soon_threadsafe(callback, *args)

        running = loop.run_in_executor(None, lambda: self._run(
            url, stopper, loop, key_file=key_file, on_code=on_loop(on_code),
            on_connection=on_loop(on_connection), tls_root=tls_root))
        try:
            await asyncio.shield(running)
        except asyncio.CancelledError:
            stopper.stop()
            try:
                await running
            except DeviceError:
                pass
            raise

    def stop(self) -> None:
        """Stops the run in progress (from any thread, a handler or a signal
        handler): the connection is closed once the calls in flight had
        their grace, and `run` returns. Nothing when the device is not
        running."""
        self._native.stop()

    def _run(self, url: str, stopper: Stopper, loop: asyncio.AbstractEventLoop | None, *,
             key_file: str | os.PathLike[str] | None, on_code: Callable[[str], Any] | None,
             on_connection: Callable[[bool, str | None], Any] | None,
             tls_root: str | os.PathLike[str] | None) -> None:
        calls = _Calls(dict(self._handlers), loop)
        hear = on_connection

        def connection(connected: bool, why: str | None, retry_in: float | None) -> None:
            if connected:
                log.info("connected to the vessel")
            else:
                log.info("disconnected: %s; trying again in %.1f s", why, retry_in or 0.0)
            if hear is not None:
                hear(connected, why)

        self._native.run(
            url, calls, stopper, on_code or print_code, connection,
            None if key_file is None else os.fspath(key_file),
            None if tls_root is None else os.fspath(tls_root))


class _Calls:
    """Hands each call to its handler and answers it: the dispatcher the
    native device calls on the connection's thread with the capability, the
    input's JSON text and a `Reply`."""

    def __init__(self, handlers: dict[str, Callable[..., Any]],
                 loop: asyncio.AbstractEventLoop | None):
        self.handlers = handlers
        self.loop = loop
        self.tasks: set[asyncio.Future[Any]] = set()

    def __call__(self, capability: str, input_json: str, reply: Reply) -> None:
        handler = self.handlers.get(capability)
        if handler is None:
            reply.error(f'no handler for capability "{capability}"')
            return
        try:
            kwargs = json.loads(input_json)
            if inspect.iscoroutinefunction(handler):
                if self.loop is None:
                    reply.error(f'the handler of "{capability}" needs an asyncio loop')
                    return
                # One hop to the loop's thread, where the task starts and
                # answers: no concurrent future and no chaining between two.
                self.loop.call_soon_threadsafe(self.start, capability, handler, kwargs, reply)
                return
            result = handler(**kwargs)
        except Exception as error:  # noqa: BLE001 - every failure is the call's error
            self.failed(capability, error, reply)
            return
        self.answer(capability, result, reply)

    def start(self, capability: str, handler: Callable[..., Any], kwargs: Any,
              reply: Reply) -> None:
        """On the loop's thread: runs the `async def` handler in a task that
        answers the call itself as it ends, held until then (the loop keeps
        only weak references to tasks)."""
        task = asyncio.get_running_loop().create_task(
            self.answering(capability, handler, kwargs, reply))
        self.tasks.add(task)
        task.add_done_callback(lambda done: self.ended(capability, done, reply))

    async def answering(self, capability: str, handler: Callable[..., Any], kwargs: Any,
                        reply: Reply) -> None:
        """Awaits the handler and answers with what it gave: in the task's
        last step, not in a callback a loop iteration later."""
        try:
            result = await handler(**kwargs)
        except asyncio.CancelledError:
            reply.error(f'the handler of "{capability}" was cancelled')
            raise
        except Exception as error:  # noqa: BLE001 - every failure is the call's error
            self.failed(capability, error, reply)
            return
        self.answer(capability, result, reply)

    def ended(self, capability: str, done: asyncio.Future[Any], reply: Reply) -> None:
        self.tasks.discard(done)
        if done.cancelled():
            # Cancelled before the handler started: answered here (a call
            # already answered ignores a second answer).
            reply.error(f'the handler of "{capability}" was cancelled')

    @staticmethod
    def answer(capability: str, result: Any, reply: Reply) -> None:
        try:
            text = json.dumps(result, allow_nan=False)
        except (TypeError, ValueError) as error:
            reply.error(f'result of "{capability}" is not JSON: {error}')
            return
        reply.ok(text)

    @staticmethod
    def failed(capability: str, error: BaseException, reply: Reply) -> None:
        log.debug("the handler of %r failed", capability, exc_info=error)
        reply.error(str(error) or type(error).__name__)
