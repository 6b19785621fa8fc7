//! The desktop device on its own (no vessel, no agent: its calls made in
//! this process) measured against a real Xvfb (`cargo xtask bench
//! desktop`, or `cargo bench -p dk-desktop --bench desktop`), the screen
//! painted with something like a desktop (gradients, window-like blocks and
//! lines of text-like specks, so the PNG is not trivially small):
//!
//! - `desktop/device_screenshot_1920x1200_to_1280x800` and
//!   `desktop/device_screenshot_1280x800`: a `screenshot` call on the device
//!   (capture, blackout walk, scale, PNG, base64), the median of 40, and the
//!   PNG's size;
//! - `desktop/device_zoom_400x250`: a zoom of a quarter of the screenshot;
//! - `desktop/device_left_click`: a click (checked, moved, pressed, released, and
//!   the server's round trip), the median of 100;
//! - `desktop/device_screenshot_1920x1200_no_blackout` and
//!   `desktop/device_left_click_no_blackout`: the same with nothing
//!   blacked out, so the blackout's own cost is the difference;
//! - `desktop/device_rss_before_screenshots`, `desktop/device_rss_after_screenshots`:
//!   this process's resident memory once connected, and a second after
//!   those calls.
//!
//! Times are reported, never asserted on.

#![allow(
    clippy::unwrap_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "a benchmark: anything that fails stops it, saying what"
)]

use std::time::{Duration, Instant};

use dk_desktop::{Blackout, Desktop, DesktopConfig};
use dk_testkit::x11::Xvfb;
use serde_json::{Map, Value, json};
use x11rb::connection::Connection as _;
use x11rb::protocol::xproto::{ConnectionExt as _, CreateGCAux, ImageFormat};
use x11rb::rust_connection::RustConnection;

fn main() {
    // A filter naming other benches (`cargo xtask bench store`) skips this.
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let skipped = std::env::var("DK_SKIP_X11").is_ok_and(|v| v == "1");
    if skipped
        || !(filters.is_empty()
            || filters
                .iter()
                .any(|f| "desktop/".contains(f.as_str()) || f.starts_with("desktop")))
    {
        return;
    }
    for (width, height) in [(1920u16, 1200u16), (1280, 800)] {
        let xvfb = Xvfb::start(width, height);
        paint(&xvfb, u32::from(width), u32::from(height));
        let config = DesktopConfig {
            display: Some(xvfb.display()),
            blackout: Blackout::new().class("KeePassXC").unwrap(),
            ..DesktopConfig::default()
        };
        let desktop = Desktop::new(&config, None).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let call = |capability: &str, input: Value| {
            let Value::Object(input) = input else {
                return Map::new().into();
            };
            runtime
                .block_on(desktop.device().invoke(capability, input))
                .unwrap()
        };
        if width == 1920 {
            std::thread::sleep(Duration::from_millis(300));
            println!(
                "desktop/device_rss_before_screenshots: {} KiB resident",
                resident_kib()
            );
        }
        let shot = call("screenshot", json!({}));
        let png = shot["image"]["data"].as_str().unwrap().len() / 4 * 3;
        let name = if width == 1920 {
            "screenshot_1920x1200_to_1280x800"
        } else {
            "screenshot_1280x800"
        };
        let median = median(40, || {
            call("screenshot", json!({}));
        });
        println!(
            "desktop/device_{name}: {:.1} ms median (PNG about {} KiB)",
            ms(median),
            png / 1024
        );
        if width == 1920 {
            let median = median_of(40, || {
                call(
                    "zoom",
                    json!({"x": 400, "y": 200, "width": 400, "height": 250}),
                );
            });
            println!("desktop/device_zoom_400x250: {:.1} ms median", ms(median));
            let median = median_of(100, || {
                call("left_click", json!({"x": 640, "y": 400}));
            });
            println!("desktop/device_left_click: {:.2} ms median", ms(median));
            // The blackout's own cost: the same screen with nothing listed
            // (no window tree read, no grab of the server).
            let bare = Desktop::new(
                &DesktopConfig {
                    display: Some(xvfb.display()),
                    ..DesktopConfig::default()
                },
                None,
            )
            .unwrap();
            let bare_call = |capability: &str, input: Value| {
                let Value::Object(input) = input else {
                    return Map::new().into();
                };
                runtime
                    .block_on(bare.device().invoke(capability, input))
                    .unwrap()
            };
            let median = median_of(40, || {
                bare_call("screenshot", json!({}));
            });
            println!(
                "desktop/device_screenshot_1920x1200_no_blackout: {:.1} ms median",
                ms(median)
            );
            let median = median_of(100, || {
                bare_call("left_click", json!({"x": 640, "y": 400}));
            });
            println!(
                "desktop/device_left_click_no_blackout: {:.2} ms median",
                ms(median)
            );
            std::thread::sleep(Duration::from_secs(1));
            println!(
                "desktop/device_rss_after_screenshots: {} KiB resident (this process: the device, its runtime and the X thread, system allocator)",
                resident_kib()
            );
        }
    }
}

/// This process's resident memory, from `/proc/self/status`.
fn resident_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn median(runs: usize, f: impl FnMut()) -> Duration {
    median_of(runs, f)
}

fn median_of(runs: usize, mut f: impl FnMut()) -> Duration {
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    times.sort();
    times[times.len() / 2]
}

/// Paints the root window with gradients, blocks and text-like specks.
fn paint(xvfb: &Xvfb, width: u32, height: u32) {
    let (conn, _) = RustConnection::connect(Some(&xvfb.display())).unwrap();
    let screen = &conn.setup().roots[0];
    let (root, depth) = (screen.root, screen.root_depth);
    let gc = conn.generate_id().unwrap();
    conn.create_gc(gc, root, &CreateGCAux::new()).unwrap();
    let hash = |v: u32| {
        let v = v.wrapping_mul(0x9e37_79b9) ^ 0x5bd1_e995;
        (v ^ (v >> 15)).wrapping_mul(0x2c1b_3c6d) >> 8
    };
    // Text: lines of 8x11 cells, each one of 60 glyphs (a fixed pattern of
    // specks per glyph), so glyphs repeat as letters do.
    let ink = |x: u32, y: u32| {
        let (cell, line) = (x / 8, y / 18);
        let glyph = hash(cell.wrapping_mul(31).wrapping_add(line.wrapping_mul(977))) % 60;
        glyph != 0 && hash(glyph * 1000 + (y % 18) * 8 + x % 8) % 10 < 3
    };
    const ROWS: u32 = 16;
    for top in (0..height).step_by(ROWS as usize) {
        let mut data = Vec::with_capacity((width * ROWS * 4) as usize);
        for y in top..top + ROWS {
            for x in 0..width {
                let window = (x / 320 + y / 240) % 3 == 0;
                let text_line = y % 18 < 11 && x % 320 > 20 && x % 320 < 290;
                let (r, g, b) = if window && text_line && ink(x, y) {
                    (20, 20, 30)
                } else if window {
                    (245, 245, 240)
                } else {
                    ((x * 255 / width) as u8, (y * 255 / height) as u8, 160)
                };
                data.extend_from_slice(&[b, g, r, 0]);
            }
        }
        conn.put_image(
            ImageFormat::Z_PIXMAP,
            root,
            gc,
            width as u16,
            ROWS as u16,
            0,
            top as i16,
            0,
            depth,
            &data,
        )
        .unwrap();
    }
    conn.flush().unwrap();
    conn.get_input_focus().unwrap().reply().unwrap();
}
