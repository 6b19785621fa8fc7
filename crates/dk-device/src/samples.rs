//! Ready-made devices: 8DK's reference desk lamp, a front door lock and a
//! hall thermostat, with state a test can inspect.
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
}

impl Default for Thermostat {
    fn default() -> Self {
        Self::new()
    }
}

impl Thermostat {
    /// A thermostat at 20 °C, target 20, mode `auto`.
    pub fn new() -> Self {
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
            define(THERMOSTAT_MANIFEST)
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
        Thermostat { device, shared }
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
    /// `("read_temperature", {current, target, mode})`.
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
        Some(("read_temperature".to_owned(), data))
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
