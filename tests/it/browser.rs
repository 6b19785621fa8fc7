//! A real browser for the console's tests and bench: Debian's Chromium,
//! headless, driven over WebDriver by its chromedriver, each run with its
//! own profile and temporary directory, both removed with it.
//!
//! `chromedriver` is found through `DK_CHROMEDRIVER` or `PATH`, Chromium
//! through `DK_CHROMIUM` or `/usr/bin/chromium`; `cargo xtask ci` installs
//! both (`xtask/src/peers.rs`).

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

/// One browser at a time: on a small machine two would slow each other.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A headless Chromium and the chromedriver driving it.
pub struct Browser {
    pub client: Client,
    driver: Child,
    profile: tempfile::TempDir,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

fn find(variable: &str, name: &str, fallback: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(variable) {
        return PathBuf::from(path);
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    });
    let path = on_path.unwrap_or_else(|| PathBuf::from(fallback));
    assert!(
        path.is_file(),
        "no {name}: install Debian's chromium and chromium-driver (`cargo xtask peers` does), \
         or name it with {variable}"
    );
    path
}

/// Whether chromedriver and Chromium are where [`Browser::start`] looks.
pub fn installed() -> bool {
    let found = |variable: &str, name: &str, fallback: &str| {
        std::env::var_os(variable).map_or_else(
            || {
                std::env::var_os("PATH").is_some_and(|paths| {
                    std::env::split_paths(&paths).any(|dir| dir.join(name).is_file())
                }) || std::path::Path::new(fallback).is_file()
            },
            |path| std::path::Path::new(&path).is_file(),
        )
    };
    found("DK_CHROMEDRIVER", "chromedriver", "/usr/bin/chromedriver")
        && found("DK_CHROMIUM", "chromium", "/usr/bin/chromium")
}

impl Browser {
    /// Starts chromedriver and a headless Chromium at `width` x `height`.
    pub async fn start(width: u32, height: u32) -> Browser {
        let turn = ONE_AT_A_TIME.lock().await;
        let driver_path = find("DK_CHROMEDRIVER", "chromedriver", "/usr/bin/chromedriver");
        let chromium = find("DK_CHROMIUM", "chromium", "/usr/bin/chromium");
        let profile = tempfile::tempdir().unwrap();
        let temp = profile.path().join("tmp");
        std::fs::create_dir(&temp).unwrap();
        // A port taken by another process between its choice and the
        // driver's start makes the driver exit: it starts again on another.
        let mut started = None;
        for _ in 0..5 {
            let port = dk_testkit::free_port();
            let mut driver = Command::new(&driver_path)
                .arg(format!("--port={port}"))
                .env("TMPDIR", &temp)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("chromedriver starts");
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let mut exited = false;
            dk_testkit::eventually("chromedriver listening or gone", || {
                exited = driver.try_wait().unwrap().is_some();
                exited || TcpStream::connect(addr).is_ok()
            })
            .await;
            if !exited && driver.try_wait().unwrap().is_none() {
                started = Some((driver, addr));
                break;
            }
        }
        let (driver, addr) = started.expect("chromedriver found a free port in 5 attempts");
        let args = vec![
            "--headless=new".to_owned(),
            "--no-sandbox".to_owned(),
            "--disable-gpu".to_owned(),
            "--disable-dev-shm-usage".to_owned(),
            "--disable-background-networking".to_owned(),
            "--disable-component-update".to_owned(),
            "--disable-default-apps".to_owned(),
            "--disable-sync".to_owned(),
            "--no-first-run".to_owned(),
            "--no-default-browser-check".to_owned(),
            format!(
                "--user-data-dir={}",
                profile.path().join("profile").display()
            ),
            format!("--window-size={width},{height}"),
        ];
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".to_owned(),
            json!({"binary": chromium, "args": args}),
        );
        // chromedriver may take a moment after it listens.
        let mut attempts = 0;
        let client = loop {
            let session =
                ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                    .capabilities(capabilities.clone())
                    .connect(&format!("http://{addr}"))
                    .await;
            match session {
                Ok(client) => break client,
                Err(e) if attempts < 5 => {
                    attempts += 1;
                    eprintln!("no Chromium session yet ({e}); trying again");
                    // Paces the attempts: Chromium may still be starting.
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => panic!("no Chromium session: {e}"),
            }
        };
        Browser {
            client,
            driver,
            profile,
            _turn: turn,
        }
    }

    /// Makes the page's viewport `width` x `height` CSS pixels (the window
    /// is resized until it is).
    pub async fn viewport(&self, width: u32, height: u32) {
        self.client.set_window_size(width, height).await.unwrap();
        let inner = self
            .client
            .execute("return [window.innerWidth, window.innerHeight];", vec![])
            .await
            .unwrap();
        let (w, h) = (inner[0].as_u64().unwrap(), inner[1].as_u64().unwrap());
        let (dw, dh) = (u64::from(width) - w, u64::from(height) - h);
        self.client
            .set_window_size(width + dw as u32, height + dh as u32)
            .await
            .unwrap();
    }

    /// Waits for `css` to match an element whose text contains `text`.
    pub async fn wait_text(&self, css: &str, text: &str) -> fantoccini::elements::Element {
        dk_testkit::eventually_async(&format!("`{css}` with `{text}`"), || async {
            for element in self.client.find_all(Locator::Css(css)).await.unwrap() {
                if element.text().await.is_ok_and(|t| t.contains(text)) {
                    return Some(element);
                }
            }
            None
        })
        .await
    }

    /// Waits until no element matches `css`.
    pub async fn wait_gone(&self, css: &str) {
        dk_testkit::eventually_async(&format!("`{css}` gone"), || async {
            let found = self.client.find_all(Locator::Css(css)).await.unwrap();
            found.is_empty().then_some(())
        })
        .await;
    }

    /// Runs `script` in the page and returns its value.
    pub async fn run(&self, script: &str) -> Value {
        self.client.execute(script, vec![]).await.unwrap()
    }

    /// Saves a screenshot as `target/console-screenshots/NAME.png`; its path.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let png = self.client.screenshot().await.unwrap();
        let path = screenshots().join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
        path
    }

    /// Ends the session and chromedriver; the profile is removed.
    pub async fn quit(mut self) {
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // A test that failed never ended its session, and Chromium outlives
        // the chromedriver that started it. Its processes, found by the
        // profile only this browser uses, go first: once chromedriver is
        // gone, Chromium would shut down on its own and write to the
        // profile as it is removed.
        for pid in browser_processes(self.profile.path()) {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while !browser_processes(self.profile.path()).is_empty() && Instant::now() < deadline {
            // A drop cannot fail a test: it waits at most 10 s, looking
            // every 20 ms.
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// The processes started with the Chromium profile in `dir`.
fn browser_processes(dir: &std::path::Path) -> Vec<String> {
    let flag = format!("--user-data-dir={}", dir.join("profile").display());
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().into_string().ok()?;
            pid.parse::<u32>().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            // Chromium retitles its children: their arguments are one string
            // joined by spaces instead of separate ones.
            cmdline
                .split(|b| *b == 0 || *b == b' ')
                .any(|arg| arg == flag.as_bytes())
                .then_some(pid)
        })
        .collect()
}

/// A browser dropped without [`Browser::quit`], as a failing test drops
/// it, leaves none of its processes behind.
#[tokio::test]
async fn a_browser_dropped_without_quitting_leaves_no_process() {
    let browser = Browser::start(400, 300).await;
    browser.client.goto("about:blank").await.unwrap();
    let dir = browser.profile.path().to_owned();
    assert!(!browser_processes(&dir).is_empty());
    drop(browser);
    assert_eq!(browser_processes(&dir), Vec::<String>::new());
}

/// `target/console-screenshots/`, made if missing: where the browser tests
/// keep their screenshots.
pub fn screenshots() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("target")
        .join("console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
