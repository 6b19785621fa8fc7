//! The desktop as a dk device: its manifest (the blackout list written into
//! the screenshot's and zoom's descriptions), and one handler per
//! capability, each checking its input before anything reaches X.

use std::time::{Duration, Instant};

use base64::Engine as _;
use dk_device::{DefineError, Device, HandlerError};
use dk_proto::media::{ImageContent, ImageMime};
use serde_json::{Map, Value, json};

use crate::config::{DesktopConfig, Size};
use crate::desk::{Desk, DeskHandle, Refusal, shoot};
use crate::image::{self, encode_png};
use crate::keys::{self, Keysym};
use crate::x11::{DRAG_STEPS, GRAB_LIMIT, Pressed, Session, XError};

/// The manifest's kind.
pub const KIND: &str = "desktop-control";
/// Most text one `type` call types, in UTF-16 code units as the vessel
/// counts a string input: the longest string a call may pass
/// ([`dk_proto::limits::INPUT_STRING`]), so the device and the vessel
/// refuse the same texts.
pub const MAX_TEXT: usize = dk_proto::limits::INPUT_STRING;
/// Most wheel clicks one `scroll` call turns.
pub const MAX_SCROLL: u8 = 30;
/// Longest `wait`, in seconds.
pub const MAX_WAIT_SECONDS: f64 = 5.0;
/// Longest a `key` or `type` call presses keys: well inside a vessel's
/// call time (10 s unless configured), so an agent never reads that a
/// call failed while its keys are still being typed. A call that would
/// take longer stops and says how far it got.
pub const MAX_KEYS_TIME: Duration = Duration::from_secs(8);
/// Longest capability description (UTF-16 code units), as manifests allow.
const MAX_DESCRIPTION: usize = dk_proto::limits::CAPABILITY_DESCRIPTION;

/// Why the device could not be made.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The blackout list does not fit in a capability's description.
    #[error(
        "the blackout list is too long to show in the pairing prompt ({units} of at most {max} characters in the screenshot's description): shorten it, e.g. one title pattern for several windows"
    )]
    BlackoutTooLong {
        /// The description's length, in UTF-16 code units.
        units: usize,
        /// The most a description may hold.
        max: usize,
    },
    /// The manifest was refused (an id or name out of bounds, a hidden
    /// character in the blackout list).
    #[error("{0}")]
    Manifest(#[from] DefineError),
    /// No display was named and `DISPLAY` is not set.
    #[error("no X display: give --display :N (or set DISPLAY)")]
    NoDisplay,
    /// The thread that talks to X could not start.
    #[error("cannot start the X thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// The desktop device: its [`Device`] and the connection behind it.
#[derive(Debug, Clone)]
pub struct Desktop {
    device: Device,
    desk: DeskHandle,
}

impl Desktop {
    /// Makes the device of `config`, with a `screen` stream sensor when
    /// `stream_every` is given, and starts connecting to the display
    /// (which need not be there yet).
    pub fn new(config: &DesktopConfig, stream_every: Option<Duration>) -> Result<Self, StartError> {
        let display = match &config.display {
            Some(display) => display.clone(),
            None => std::env::var("DISPLAY")
                .ok()
                .filter(|d| !d.trim().is_empty())
                .ok_or(StartError::NoDisplay)?,
        };
        let manifest = manifest(config, stream_every)?;
        let desk = DeskHandle::start(
            display,
            config.blackout.clone(),
            config.size,
            config.root_clicks,
        )?;
        let mut builder = Device::define(&manifest);
        for (name, action) in ACTIONS {
            let desk = desk.clone();
            builder = builder.handler(name, move |input: Map<String, Value>| {
                let desk = desk.clone();
                async move { action(desk, input).await }
            });
        }
        if let Some(every) = stream_every {
            let millis = u64::try_from(every.as_millis()).unwrap_or(u64::MAX);
            builder = builder.handler("screen", move |_input| async move {
                Ok(json!({"format": "png", "every_ms": millis}))
            });
        }
        Ok(Desktop {
            device: builder.build()?,
            desk,
        })
    }

    /// The dk device, to serve with dk-device's client.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// A screenshot as PNG bytes (blacked out and scaled like the
    /// `screenshot` capability's), for the `screen` stream.
    pub async fn screenshot_png(&self) -> Result<Vec<u8>, HandlerError> {
        self.desk
            .run(|desk| {
                let png = desk.with(|session, desk| {
                    let (rgb, _) = whole_screen(session, desk)?;
                    encode_png(&rgb).map_err(|e| XError::Failed(e.to_string()))
                })?;
                Ok(png)
            })
            .await
            .map_err(|Refusal(why)| HandlerError::new(why))
    }
}

/// The manifest's JSON.
fn manifest(config: &DesktopConfig, stream_every: Option<Duration>) -> Result<Value, StartError> {
    let size = config.size;
    let blackout = config.blackout.describe();
    let screenshot = format!(
        "A screenshot of the whole screen as a PNG, scaled to fit {size}; every coordinate is in its pixels. {blackout}"
    );
    let zoom = format!(
        "A region of the screenshot (x, y, width, height in screenshot pixels) as a PNG at up to the screen's own resolution, fit to {size}. {blackout}"
    );
    for description in [&screenshot, &zoom] {
        let units = description.encode_utf16().count();
        if units > MAX_DESCRIPTION {
            return Err(StartError::BlackoutTooLong {
                units,
                max: MAX_DESCRIPTION,
            });
        }
    }
    // Every number is bounded in the manifest (the dk extension), so the
    // vessel refuses one out of range before the person is asked; the
    // device checks each again against the screenshot it took.
    let (wide, high) = (size.width.saturating_sub(1), size.height.saturating_sub(1));
    let bounded = |description: &str, required: bool, (min, max): (u32, u32)| {
        json!({"type": "number", "description": description, "required": required,
               "minimum": min, "maximum": max})
    };
    let across = |description: &str| bounded(description, true, (0, wide));
    let down = |description: &str| bounded(description, true, (0, high));
    let point = json!({
        "x": bounded("screenshot pixels from the left; with y, or neither for where the pointer is", false, (0, wide)),
        "y": bounded("screenshot pixels from the top; with x", false, (0, high)),
    });
    let click = |what: &str| {
        let mut params = point.clone();
        if let Some(map) = params.as_object_mut() {
            map.insert(
                "modifiers".to_owned(),
                json!({"type": "string", "description": "keys held during the click, e.g. ctrl+shift"}),
            );
        }
        json!({"kind": "actuator", "description": what, "params": params})
    };
    let mut capabilities = vec![
        json!({"name": "screenshot", "kind": "sensor", "description": screenshot}),
        json!({"name": "zoom", "kind": "sensor", "description": zoom, "params": {
            "x": across("left edge, screenshot pixels"),
            "y": down("top edge, screenshot pixels"),
            "width": bounded("width, screenshot pixels", true, (1, size.width.max(1))),
            "height": bounded("height, screenshot pixels", true, (1, size.height.max(1))),
        }}),
        json!({"name": "cursor_position", "kind": "sensor",
               "description": "Where the pointer is, in screenshot pixels: {x, y}; refused while it is in a blacked-out area."}),
        json!({"name": "mouse_move", "kind": "actuator",
               "description": "Move the pointer to a point of the screenshot.",
               "params": {"x": across("screenshot pixels from the left"),
                          "y": down("screenshot pixels from the top")}}),
        click("Click the left button at a point (or where the pointer is)."),
        click("Click the right button at a point (or where the pointer is)."),
        click("Click the middle button at a point (or where the pointer is)."),
        click("Double-click the left button at a point (or where the pointer is)."),
        click("Triple-click the left button at a point (or where the pointer is)."),
        json!({"name": "left_click_drag", "kind": "actuator",
               "description": "Press the left button at a start point, move to an end point and release.",
               "params": {"start_x": across("start, screenshot pixels from the left"),
                          "start_y": down("start, screenshot pixels from the top"),
                          "x": across("end, screenshot pixels from the left"),
                          "y": down("end, screenshot pixels from the top")}}),
        json!({"name": "scroll", "kind": "actuator",
               "description": "Turn the mouse wheel at a point (or where the pointer is).",
               "params": {"direction": {"type": "string", "required": true, "description": "up, down, left or right",
                                        "enum": ["up", "down", "left", "right"]},
                          "amount": {"type": "number", "required": true, "description": "wheel clicks, 1 to 30",
                                     "integer": true, "minimum": 1, "maximum": 30},
                          "x": bounded("screenshot pixels from the left; with y", false, (0, wide)),
                          "y": bounded("screenshot pixels from the top; with x", false, (0, high))}}),
        json!({"name": "key", "kind": "actuator", "confirm": true,
               "description": "Press a key combination such as ctrl+s, Return or alt+Tab (up to 16, separated by spaces) in the focused window: modifiers, named keys, F1-F24 and single characters. Asks the person every time.",
               "params": {"text": {"type": "string", "required": true, "description": "the combination(s), xdotool style"}}}),
        json!({"name": "type", "kind": "actuator", "confirm": true,
               "description": "Type text (any Unicode; a new line presses Return) into the focused window. Asks the person every time.",
               "params": {"text": {"type": "string", "required": true, "multiline": true, "description": "what to type, at most 1000 characters; new lines and tabs press Return and Tab"}}}),
        json!({"name": "wait", "kind": "actuator",
               "description": "Wait a while, e.g. for a window to open.",
               "params": {"duration": bounded("seconds, more than 0 and at most 5", true, (0, 5))}}),
    ];
    // The clicks' names, in the order above.
    for (capability, name) in capabilities.iter_mut().skip(4).zip([
        "left_click",
        "right_click",
        "middle_click",
        "double_click",
        "triple_click",
    ]) {
        if let Some(map) = capability.as_object_mut() {
            map.insert("name".to_owned(), json!(name));
        }
    }
    if let Some(every) = stream_every {
        capabilities.push(json!({"name": "screen", "kind": "sensor",
            "description": format!("Streams the screen: one PNG screenshot (fit to {size}, blacked out as the screenshot is) every {} ms.", every.as_millis())}));
    }
    Ok(json!({
        "dk": 1,
        "id": config.id,
        "name": config.name,
        "kind": KIND,
        "version": env!("CARGO_PKG_VERSION"),
        "capabilities": capabilities,
    }))
}

/// A handler's work, given the X thread's handle and the call's input.
type Action = fn(
    DeskHandle,
    Map<String, Value>,
) -> std::pin::Pin<Box<dyn Future<Output = Result<Value, HandlerError>> + Send>>;

/// Every capability but the stream, with its handler.
const ACTIONS: [(&str, Action); 14] = [
    ("screenshot", |d, i| Box::pin(screenshot(d, i))),
    ("zoom", |d, i| Box::pin(zoom(d, i))),
    ("cursor_position", |d, i| Box::pin(cursor_position(d, i))),
    ("mouse_move", |d, i| Box::pin(mouse_move(d, i))),
    ("left_click", |d, i| Box::pin(click(d, i, 1, 1))),
    ("right_click", |d, i| Box::pin(click(d, i, 3, 1))),
    ("middle_click", |d, i| Box::pin(click(d, i, 2, 1))),
    ("double_click", |d, i| Box::pin(click(d, i, 1, 2))),
    ("triple_click", |d, i| Box::pin(click(d, i, 1, 3))),
    ("left_click_drag", |d, i| Box::pin(drag(d, i))),
    ("scroll", |d, i| Box::pin(scroll(d, i))),
    ("key", |d, i| Box::pin(key(d, i))),
    ("type", |d, i| Box::pin(type_text(d, i))),
    ("wait", |_, i| Box::pin(wait(i))),
];

fn refuse(why: impl Into<String>) -> HandlerError {
    HandlerError::new(why)
}

/// A number as an agent wrote it, short: whole numbers as they are,
/// others to at most 6 significant digits, very large or small ones with
/// an exponent (`1e300`), never a long run of digits.
fn show(n: f64) -> String {
    if n.is_finite() && n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else if n != 0.0 && (n.abs() >= 1e15 || n.abs() < 1e-4) {
        let text = format!("{n:.5e}");
        match text.split_once('e') {
            Some((mantissa, exponent)) => {
                let mantissa = mantissa.trim_end_matches('0').trim_end_matches('.');
                format!("{mantissa}e{exponent}")
            }
            None => text,
        }
    } else {
        let text = format!("{n:.6}");
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    }
}

fn number(input: &Map<String, Value>, name: &str) -> Result<Option<f64>, HandlerError> {
    match input.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(v) if v.is_finite() => Ok(Some(v)),
            _ => Err(refuse(format!("{name} is not a finite number"))),
        },
        Some(_) => Err(refuse(format!("{name} must be a number"))),
    }
}

fn required(input: &Map<String, Value>, name: &str) -> Result<f64, HandlerError> {
    number(input, name)?.ok_or_else(|| refuse(format!("{name} is required")))
}

fn text<'a>(input: &'a Map<String, Value>, name: &str) -> Result<&'a str, HandlerError> {
    match input.get(name) {
        Some(Value::String(s)) => Ok(s),
        None | Some(Value::Null) => Err(refuse(format!("{name} is required"))),
        Some(_) => Err(refuse(format!("{name} must be a string"))),
    }
}

/// A point the agent gave, in screenshot pixels, not yet checked against
/// the screenshot's size.
#[derive(Debug, Clone, Copy)]
struct Point {
    x: f64,
    y: f64,
    /// The names to use in messages.
    names: (&'static str, &'static str),
}

fn point(
    input: &Map<String, Value>,
    names: (&'static str, &'static str),
) -> Result<Option<Point>, HandlerError> {
    match (number(input, names.0)?, number(input, names.1)?) {
        (Some(x), Some(y)) => Ok(Some(Point { x, y, names })),
        (None, None) => Ok(None),
        _ => Err(refuse(format!(
            "give both {} and {}, or neither",
            names.0, names.1
        ))),
    }
}

fn required_point(
    input: &Map<String, Value>,
    names: (&'static str, &'static str),
) -> Result<Point, HandlerError> {
    required(input, names.0)?;
    required(input, names.1)?;
    point(input, names)?.ok_or_else(|| refuse(format!("{} is required", names.0)))
}

/// The screen and the screenshot's sizes, and the conversions between
/// their pixels.
#[derive(Debug, Clone, Copy)]
struct Scale {
    screen: (u32, u32),
    shot: (u32, u32),
}

impl Scale {
    fn of(session: &Session, size: Size) -> Result<Self, XError> {
        let screen = session.size()?;
        Ok(Scale {
            screen,
            shot: image::fit(screen.0, screen.1, size),
        })
    }

    /// `v` screenshot pixels along an axis of `shot` pixels, in screen
    /// pixels: `round(v * screen / shot)`, inside the screen.
    fn to_screen(v: f64, screen: u32, shot: u32) -> i64 {
        let scaled = (v * f64::from(screen) / f64::from(shot.max(1))).round();
        (scaled as i64).clamp(0, i64::from(screen.max(1)) - 1)
    }

    fn to_shot(v: i64, screen: u32, shot: u32) -> i64 {
        let scaled = (v as f64 * f64::from(shot) / f64::from(screen.max(1))).round();
        (scaled as i64).clamp(0, i64::from(shot.max(1)) - 1)
    }

    /// Checks a point is inside the screenshot, and gives it in screen
    /// pixels.
    fn place(&self, p: Point) -> Result<(i64, i64), String> {
        for (v, name, side) in [(p.x, p.names.0, self.shot.0), (p.y, p.names.1, self.shot.1)] {
            if !(v.is_finite() && v >= 0.0 && v < f64::from(side)) {
                return Err(format!(
                    "{name} {} is outside the screenshot (0 to {})",
                    show(v),
                    side.saturating_sub(1)
                ));
            }
        }
        Ok((
            Self::to_screen(p.x, self.screen.0, self.shot.0),
            Self::to_screen(p.y, self.screen.1, self.shot.1),
        ))
    }
}

/// Why a press at the screenshot point `p` is refused: it is on the bare
/// desktop.
fn on_desktop(p: Point) -> String {
    format!(
        "the point ({}, {}) is on the desktop itself, where this device does not click",
        show(p.x),
        show(p.y)
    )
}

/// Why an action at the screenshot point `p` is refused: it is blacked out.
fn in_blackout(p: Point) -> String {
    format!(
        "the point ({}, {}) is in a blacked-out area",
        show(p.x),
        show(p.y)
    )
}

/// Runs a pointer action at `points` (checked: inside the screenshot, not
/// blacked out, and the first not on the bare desktop when it `presses` a
/// button, unless the configuration allows it) on the X thread; with no
/// points, at the pointer (checked likewise), `act` then given none. With
/// `keys` (modifiers held), where keys go is checked too. The checks and
/// `act` run with the server grabbed: nothing moves in between.
async fn pointer_action(
    desk: &DeskHandle,
    points: Vec<Point>,
    presses: bool,
    keys: bool,
    act: impl FnOnce(&Session, &[(i64, i64)]) -> Result<(), XError> + Send + 'static,
) -> Result<Result<(), String>, HandlerError> {
    desk.run(move |desk| {
        desk.with(|session, desk| {
            let scale = Scale::of(session, desk.size())?;
            let mut placed = Vec::new();
            for &p in &points {
                match scale.place(p) {
                    Ok(at) => placed.push(at),
                    Err(why) => return Ok(Err(why)),
                }
            }
            let checks_root = presses && !desk.root_clicks();
            session.grabbed(|| {
                let blacked = session.blacked(desk.blackout(), Instant::now() + GRAB_LIMIT)?;
                if points.is_empty() {
                    let (x, y) = session.pointer()?;
                    if blacked.covers(x, y) {
                        return Ok(Err("the pointer is in a blacked-out area".to_owned()));
                    }
                    if checks_root && session.top_under_pointer()?.is_none() {
                        return Ok(Err(
                            "the pointer is on the desktop itself, where this device does not click"
                                .to_owned(),
                        ));
                    }
                }
                for (&p, &(x, y)) in points.iter().zip(&placed) {
                    if blacked.covers(x, y) {
                        return Ok(Err(in_blackout(p)));
                    }
                }
                if let (true, Some(&p), Some(&(x, y))) =
                    (checks_root, points.first(), placed.first())
                    && session.top_at(x, y)?.is_none()
                {
                    return Ok(Err(on_desktop(p)));
                }
                if keys && let Some(why) = session.keys_go(&blacked)?.refusal() {
                    return Ok(Err(why.to_owned()));
                }
                act(session, &placed).map(Ok)
            })
        })
    })
    .await
    .map_err(|Refusal(why)| refuse(why))
}

fn whole_screen(session: &Session, desk: &Desk) -> Result<(image::Rgb, bool), XError> {
    let (width, height) = session.size()?;
    shoot(session, desk.blackout(), (0, 0, width, height), desk.size())
}

fn image_result(rgb: &image::Rgb, blacked_out: bool) -> Result<Value, HandlerError> {
    let png = encode_png(rgb).map_err(|e| refuse(e.to_string()))?;
    image::check_fits(&png).map_err(|e| refuse(e.to_string()))?;
    let image = ImageContent::new(
        ImageMime::Png,
        base64::engine::general_purpose::STANDARD.encode(&png),
    );
    Ok(json!({
        "width": rgb.width(),
        "height": rgb.height(),
        "image": image,
        "blacked_out": blacked_out,
    }))
}

async fn screenshot(desk: DeskHandle, _input: Map<String, Value>) -> Result<Value, HandlerError> {
    let (rgb, blacked_out) = desk
        .run(|desk| desk.with(whole_screen))
        .await
        .map_err(|Refusal(why)| refuse(why))?;
    image_result(&rgb, blacked_out)
}

async fn zoom(desk: DeskHandle, input: Map<String, Value>) -> Result<Value, HandlerError> {
    let corner = required_point(&input, ("x", "y"))?;
    let (width, height) = (required(&input, "width")?, required(&input, "height")?);
    for (v, name) in [(width, "width"), (height, "height")] {
        if v <= 0.0 {
            return Err(refuse(format!(
                "{name} {} must be more than 0 screenshot pixels",
                show(v)
            )));
        }
    }
    let shot = desk
        .run(move |desk| {
            desk.with(|session, desk| {
                let scale = Scale::of(session, desk.size())?;
                let (x0, y0) = match scale.place(corner) {
                    Ok(at) => at,
                    Err(why) => return Ok(Err(why)),
                };
                // The far edges, clamped to the screen's.
                let edge = |v: f64, screen: u32, shot: u32| {
                    let scaled = (v * f64::from(screen) / f64::from(shot.max(1))).round();
                    (scaled as i64).clamp(1, i64::from(screen))
                };
                let x1 = edge(corner.x + width, scale.screen.0, scale.shot.0).max(x0 + 1);
                let y1 = edge(corner.y + height, scale.screen.1, scale.shot.1).max(y0 + 1);
                let area = (x0 as u32, y0 as u32, (x1 - x0) as u32, (y1 - y0) as u32);
                shoot(session, desk.blackout(), area, desk.size()).map(Ok)
            })
        })
        .await
        .map_err(|Refusal(why)| refuse(why))?;
    let (rgb, blacked_out) = shot.map_err(refuse)?;
    image_result(&rgb, blacked_out)
}

async fn cursor_position(
    desk: DeskHandle,
    _input: Map<String, Value>,
) -> Result<Value, HandlerError> {
    let (x, y) = desk
        .run(|desk| {
            desk.with(|session, desk| {
                let scale = Scale::of(session, desk.size())?;
                let (x, y) = session.pointer()?;
                let blacked = session.blacked(desk.blackout(), Instant::now() + GRAB_LIMIT)?;
                if blacked.covers(x, y) {
                    return Ok(Err("the pointer is in a blacked-out area"));
                }
                Ok(Ok((
                    Scale::to_shot(x, scale.screen.0, scale.shot.0),
                    Scale::to_shot(y, scale.screen.1, scale.shot.1),
                )))
            })
        })
        .await
        .map_err(|Refusal(why)| refuse(why))?
        .map_err(refuse)?;
    Ok(json!({"x": x, "y": y}))
}

async fn mouse_move(desk: DeskHandle, input: Map<String, Value>) -> Result<Value, HandlerError> {
    let p = required_point(&input, ("x", "y"))?;
    pointer_action(&desk, vec![p], false, false, |session, at| {
        match at.first() {
            Some(&(x, y)) => session.move_to(x, y),
            None => Ok(()),
        }
    })
    .await?
    .map_err(refuse)?;
    Ok(json!({"moved": true, "x": p.x, "y": p.y}))
}

fn modifiers(input: &Map<String, Value>) -> Result<Vec<Keysym>, HandlerError> {
    let Some(value) = input.get("modifiers") else {
        return Ok(Vec::new());
    };
    let Value::String(names) = value else {
        return Err(refuse("modifiers must be a string such as ctrl+shift"));
    };
    names
        .split('+')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|n| keys::modifier(n).ok_or_else(|| refuse(format!("\"{n}\" is not a modifier"))))
        .collect()
}

async fn click(
    desk: DeskHandle,
    input: Map<String, Value>,
    button: u8,
    count: u8,
) -> Result<Value, HandlerError> {
    let p = point(&input, ("x", "y"))?;
    let held = modifiers(&input)?;
    let keys = !held.is_empty();
    pointer_action(
        &desk,
        p.into_iter().collect(),
        true,
        keys,
        move |session, at| session.click(at.first().copied(), button, count, &held),
    )
    .await?
    .map_err(refuse)?;
    Ok(json!({"clicked": true, "count": count}))
}

async fn drag(desk: DeskHandle, input: Map<String, Value>) -> Result<Value, HandlerError> {
    let start = required_point(&input, ("start_x", "start_y"))?;
    let end = required_point(&input, ("x", "y"))?;
    desk.run(move |desk| {
        desk.with(|session, desk| {
            let scale = Scale::of(session, desk.size())?;
            let (from, to) = match (scale.place(start), scale.place(end)) {
                (Ok(from), Ok(to)) => (from, to),
                (Err(why), _) | (_, Err(why)) => return Ok(Err(why)),
            };
            let blackout = desk.blackout();
            let checks_root = !desk.root_clicks();
            session.drag(
                from,
                to,
                || {
                    let blacked = session.blacked(blackout, Instant::now() + GRAB_LIMIT)?;
                    for (p, (x, y)) in [(start, from), (end, to)] {
                        if blacked.covers(x, y) {
                            return Ok(Err(in_blackout(p)));
                        }
                    }
                    let crosses = (1..DRAG_STEPS).any(|step| {
                        let along =
                            |a: i64, b: i64| a + (b - a) * i64::from(step) / i64::from(DRAG_STEPS);
                        blacked.covers(along(from.0, to.0), along(from.1, to.1))
                    });
                    if crosses {
                        return Ok(Err("the drag's path crosses a blacked-out area".to_owned()));
                    }
                    if checks_root && session.top_at(from.0, from.1)?.is_none() {
                        return Ok(Err(on_desktop(start)));
                    }
                    Ok(Ok(()))
                },
                || {
                    let blacked = session.blacked(blackout, Instant::now() + GRAB_LIMIT)?;
                    Ok(if blacked.covers(to.0, to.1) {
                        Err(format!(
                            "{} now; the button was released where the drag began",
                            in_blackout(end)
                        ))
                    } else {
                        Ok(())
                    })
                },
            )
        })
    })
    .await
    .map_err(|Refusal(why)| refuse(why))?
    .map_err(refuse)?;
    Ok(json!({"dragged": true}))
}

async fn scroll(desk: DeskHandle, input: Map<String, Value>) -> Result<Value, HandlerError> {
    let direction = text(&input, "direction")?;
    let button = match direction {
        "up" => 4,
        "down" => 5,
        "left" => 6,
        "right" => 7,
        other => {
            return Err(refuse(format!(
                "direction must be up, down, left or right, not \"{}\"",
                other.chars().take(40).collect::<String>()
            )));
        }
    };
    let amount = required(&input, "amount")?;
    if amount.fract() != 0.0 || !(1.0..=f64::from(MAX_SCROLL)).contains(&amount) {
        return Err(refuse(format!(
            "amount must be a whole number of wheel clicks from 1 to {MAX_SCROLL}, not {}",
            show(amount)
        )));
    }
    let clicks = amount as u8;
    let p = point(&input, ("x", "y"))?;
    pointer_action(
        &desk,
        p.into_iter().collect(),
        true,
        false,
        move |session, at| session.scroll(at.first().copied(), button, clicks),
    )
    .await?
    .map_err(refuse)?;
    Ok(json!({"scrolled": direction, "amount": clicks}))
}

/// Presses `combos` (`what` they are, counted in messages), each only
/// where its keys go is verified, within [`MAX_KEYS_TIME`].
async fn press(
    desk: &DeskHandle,
    combos: Vec<keys::Combo>,
    what: &'static str,
) -> Result<(), HandlerError> {
    let total = combos.len();
    let pressed = desk
        .run(move |desk| {
            desk.with(|session, desk| {
                session.press_combos(&combos, desk.blackout(), Instant::now() + MAX_KEYS_TIME)
            })
        })
        .await
        .map_err(|Refusal(why)| refuse(why))?;
    match pressed {
        Pressed::All => Ok(()),
        Pressed::Stopped { done: 0, why } => Err(refuse(why)),
        Pressed::Stopped { done, why } => {
            let verb = if what == "characters" {
                "typed"
            } else {
                "pressed"
            };
            Err(refuse(format!(
                "{why}; {done} of {total} {what} were {verb} first"
            )))
        }
        Pressed::OutOfTime { done } => Err(refuse(format!(
            "the call's {} s ran out after {done} of {total} {what}; the rest were not typed",
            MAX_KEYS_TIME.as_secs()
        ))),
    }
}

async fn key(desk: DeskHandle, input: Map<String, Value>) -> Result<Value, HandlerError> {
    let combos = keys::combos(text(&input, "text")?).map_err(|e| refuse(e.to_string()))?;
    let count = combos.len();
    press(&desk, combos, "key combinations").await?;
    Ok(json!({"pressed": count}))
}

async fn type_text(desk: DeskHandle, input: Map<String, Value>) -> Result<Value, HandlerError> {
    let text = text(&input, "text")?;
    let characters = dk_proto::utf16_len(text);
    if characters > MAX_TEXT {
        return Err(refuse(format!(
            "the text is {characters} characters; at most {MAX_TEXT} are typed at once"
        )));
    }
    let combos: Vec<keys::Combo> = keys::text_keysyms(text)
        .map_err(|e| refuse(e.to_string()))?
        .into_iter()
        .map(|key| keys::Combo {
            modifiers: Vec::new(),
            key,
        })
        .collect();
    press(&desk, combos, "characters").await?;
    Ok(json!({"typed": characters}))
}

async fn wait(input: Map<String, Value>) -> Result<Value, HandlerError> {
    let duration = required(&input, "duration")?;
    if !(duration > 0.0 && duration <= MAX_WAIT_SECONDS) {
        return Err(refuse(format!(
            "duration must be more than 0 and at most 5 seconds, not {}",
            show(duration)
        )));
    }
    tokio::time::sleep(Duration::from_secs_f64(duration)).await;
    Ok(json!({"waited": duration}))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Blackout, Region};

    #[test]
    fn the_manifest_holds_the_blackout_list() {
        let mut config = DesktopConfig {
            blackout: Blackout::new()
                .class("KeePassXC")
                .and_then(|b| b.title("*Password*"))
                .map(|b| {
                    b.region(Region {
                        x: 0,
                        y: 0,
                        width: 200,
                        height: 100,
                    })
                })
                .unwrap_or_default(),
            ..DesktopConfig::default()
        };
        let value = manifest(&config, None).unwrap_or(Value::Null);
        let checked = dk_proto::validate_manifest(&value);
        let Ok(checked) = checked else {
            unreachable!("{checked:?}")
        };
        assert_eq!(checked.kind(), KIND);
        let names: Vec<&str> = checked.capabilities().iter().map(|c| c.name()).collect();
        assert_eq!(
            names,
            [
                "screenshot",
                "zoom",
                "cursor_position",
                "mouse_move",
                "left_click",
                "right_click",
                "middle_click",
                "double_click",
                "triple_click",
                "left_click_drag",
                "scroll",
                "key",
                "type",
                "wait"
            ]
        );
        let description = checked
            .capabilities()
            .first()
            .map(|c| c.description().to_owned())
            .unwrap_or_default();
        assert!(description.ends_with("Blacked out before any pixel leaves the device: windows of class KeePassXC; windows titled *Password*; screen region 0,0 200x100."), "{description}");
        let streaming = manifest(&config, Some(Duration::from_millis(500))).unwrap_or(Value::Null);
        let streaming = dk_proto::validate_manifest(&streaming);
        assert!(streaming.is_ok_and(|m| {
            m.capabilities()
                .last()
                .is_some_and(|c| c.name() == "screen" && c.description().contains("every 500 ms"))
        }));
        let plain = manifest_digest(&DesktopConfig::default());
        assert_ne!(plain, manifest_digest(&config));
        for i in 0..40 {
            config.blackout = config
                .blackout
                .clone()
                .title(&format!("*secret {i}*"))
                .unwrap_or_default();
        }
        assert!(matches!(
            manifest(&config, None),
            Err(StartError::BlackoutTooLong { .. })
        ));
    }

    #[test]
    fn the_manifest_bounds_every_number_so_the_vessel_refuses_before_the_person() {
        let config = DesktopConfig::default();
        let value = manifest(&config, None).unwrap_or(Value::Null);
        let Ok(checked) = dk_proto::validate_manifest(&value) else {
            unreachable!("{value}")
        };
        assert!(checked.extended());
        let check = |capability: &str, input: Value| {
            let capability = checked.capability(capability).cloned();
            capability.map(|c| dk_proto::check_input(&c, &input).map_err(|e| e.to_string()))
        };
        let (wide, high) = (config.size.width - 1, config.size.height - 1);
        assert_eq!(
            check("mouse_move", json!({"x": wide, "y": high})),
            Some(Ok(()))
        );
        assert_eq!(
            check("mouse_move", json!({"x": wide + 1, "y": 0})),
            Some(Err(format!("\"x\" must be at most {wide}")))
        );
        assert_eq!(
            check("left_click", json!({"x": -1, "y": 0})),
            Some(Err("\"x\" must be at least 0".to_owned()))
        );
        assert_eq!(
            check("scroll", json!({"direction": "sideways", "amount": 1})),
            Some(Err(
                "\"direction\" must be one of \"up\", \"down\", \"left\", \"right\"".to_owned()
            ))
        );
        assert_eq!(
            check("scroll", json!({"direction": "up", "amount": 31})),
            Some(Err("\"amount\" must be at most 30".to_owned()))
        );
        assert_eq!(
            check("wait", json!({"duration": 6})),
            Some(Err("\"duration\" must be at most 5".to_owned()))
        );
        assert_eq!(
            check("zoom", json!({"x": 0, "y": 0, "width": 0, "height": 10})),
            Some(Err("\"width\" must be at least 1".to_owned()))
        );
    }

    fn manifest_digest(config: &DesktopConfig) -> String {
        let value = manifest(config, None).unwrap_or(Value::Null);
        dk_proto::validate_manifest(&value)
            .map(|m| m.digest())
            .unwrap_or_default()
    }

    #[test]
    fn coordinates_scale_back_and_are_checked() {
        let scale = Scale {
            screen: (1920, 1200),
            shot: (1280, 800),
        };
        let p = |x, y| Point {
            x,
            y,
            names: ("x", "y"),
        };
        assert_eq!(scale.place(p(100.0, 100.0)), Ok((150, 150)));
        assert_eq!(scale.place(p(1279.0, 799.0)), Ok((1919, 1199)));
        assert_eq!(scale.place(p(0.4, 0.0)), Ok((1, 0)));
        assert_eq!(
            scale.place(p(1500.0, 0.0)),
            Err("x 1500 is outside the screenshot (0 to 1279)".to_owned())
        );
        assert_eq!(
            scale.place(p(0.0, -1.0)),
            Err("y -1 is outside the screenshot (0 to 799)".to_owned())
        );
        assert_eq!(Scale::to_shot(1919, 1920, 1280), 1279);
        assert_eq!(Scale::to_shot(150, 1920, 1280), 100);
    }
}
