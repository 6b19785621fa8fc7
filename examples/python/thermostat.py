"""A hall thermostat in Python, on the dk_device SDK (python/dk_device).

Its manifest (fixtures/manifests/dk/hall-thermostat.json) declares the
target's range, 5 to 30 °C, its modes and its `temperature_changed` event
(the dk manifest extension): the vessel refuses 35 °C before the person is
asked, and this program's handler never sees it. The temperature drifts
toward the target and is reported as `temperature_changed` every period.

Install the SDK and start a vessel, then:

    pip install ./python/dk_device
    python examples/python/thermostat.py ws://127.0.0.1:7777/device

The first run pairs: check that the printed code matches the vessel's
prompt. The key is kept in dk's home (`$DK_HOME/devices/hall-thermostat.key`
or `~/.local/share/dk/...`; `--key-file` names another), so later runs
reconnect without asking the person. Each call is printed as it reaches a
handler. Ctrl-C closes the connection and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
from pathlib import Path

from dk_device import Device, DeviceError, EventError

MANIFEST = Path(__file__).resolve().parents[2] / "fixtures" / "manifests" / "dk" / "hall-thermostat.json"


class Hall:
    """The hall: its temperature, the target and the mode, shared by the
    handlers and the sensor thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.current = 20.0
        self.target = 20.0
        self.mode = "auto"

    def reading(self) -> dict[str, float | str]:
        with self.lock:
            return {"current": round(self.current, 2), "target": self.target, "mode": self.mode}

    def drift(self) -> dict[str, float | str]:
        with self.lock:
            self.current += (self.target - self.current) * 0.25
        return self.reading()


def main() -> int:
    parser = argparse.ArgumentParser(description="A hall thermostat, as a dk device.")
    parser.add_argument("vessel", help="the vessel's device route, e.g. ws://127.0.0.1:7777/device")
    parser.add_argument("--key-file", help="where to keep the device's key (default: in dk's home)")
    parser.add_argument("--manifest", default=str(MANIFEST), help="the manifest (default: %(default)s)")
    parser.add_argument("--period", type=float, default=3.0,
                        help="seconds between readings (default: %(default)s)")
    args = parser.parse_args()

    hall = Hall()
    dev = Device.from_manifest(args.manifest)

    @dev.capability("read_temperature")
    async def read_temperature() -> dict[str, float | str]:
        # An `async def` handler: awaited on the SDK's asyncio loop.
        print("call: read_temperature", flush=True)
        await asyncio.sleep(0)
        return hall.reading()

    @dev.capability("set_target")
    def set_target(celsius: float, mode: str | None = None) -> dict[str, float | str]:
        # The manifest's bounds are checked before this runs: 5 <= celsius <= 30.
        print(f"call: set_target {celsius} {mode}", flush=True)
        with hall.lock:
            hall.target = celsius
            if mode is not None:
                hall.mode = mode
        return hall.reading()

    stopped = threading.Event()

    def sensor() -> None:
        while not stopped.wait(args.period):
            try:
                dev.emit("temperature_changed", hall.drift())
            except EventError as error:
                # The queue is full while the vessel is away: this reading is dropped.
                print(f"reading not sent: {error}", flush=True)

    def connection(connected: bool, why: str | None) -> None:
        print("connected to the vessel" if connected else f"disconnected: {why}", flush=True)

    print(f"{dev.name} ({dev.id}) connecting to {args.vessel}", flush=True)
    print(f"key file: {args.key_file or dev.default_key_file}", flush=True)
    threading.Thread(target=sensor, name="sensor", daemon=True).start()
    try:
        dev.run(args.vessel, key_file=args.key_file, on_connection=connection)
    except KeyboardInterrupt:
        print("stopped", flush=True)
        return 0
    except DeviceError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 1
    finally:
        stopped.set()
    print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
