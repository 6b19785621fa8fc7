//! A blacked-out window out of reach in every setup: keys decided where
//! the server will send them (the focus, or the window under the pointer
//! when the focus is the root or follows the pointer), for the whole
//! call; screenshots taken in one instant with the window list, even of
//! a window that moves all the while; text that arrives whole in a Tk
//! program, which reads the keyboard mapping lazily; titles too long or
//! too broken to read blacked out; and less said: no click on the bare
//! desktop, no pointer position inside a blackout, no keysym outside the
//! documented names, no long number echoed.

use std::sync::atomic::{AtomicBool, Ordering};

use dk_desktop::{Blackout, DesktopConfig};
use dk_testkit::x11::{Rect, TestWindow, TkEntry, WindowSpec, Xvfb};
use serde_json::json;
use x11rb::connection::Connection as _;
use x11rb::protocol::xproto::{
    AtomEnum, ConfigureWindowAux, ConnectionExt as _, InputFocus, PropMode,
};
use x11rb::rust_connection::RustConnection;
use x11rb::wrapper::ConnectionExt as _;

use crate::{BLUE, Desk, GREEN, RED, Shot, rgb};

/// The password safe of these tests: blacked out by its title.
const VAULT_TITLE: &str = "Vault - Password Safe";
const VAULT_COLOUR: u32 = 0xc8323c;

fn vault(xvfb: &Xvfb, at: Rect) -> TestWindow {
    TestWindow::open(
        &xvfb.display(),
        WindowSpec::new(VAULT_TITLE, at)
            .class("vault", "Vault")
            .background(rgb(VAULT_COLOUR)),
    )
    .unwrap()
}

fn notes(xvfb: &Xvfb) -> TestWindow {
    TestWindow::open(
        &xvfb.display(),
        WindowSpec::new("Notes - shopping", Rect::new(300, 300, 600, 300))
            .class("notes", "Notes")
            .background(rgb(RED))
            .button(Rect::new(150, 150, 150, 60), rgb(GREEN)),
    )
    .unwrap()
}

fn by_title() -> Blackout {
    Blackout::new().title("*Password*").unwrap()
}

/// A connection of the test's own, and its root window.
fn connect(xvfb: &Xvfb) -> (RustConnection, u32) {
    let (conn, screen) = RustConnection::connect(Some(&xvfb.display())).unwrap();
    let root = conn.setup().roots[screen].root;
    (conn, root)
}

/// Puts the pointer at the screen pixel (`x`, `y`), as the person's mouse
/// would, and gives the keyboard's focus to `focus`.
fn pointer_and_focus(conn: &RustConnection, root: u32, (x, y): (i16, i16), focus: u32) {
    conn.warp_pointer(x11rb::NONE, root, 0, 0, 0, 0, x, y)
        .unwrap();
    conn.set_input_focus(InputFocus::NONE, focus, x11rb::CURRENT_TIME)
        .unwrap();
    conn.sync().unwrap();
}

#[test]
fn without_a_window_manager_keys_never_reach_the_blacked_out_window_under_the_pointer() {
    let xvfb = needs_x11!();
    let notes = notes(&xvfb);
    let vault = vault(&xvfb, Rect::new(1200, 300, 500, 400));
    let desk = Desk::new(&xvfb, by_title());
    let (conn, root) = connect(&xvfb);
    let on_vault = (1400, 500);
    let on_notes = (500, 400);

    // A focused window closed: the focus went back to the root, and keys
    // go to whatever window the pointer rests on, here the vault. The
    // same when the focus follows the pointer (PointerRoot).
    for focus in [root, u32::from(InputFocus::POINTER_ROOT)] {
        pointer_and_focus(&conn, root, on_vault, focus);
        for (capability, text) in [("type", "root-focus-leak"), ("key", "k e y s")] {
            assert_eq!(
                desk.call(capability, json!({"text": text})).unwrap_err(),
                "keys would go to a blacked-out window",
                "{capability} with the focus {focus}"
            );
        }
    }
    // With the pointer on the bare desktop, keys would go to the root
    // window itself; with no focus at all, nowhere.
    pointer_and_focus(&conn, root, (50, 1100), root);
    assert_eq!(
        desk.call("type", json!({"text": "a"})).unwrap_err(),
        "keys would go to the desktop itself (no window has the keyboard's focus)"
    );
    pointer_and_focus(&conn, root, on_notes, u32::from(InputFocus::NONE));
    assert_eq!(
        desk.call("type", json!({"text": "a"})).unwrap_err(),
        "keys would go to the desktop itself (no window has the keyboard's focus)"
    );

    // The focus on the root and the pointer on another window: the keys
    // are that window's, as the server sends them.
    pointer_and_focus(&conn, root, on_notes, root);
    desk.call("type", json!({"text": "fine"})).unwrap();
    assert_eq!(notes.wait_for_text("fine"), "fine");

    vault.sync();
    assert!(vault.received_nothing(), "{:?}", vault.keys());
    notes.sync();
    assert_eq!(notes.text(), "fine");
}

#[test]
fn keys_stop_when_the_focus_moves_to_a_blacked_out_window_during_the_call() {
    let xvfb = needs_x11!();
    let notes = notes(&xvfb);
    let vault = vault(&xvfb, Rect::new(1200, 300, 500, 400));
    let desk = Desk::new(&xvfb, by_title());
    let (conn, root) = connect(&xvfb);
    pointer_and_focus(&conn, root, (50, 1100), notes.id());

    // Characters the keyboard lacks, many more than it has spare keys
    // for: the call takes a while, and the focus moves to the vault once
    // the first of them arrived in the notes.
    let text: String = (0..1000)
        .map(|i| char::from_u32(0x4e00 + (i % 300)).unwrap())
        .collect();
    let moved = AtomicBool::new(false);
    let answer = std::thread::scope(|scope| {
        scope.spawn(|| {
            let _ = notes.wait_for_keys(1);
            vault.focus().unwrap();
            moved.store(true, Ordering::SeqCst);
        });
        desk.call("type", json!({"text": text}))
    });
    assert!(moved.load(Ordering::SeqCst));
    let why = answer.unwrap_err();
    assert!(
        why.starts_with("keys would go to a blacked-out window; ")
            && why.ends_with(" of 1000 characters were typed first"),
        "{why}"
    );
    vault.sync();
    assert!(vault.received_nothing(), "{} keys", vault.keys().len());
    notes.sync();
    let typed = notes.text().chars().count();
    assert!(
        why.contains(&format!("; {typed} of 1000")),
        "{why}: {typed}"
    );
}

#[test]
fn a_call_that_cannot_type_all_in_time_stops_and_says_how_far_it_got() {
    let xvfb = needs_x11!();
    let notes = notes(&xvfb);
    let desk = Desk::new(&xvfb, by_title());
    notes.focus().unwrap();
    // Far more different characters the keyboard lacks than it has spare
    // keys for: more than the call's time can type.
    let many: String = (0..1000)
        .map(|i| char::from_u32(0x4e00 + (i * 7) % 400).unwrap())
        .collect();
    let why = desk.call("type", json!({"text": many})).unwrap_err();
    let typed: usize = why
        .strip_prefix("the call's 8 s ran out after ")
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no progress in {why}"));
    assert_eq!(
        why,
        format!("the call's 8 s ran out after {typed} of 1000 characters; the rest were not typed")
    );
    assert!(typed > 0);
    // What it says was typed arrived, and nothing after.
    let expected: String = many.chars().take(typed).collect();
    assert_eq!(notes.wait_for_text(&expected), expected);
    notes.sync();
    assert_eq!(notes.text(), expected);
}

#[test]
fn a_blacked_out_window_that_moves_all_the_while_never_shows() {
    if std::env::var("DK_SKIP_X11").is_ok_and(|v| v == "1") {
        return;
    }
    // A small screen, so that a hundred screenshots are quick to check.
    let xvfb = Xvfb::start(800, 500);
    let vault = vault(&xvfb, Rect::new(100, 100, 200, 120));
    // Screenshots at the screen's own size: every pixel is the screen's.
    let desk = Desk::with_config(
        &xvfb,
        DesktopConfig {
            size: "800x500".parse().unwrap(),
            blackout: by_title(),
            ..DesktopConfig::default()
        },
    );
    let (conn, _) = connect(&xvfb);
    let stop = AtomicBool::new(false);
    let leaks = std::thread::scope(|scope| {
        // Every 5 ms the vault jumps across the screen, and now and then
        // it is hidden and shown again.
        scope.spawn(|| {
            let spots = [(100, 100), (550, 330), (300, 60), (480, 20), (10, 360)];
            let mut i = 0usize;
            while !stop.load(Ordering::SeqCst) {
                let (x, y) = spots[i % spots.len()];
                conn.configure_window(vault.id(), &ConfigureWindowAux::new().x(x).y(y))
                    .unwrap();
                if i % 7 == 3 {
                    conn.unmap_window(vault.id()).unwrap();
                }
                if i % 7 == 5 {
                    conn.map_window(vault.id()).unwrap();
                }
                conn.sync().unwrap();
                i += 1;
                // Moves the window every 5 ms while the screenshots run.
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        });
        let mut leaks = Vec::new();
        for shot in 0..100 {
            let answer = desk.call("screenshot", json!({})).unwrap();
            let shot_pixels = Shot::read(&answer);
            let shown = shot_pixels.count(VAULT_COLOUR);
            if shown > 0 {
                leaks.push((shot, shown));
            }
        }
        stop.store(true, Ordering::SeqCst);
        leaks
    });
    assert!(
        leaks.is_empty(),
        "screenshots (number, vault pixels) showing the vault: {leaks:?}"
    );
}

#[test]
fn text_the_keyboard_lacks_arrives_whole_in_a_tk_program() {
    let xvfb = needs_x11!();
    let mut entry =
        TkEntry::open(&xvfb.display(), "Tk entry", Rect::new(100, 100, 1600, 80)).unwrap();
    let desk = Desk::new(&xvfb, by_title());
    let parts = [
        "äöüßéèêçñ€ÅØÆœŒÿŸąćęłńśźż",
        "日本語の文字を二十五字ここに打ちますが全部で届くか",
        "ΑΒΓΔΕΖΗΘΙΚΛΜΝΞΟΠΡΣΤΥΦΧΨΩα",
        "жзийклмнопрстуфхцчшщъыьэю",
    ];
    let mut expected = String::new();
    for part in parts {
        assert_eq!(part.chars().count(), 25, "{part}");
        let answer = desk.call("type", json!({"text": part})).unwrap();
        assert_eq!(answer, json!({"typed": 25}));
        expected.push_str(part);
        let held = entry.wait_for_text(&expected);
        assert_eq!(held.as_deref(), Ok(expected.as_str()), "after {part}");
    }
    entry.clear().unwrap();
    // The keyboard's own characters and the spare ones, mixed, several
    // times over.
    let mixed = "a€b€cä日d本e語fgh日本語ijkäöüxyz";
    desk.call("type", json!({"text": mixed})).unwrap();
    assert_eq!(entry.wait_for_text(mixed).as_deref(), Ok(mixed));
}

#[test]
fn a_title_too_long_or_too_broken_to_read_is_blacked_out() {
    let xvfb = needs_x11!();
    let long_title = format!("{} Password", "x".repeat(2048));
    let long = TestWindow::open(
        &xvfb.display(),
        WindowSpec::new(&long_title, Rect::new(100, 100, 400, 300)).background(rgb(BLUE)),
    )
    .unwrap();
    let broken = TestWindow::open(
        &xvfb.display(),
        WindowSpec::new("fine", Rect::new(700, 100, 400, 300)).background(rgb(GREEN)),
    )
    .unwrap();
    let plain = TestWindow::open(
        &xvfb.display(),
        WindowSpec::new("Notes", Rect::new(1300, 100, 400, 300)).background(rgb(RED)),
    )
    .unwrap();
    // The second window's UTF-8 title is not UTF-8.
    let (conn, _) = connect(&xvfb);
    let net_wm_name = conn
        .intern_atom(false, b"_NET_WM_NAME")
        .unwrap()
        .reply()
        .unwrap()
        .atom;
    let utf8 = conn
        .intern_atom(false, b"UTF8_STRING")
        .unwrap()
        .reply()
        .unwrap()
        .atom;
    conn.change_property8(
        PropMode::REPLACE,
        broken.id(),
        net_wm_name,
        utf8,
        b"Pass\xffword",
    )
    .unwrap();
    conn.change_property8(
        PropMode::REPLACE,
        broken.id(),
        AtomEnum::WM_NAME,
        AtomEnum::STRING,
        b"fine",
    )
    .unwrap();
    conn.sync().unwrap();

    let desk = Desk::with_config(
        &xvfb,
        DesktopConfig {
            size: "1920x1200".parse().unwrap(),
            blackout: by_title(),
            ..DesktopConfig::default()
        },
    );
    let shot = Shot::read(&desk.call("screenshot", json!({})).unwrap());
    shot.assert_all((100, 100, 400, 300), 0);
    shot.assert_all((700, 100, 400, 300), 0);
    shot.assert_all((1300, 100, 400, 300), RED);
    assert_eq!(
        desk.call("left_click", json!({"x": 300, "y": 200}))
            .unwrap_err(),
        "the point (300, 200) is in a blacked-out area"
    );
    long.sync();
    plain.sync();
    assert!(long.received_nothing());
}

#[test]
fn less_is_said_and_less_is_done() {
    let xvfb = needs_x11!();
    let notes = notes(&xvfb);
    let _vault = vault(&xvfb, Rect::new(1200, 300, 500, 400));
    let desk = Desk::new(&xvfb, by_title());
    let (conn, root) = connect(&xvfb);

    // No click, scroll or drag on the bare desktop (window managers open
    // menus there, with every window's title in them).
    for (capability, input) in [
        ("left_click", json!({"x": 20, "y": 750})),
        ("middle_click", json!({"x": 20, "y": 750})),
        ("right_click", json!({"x": 20, "y": 750})),
        (
            "scroll",
            json!({"direction": "down", "amount": 1, "x": 20, "y": 750}),
        ),
        (
            "left_click_drag",
            json!({"start_x": 20, "start_y": 750, "x": 300, "y": 250}),
        ),
    ] {
        assert_eq!(
            desk.call(capability, input).unwrap_err(),
            "the point (20, 750) is on the desktop itself, where this device does not click",
            "{capability}"
        );
    }
    // Moving there is fine, and so is a click on a window.
    desk.call("mouse_move", json!({"x": 20, "y": 750})).unwrap();
    assert_eq!(
        desk.call("left_click", json!({})).unwrap_err(),
        "the pointer is on the desktop itself, where this device does not click"
    );
    desk.call("left_click", json!({"x": 310, "y": 310}))
        .unwrap();
    assert_eq!(notes.wait_for_clicks(1).len(), 1);
    // A person who wants it says so.
    let allowing = Desk::with_config(
        &xvfb,
        DesktopConfig {
            blackout: by_title(),
            root_clicks: true,
            ..DesktopConfig::default()
        },
    );
    allowing
        .call("left_click", json!({"x": 20, "y": 750}))
        .unwrap();

    // The pointer's place only outside the blackout.
    pointer_and_focus(&conn, root, (1400, 500), notes.id());
    assert_eq!(
        desk.call("cursor_position", json!({})).unwrap_err(),
        "the pointer is in a blacked-out area"
    );
    pointer_and_focus(&conn, root, (150, 150), notes.id());
    assert_eq!(
        desk.call("cursor_position", json!({})).unwrap(),
        json!({"x": 100, "y": 100})
    );

    // Keysyms by number, and the names of the server's own actions, are
    // not keys here.
    for name in [
        "0x1008fe01",
        "XF86Switch_VT_1",
        "Terminate_Server",
        "Pointer_Button1",
        "0xff0d",
    ] {
        assert_eq!(
            desk.call("key", json!({"text": name})).unwrap_err(),
            format!("\"{name}\" is not a key name"),
        );
    }
    // A long number is not echoed back.
    let why = desk
        .call("left_click", json!({"x": 1e300, "y": 10}))
        .unwrap_err();
    assert_eq!(why, "x 1e300 is outside the screenshot (0 to 1279)");
    let why = desk
        .call(
            "scroll",
            json!({"direction": "up", "amount": -1.234_567_890_123_4e-200}),
        )
        .unwrap_err();
    assert!(why.len() < 120, "{why}");

    // A screenshot says whether something was blacked out, not how many
    // windows were.
    let shot = desk.call("screenshot", json!({})).unwrap();
    assert_eq!(shot["blacked_out"], json!(true));
    notes.sync();
    assert_eq!(notes.keys().len(), 0);
}
