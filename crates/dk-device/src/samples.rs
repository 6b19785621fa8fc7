//! Ready-made devices: 8DK's reference desk lamp, a front door lock, a hall
//! thermostat, and two streaming devices (a kitchen voice satellite and an
//! office desktop bridge), with state a test can inspect.
//!
//! Their manifests are the ones under `fixtures/manifests/valid/`. Each
//! sample keeps its state behind a lock shared with its handlers, and a log
//! of the calls it received.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Map, Value, json};

use crate::{Device, DeviceBuilder, EmitError, EventSender, HandlerError};

const LAMP_MANIFEST: &str = include_str!("../../../fixtures/manifests/valid/desk-lamp.json");
const LOCK_MANIFEST: &str = include_str!("../../../fixtures/manifests/valid/front-door.json");
const THERMOSTAT_MANIFEST: &str =
    include_str!("../../../fixtures/manifests/valid/hall-thermostat.json");
const THERMOSTAT_DK_MANIFEST: &str =
    include_str!("../../../fixtures/manifests/dk/hall-thermostat.json");
const VOICE_MANIFEST: &str = include_str!("../../../fixtures/manifests/valid/kitchen-voice.json");
const DESKTOP_MANIFEST: &str =
    include_str!("../../../fixtures/manifests/valid/office-desktop.json");

/// A call a sample received: the capability and its input.
pub type CallRecord = (String, Map<String, Value>);

/// Starts a sample from one of the bundled manifests.
fn define(manifest: &str) -> DeviceBuilder {
    let manifest = serde_json::from_str::<Value>(manifest).unwrap_or(Value::Null);
    Device::define(&manifest)
}

/// Finishes a sample. The bundled manifests and handlers are checked by the
/// tests of this module, so this cannot fail.
#[expect(
    clippy::expect_used,
    reason = "bundled manifest and handlers, checked by the samples tests"
)]
fn finish(builder: DeviceBuilder) -> Device {
    builder.build().expect("bundled sample device is valid")
}

/// A number as JavaScript writes it: whole numbers without a fraction, so
/// `50` stays `50` rather than becoming `50.0`.
fn js_number(n: f64) -> Value {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    if n.fract() == 0.0 && n.abs() <= EXACT {
        // Whole and within 2^53, so the conversion is exact.
        return Value::from(n as i64);
    }
    serde_json::Number::from_f64(n).map_or(Value::Null, Value::Number)
}

fn serialize_js_number<S: Serializer>(n: &f64, serializer: S) -> Result<S::Ok, S::Error> {
    js_number(*n).serialize(serializer)
}

/// Locks a sample's state; a handler that panicked while holding it leaves
/// the state as it was, which is still usable.
fn guard<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

// ---------------------------------------------------------------- lamp

/// The desk lamp's state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LampState {
    /// Whether it is on.
    pub on: bool,
    /// Its brightness, 0-100 by convention (not enforced, as in 8DK).
    pub brightness: f64,
}

#[derive(Debug)]
struct LampShared {
    state: LampState,
    calls: Vec<CallRecord>,
}

/// 8DK's reference desk lamp (`desk-lamp`): state starts
/// `{on:false, brightness:0}`; `read_light` returns `{on, brightness}`;
/// `set_light` sets `on` and, only when a number is given, `brightness`,
/// and returns `{on, brightness}`; `strobe` returns `{strobed:true}`.
#[derive(Debug, Clone)]
pub struct Lamp {
    device: Device,
    shared: Arc<Mutex<LampShared>>,
}

impl Default for Lamp {
    fn default() -> Self {
        Self::new()
    }
}

impl Lamp {
    /// A lamp, off, brightness 0.
    pub fn new() -> Self {
        let shared = Arc::new(Mutex::new(LampShared {
            state: LampState {
                on: false,
                brightness: 0.0,
            },
            calls: Vec::new(),
        }));
        let read = Arc::clone(&shared);
        let set = Arc::clone(&shared);
        let strobe = Arc::clone(&shared);
        let device = finish(
            define(LAMP_MANIFEST)
                .handler("read_light", move |input| {
                    let mut shared = guard(&read);
                    shared.calls.push(("read_light".to_owned(), input));
                    let result = lamp_json(shared.state);
                    async move { Ok(result) }
                })
                .handler("set_light", move |input| {
                    let result = set_light(&set, input);
                    async move { result }
                })
                .handler("strobe", move |input| {
                    guard(&strobe).calls.push(("strobe".to_owned(), input));
                    async move { Ok(json!({"strobed": true})) }
                }),
        );
        Lamp { device, shared }
    }

    /// The device, to serve or invoke.
    pub fn device(&self) -> Device {
        self.device.clone()
    }

    /// The lamp's state now.
    pub fn state(&self) -> LampState {
        guard(&self.shared).state
    }

    /// Every call received so far, in order.
    pub fn calls(&self) -> Vec<CallRecord> {
        guard(&self.shared).calls.clone()
    }
}

fn lamp_json(state: LampState) -> Value {
    json!({"on": state.on, "brightness": js_number(state.brightness)})
}

fn set_light(shared: &Mutex<LampShared>, input: Map<String, Value>) -> Result<Value, HandlerError> {
    let mut shared = guard(shared);
    let on = input.get("on").and_then(Value::as_bool);
    let brightness = input.get("brightness").and_then(Value::as_f64);
    shared.calls.push(("set_light".to_owned(), input));
    // The vessel checks input before sending it; a device reached some other
    // way still refuses a missing or mistyped `on`.
    let on = on.ok_or("\"on\" must be boolean")?;
    shared.state.on = on;
    if let Some(brightness) = brightness {
        shared.state.brightness = brightness;
    }
    Ok(lamp_json(shared.state))
}

/// 8DK's reference desk lamp, ready to serve. Use [`Lamp`] to inspect its state.
pub fn lamp() -> Device {
    Lamp::new().device()
}

// ---------------------------------------------------------------- lock

/// The door lock's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockState {
    /// Whether the door is locked.
    pub locked: bool,
}

#[derive(Debug)]
struct LockShared {
    state: LockState,
    calls: Vec<CallRecord>,
}

/// A front door lock (`front-door`), starting locked: `read_lock` returns
/// `{locked}`; `lock` and `unlock` (a confirm capability) set it and return
/// `{locked}`.
#[derive(Debug, Clone)]
pub struct Lock {
    device: Device,
    shared: Arc<Mutex<LockShared>>,
}

impl Default for Lock {
    fn default() -> Self {
        Self::new()
    }
}

impl Lock {
    /// A lock, locked.
    pub fn new() -> Self {
        let shared = Arc::new(Mutex::new(LockShared {
            state: LockState { locked: true },
            calls: Vec::new(),
        }));
        let handler = |name: &'static str, to: Option<bool>| {
            let shared = Arc::clone(&shared);
            move |input| {
                let mut shared = guard(&shared);
                shared.calls.push((name.to_owned(), input));
                if let Some(locked) = to {
                    shared.state.locked = locked;
                }
                let result = json!({"locked": shared.state.locked});
                async move { Ok::<Value, HandlerError>(result) }
            }
        };
        let device = finish(
            define(LOCK_MANIFEST)
                .handler("read_lock", handler("read_lock", None))
                .handler("lock", handler("lock", Some(true)))
                .handler("unlock", handler("unlock", Some(false))),
        );
        Lock { device, shared }
    }

    /// The device, to serve or invoke.
    pub fn device(&self) -> Device {
        self.device.clone()
    }

    /// The lock's state now.
    pub fn state(&self) -> LockState {
        guard(&self.shared).state
    }

    /// Every call received so far, in order.
    pub fn calls(&self) -> Vec<CallRecord> {
        guard(&self.shared).calls.clone()
    }
}

/// A front door lock, locked, ready to serve. Use [`Lock`] to inspect its state.
pub fn lock() -> Device {
    Lock::new().device()
}

// ---------------------------------------------------------------- thermostat

/// Lowest target the thermostat accepts, in degrees Celsius.
pub const MIN_TARGET: f64 = 5.0;
/// Highest target the thermostat accepts, in degrees Celsius.
pub const MAX_TARGET: f64 = 30.0;
/// How far the simulated temperature moves toward the target per
/// [`Thermostat::tick`], in degrees Celsius.
pub const DRIFT_PER_TICK: f64 = 0.5;

/// The thermostat's state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThermostatState {
    /// The simulated current temperature.
    #[serde(serialize_with = "serialize_js_number")]
    pub current: f64,
    /// The target temperature.
    #[serde(serialize_with = "serialize_js_number")]
    pub target: f64,
    /// `heat`, `cool` or `auto`.
    pub mode: String,
}

#[derive(Debug)]
struct ThermostatShared {
    state: ThermostatState,
    calls: Vec<CallRecord>,
}

/// The input of `set_target`.
#[derive(Debug, Deserialize)]
struct SetTarget {
    celsius: f64,
    mode: Option<String>,
}

/// A hall thermostat (`hall-thermostat`), starting at 20 °C with target 20
/// and mode `auto`: `read_temperature` returns `{current, target, mode}`;
/// `set_target {celsius, mode?}` takes 5-30 and `heat`, `cool` or `auto`,
/// and returns the same shape. The current temperature drifts toward the
/// target by [`DRIFT_PER_TICK`] each [`tick`](Thermostat::tick); whoever runs
/// the thermostat decides how often to tick and may send what `tick` returns
/// as a `device:event` through an [`EventSender`].
#[derive(Debug, Clone)]
pub struct Thermostat {
    device: Device,
    shared: Arc<Mutex<ThermostatShared>>,
    /// The name its readings go out as: `read_temperature` (a capability,
    /// as 8DK devices send events) or `temperature_changed` (a declared
    /// event).
    event: &'static str,
}

impl Default for Thermostat {
    fn default() -> Self {
        Self::new()
    }
}

impl Thermostat {
    /// A thermostat at 20 °C, target 20, mode `auto`.
    pub fn new() -> Self {
        Self::with_manifest(THERMOSTAT_MANIFEST, "read_temperature")
    }

    /// The same thermostat declaring what an 8DK manifest cannot say
    /// (`fixtures/manifests/dk/hall-thermostat.json`, the dk manifest
    /// extension): `celsius` from 5 to 30 °C and `mode` one of `heat`,
    /// `cool` and `auto`, enforced by the vessel before the person is asked
    /// and by the device before its handler; and its readings as the
    /// declared event `temperature_changed`, which the person grants
    /// as a capability.
    pub fn declaring() -> Self {
        Self::with_manifest(THERMOSTAT_DK_MANIFEST, "temperature_changed")
    }

    fn with_manifest(manifest: &str, event: &'static str) -> Self {
        let shared = Arc::new(Mutex::new(ThermostatShared {
            state: ThermostatState {
                current: 20.0,
                target: 20.0,
                mode: "auto".to_owned(),
            },
            calls: Vec::new(),
        }));
        let read = Arc::clone(&shared);
        let set = Arc::clone(&shared);
        let device = finish(
            define(manifest)
                .handler("read_temperature", move |input| {
                    let mut shared = guard(&read);
                    shared.calls.push(("read_temperature".to_owned(), input));
                    let state = shared.state.clone();
                    async move { serde_json::to_value(state).map_err(|e| e.to_string().into()) }
                })
                .handler("set_target", move |input| {
                    let result = set_target(&set, input);
                    async move { result }
                }),
        );
        Thermostat {
            device,
            shared,
            event,
        }
    }

    /// The device, to serve or invoke.
    pub fn device(&self) -> Device {
        self.device.clone()
    }

    /// The thermostat's state now.
    pub fn state(&self) -> ThermostatState {
        guard(&self.shared).state.clone()
    }

    /// Every call received so far, in order.
    pub fn calls(&self) -> Vec<CallRecord> {
        guard(&self.shared).calls.clone()
    }

    /// Moves the current temperature [`DRIFT_PER_TICK`] toward the target.
    /// When it moved, returns the event to report:
    /// `("read_temperature", {current, target, mode})`, or
    /// `("temperature_changed", ...)` for [`Thermostat::declaring`].
    pub fn tick(&self) -> Option<(String, Value)> {
        let mut shared = guard(&self.shared);
        let state = &mut shared.state;
        let gap = state.target - state.current;
        if gap == 0.0 {
            return None;
        }
        state.current = if gap.abs() <= DRIFT_PER_TICK {
            state.target
        } else {
            state.current + DRIFT_PER_TICK.copysign(gap)
        };
        let data = serde_json::to_value(&*state).ok()?;
        Some((self.event.to_owned(), data))
    }

    /// Ticks every `period` (at least a millisecond), queueing each reading
    /// on `events` without waiting: a reading that finds the queue full is
    /// dropped, as the next one supersedes it. Returns once the event queue
    /// is closed (its receiver dropped).
    pub async fn drift(&self, events: &EventSender, period: Duration) {
        let mut ticks = tokio::time::interval(period.max(Duration::from_millis(1)));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await; // the first tick is immediate
        loop {
            ticks.tick().await;
            if events.is_closed() {
                return;
            }
            if let Some((capability, data)) = self.tick() {
                match events.try_emit(&capability, data) {
                    Ok(()) | Err(EmitError::Full) => {}
                    Err(_) => return,
                }
            }
        }
    }
}

fn set_target(
    shared: &Mutex<ThermostatShared>,
    input: Map<String, Value>,
) -> Result<Value, HandlerError> {
    let mut shared = guard(shared);
    shared.calls.push(("set_target".to_owned(), input.clone()));
    let request = serde_json::from_value::<SetTarget>(Value::Object(input))
        .map_err(|e| HandlerError::new(format!("invalid input for \"set_target\": {e}")))?;
    if !(MIN_TARGET..=MAX_TARGET).contains(&request.celsius) {
        return Err(HandlerError::new(format!(
            "\"celsius\" must be between {} and {}",
            js_number(MIN_TARGET),
            js_number(MAX_TARGET)
        )));
    }
    let mode = match request.mode.as_deref() {
        None => None,
        Some(mode @ ("heat" | "cool" | "auto")) => Some(mode.to_owned()),
        Some(_) => return Err("\"mode\" must be heat, cool or auto".into()),
    };
    shared.state.target = request.celsius;
    if let Some(mode) = mode {
        shared.state.mode = mode;
    }
    serde_json::to_value(&shared.state).map_err(|e| HandlerError::new(e.to_string()))
}

/// A hall thermostat, ready to serve. Use [`Thermostat`] to inspect its state.
pub fn thermostat() -> Device {
    Thermostat::new().device()
}

#[cfg(test)]
mod tests;

// ---------------------------------------------------------------- voice satellite

/// Sample rate of the voice satellite's microphone stream, in Hz.
pub const VOICE_SAMPLE_RATE: u32 = 16_000;
/// Length of one microphone frame, in milliseconds.
pub const VOICE_FRAME_MS: u32 = 20;
/// Bytes of one microphone frame: 20 ms of 16 kHz mono 16-bit PCM.
pub const VOICE_FRAME_BYTES: usize = (VOICE_SAMPLE_RATE * VOICE_FRAME_MS / 1000) as usize * 2;
/// The tone the simulated microphone hears, in Hz.
pub const VOICE_TONE_HZ: f64 = 440.0;

/// The voice satellite's state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VoiceState {
    /// Whether the microphone is muted (a muted satellite streams silence).
    pub muted: bool,
    /// Speaker volume, 0-100.
    pub volume: f64,
    /// Texts spoken so far.
    pub spoken: u64,
}

#[derive(Debug)]
struct VoiceShared {
    state: VoiceState,
    calls: Vec<CallRecord>,
}

/// A kitchen voice satellite (`kitchen-voice`, kind `voice`): `microphone`
/// describes its stream, `read_status` returns `{muted, volume}`,
/// `set_volume` (0-100) and `mute` set them, `speak` answers `{spoken}`.
/// [`Voice::frame`] makes the microphone's 20 ms PCM frames (a 440 Hz sine).
#[derive(Debug, Clone)]
pub struct Voice {
    device: Device,
    shared: Arc<Mutex<VoiceShared>>,
}

impl Default for Voice {
    fn default() -> Self {
        Self::new()
    }
}

impl Voice {
    /// A satellite, unmuted, at volume 50.
    pub fn new() -> Self {
        let shared = Arc::new(Mutex::new(VoiceShared {
            state: VoiceState {
                muted: false,
                volume: 50.0,
                spoken: 0,
            },
            calls: Vec::new(),
        }));
        let handler = |name: &'static str| {
            let shared = Arc::clone(&shared);
            move |input: Map<String, Value>| {
                let mut shared = guard(&shared);
                shared.calls.push((name.to_owned(), input.clone()));
                let result = match name {
                    "microphone" => Ok(json!({
                        "format": "pcm_s16le", "sampleRate": VOICE_SAMPLE_RATE,
                        "channels": 1, "frameMs": VOICE_FRAME_MS, "muted": shared.state.muted,
                    })),
                    "set_volume" => match input.get("volume").and_then(Value::as_f64) {
                        Some(v) if (0.0..=100.0).contains(&v) => {
                            shared.state.volume = v;
                            Ok(json!({"volume": js_number(v)}))
                        }
                        _ => Err(HandlerError::new("volume must be 0-100")),
                    },
                    "mute" => {
                        shared.state.muted =
                            input.get("muted").and_then(Value::as_bool).unwrap_or(true);
                        Ok(json!({"muted": shared.state.muted}))
                    }
                    "speak" => {
                        shared.state.spoken += 1;
                        let text = input.get("text").and_then(Value::as_str).unwrap_or("");
                        Ok(json!({"spoken": text.chars().count()}))
                    }
                    _ => Ok(json!({
                        "muted": shared.state.muted,
                        "volume": js_number(shared.state.volume),
                    })),
                };
                async move { result }
            }
        };
        let device = finish(
            define(VOICE_MANIFEST)
                .handler("microphone", handler("microphone"))
                .handler("read_status", handler("read_status"))
                .handler("set_volume", handler("set_volume"))
                .handler("mute", handler("mute"))
                .handler("speak", handler("speak")),
        );
        Voice { device, shared }
    }

    /// The device, to serve or invoke.
    pub fn device(&self) -> Device {
        self.device.clone()
    }

    /// The satellite's state now.
    pub fn state(&self) -> VoiceState {
        guard(&self.shared).state
    }

    /// Every call received so far, in order.
    pub fn calls(&self) -> Vec<CallRecord> {
        guard(&self.shared).calls.clone()
    }

    /// Microphone frame number `index`: [`VOICE_FRAME_BYTES`] of
    /// little-endian 16-bit PCM, a [`VOICE_TONE_HZ`] sine continuing from the
    /// frame before; silence while muted.
    pub fn frame(&self, index: u64) -> Vec<u8> {
        let muted = guard(&self.shared).state.muted;
        let samples = VOICE_FRAME_BYTES / 2;
        let mut out = Vec::with_capacity(VOICE_FRAME_BYTES);
        for i in 0..samples {
            let n = index.wrapping_mul(samples as u64).wrapping_add(i as u64);
            let t = (n % u64::from(VOICE_SAMPLE_RATE)) as f64 / f64::from(VOICE_SAMPLE_RATE);
            let sample = if muted {
                0
            } else {
                // Within i16 (amplitude 0.3 of full scale).
                ((t * VOICE_TONE_HZ * std::f64::consts::TAU).sin() * 0.3 * f64::from(i16::MAX))
                    as i16
            };
            out.extend_from_slice(&sample.to_le_bytes());
        }
        out
    }
}

// ---------------------------------------------------------------- desktop bridge

/// The desktop bridge's state.
#[derive(Debug, Clone, PartialEq)]
pub struct DesktopState {
    /// Screen width in pixels.
    pub width: u32,
    /// Screen height in pixels.
    pub height: u32,
    /// Pointer position.
    pub pointer: (f64, f64),
    /// Clicks made.
    pub clicks: u64,
    /// Everything typed.
    pub typed: String,
}

#[derive(Debug)]
struct DesktopShared {
    state: DesktopState,
    calls: Vec<CallRecord>,
}

/// An office desktop bridge (`office-desktop`, kind `desktop-control`):
/// `screen` describes its stream, `read_screen` returns the size and pointer,
/// `move_pointer` moves it (within the screen), `click` and `type_text` (both
/// confirm: the person says yes to each) act. [`Desktop::screenshot`] makes
/// the screen stream's RGBA frames.
#[derive(Debug, Clone)]
pub struct Desktop {
    device: Device,
    shared: Arc<Mutex<DesktopShared>>,
}

impl Desktop {
    /// A bridge to a `width` x `height` screen, the pointer in its middle.
    pub fn new(width: u32, height: u32) -> Self {
        let shared = Arc::new(Mutex::new(DesktopShared {
            state: DesktopState {
                width,
                height,
                pointer: (f64::from(width) / 2.0, f64::from(height) / 2.0),
                clicks: 0,
                typed: String::new(),
            },
            calls: Vec::new(),
        }));
        let handler = |name: &'static str| {
            let shared = Arc::clone(&shared);
            move |input: Map<String, Value>| {
                let mut shared = guard(&shared);
                shared.calls.push((name.to_owned(), input.clone()));
                let state = &mut shared.state;
                let result = match name {
                    "screen" => Ok(json!({
                        "format": "rgba8", "width": state.width, "height": state.height,
                    })),
                    "move_pointer" => {
                        let x = input.get("x").and_then(Value::as_f64).unwrap_or(-1.0);
                        let y = input.get("y").and_then(Value::as_f64).unwrap_or(-1.0);
                        if (0.0..f64::from(state.width)).contains(&x)
                            && (0.0..f64::from(state.height)).contains(&y)
                        {
                            state.pointer = (x, y);
                            Ok(json!({"x": js_number(x), "y": js_number(y)}))
                        } else {
                            Err(HandlerError::new("the point is off the screen"))
                        }
                    }
                    "click" => {
                        let button = input
                            .get("button")
                            .and_then(Value::as_str)
                            .unwrap_or("left");
                        if matches!(button, "left" | "right" | "middle") {
                            state.clicks += 1;
                            Ok(json!({"clicked": button}))
                        } else {
                            Err(HandlerError::new("button must be left, right or middle"))
                        }
                    }
                    "type_text" => {
                        let text = input.get("text").and_then(Value::as_str).unwrap_or("");
                        state.typed.push_str(text);
                        Ok(json!({"typed": text.chars().count()}))
                    }
                    _ => Ok(json!({
                        "width": state.width, "height": state.height,
                        "pointer": {"x": js_number(state.pointer.0), "y": js_number(state.pointer.1)},
                    })),
                };
                async move { result }
            }
        };
        let device = finish(
            define(DESKTOP_MANIFEST)
                .handler("screen", handler("screen"))
                .handler("read_screen", handler("read_screen"))
                .handler("move_pointer", handler("move_pointer"))
                .handler("click", handler("click"))
                .handler("type_text", handler("type_text")),
        );
        Desktop { device, shared }
    }

    /// The device, to serve or invoke.
    pub fn device(&self) -> Device {
        self.device.clone()
    }

    /// The bridge's state now.
    pub fn state(&self) -> DesktopState {
        guard(&self.shared).state.clone()
    }

    /// Every call received so far, in order.
    pub fn calls(&self) -> Vec<CallRecord> {
        guard(&self.shared).calls.clone()
    }

    /// Screenshot number `index`: `width * height * 4` bytes of RGBA, a
    /// gradient that moves with the index, the pointer a white square.
    pub fn screenshot(&self, index: u64) -> Vec<u8> {
        let state = self.state();
        let (width, height) = (state.width as usize, state.height as usize);
        let (px, py) = (state.pointer.0 as usize, state.pointer.1 as usize);
        let shift = (index % 256) as usize;
        let mut out = Vec::with_capacity(width.saturating_mul(height).saturating_mul(4));
        for y in 0..height {
            for x in 0..width {
                let pointer = x.abs_diff(px) < 4 && y.abs_diff(py) < 4;
                let (r, g, b) = if pointer {
                    (255, 255, 255)
                } else {
                    (
                        ((x + shift) % 256) as u8,
                        ((y + shift) % 256) as u8,
                        shift as u8,
                    )
                };
                out.extend_from_slice(&[r, g, b, 255]);
            }
        }
        out
    }
}
