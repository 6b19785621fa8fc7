//! Where and how the client connects: the vessel URL, the token file, the
//! pairing-code hook, the backoff and the serve options.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::backoff::{DEFAULT_INITIAL_BACKOFF, DEFAULT_MAX_BACKOFF};
use super::error::ClientError;
use super::token_file::{read_token, token_file_error};
use crate::ServeOptions;
use crate::stream::StreamReceiver;

/// Shows the pairing code to the person.
type CodeHook = Arc<dyn Fn(&str) + Send + Sync>;

/// Where and how [`run_client`] and [`connect_once`] connect.
///
/// ```
/// use std::time::Duration;
/// use dk_device::{ClientOptions, ServeOptions};
///
/// let options = ClientOptions::new("ws://127.0.0.1:7777/device")
///     .token_file(".dk/desk-lamp.token")
///     .on_code(|code| println!("Pairing code: {code}"))
///     .backoff(Duration::from_millis(500), Duration::from_secs(30))
///     .serve(ServeOptions::new().max_in_flight(8));
/// # drop(options);
/// ```
pub struct ClientOptions {
    pub(super) url: String,
    pub(super) token_file: Option<PathBuf>,
    pub(super) on_code: Option<CodeHook>,
    pub(super) initial_backoff: Duration,
    pub(super) max_backoff: Duration,
    pub(super) max_attempts: Option<u32>,
    pub(super) serve: ServeOptions,
    /// Stream chunks to send once the vessel admits the device.
    pub(super) streams: Option<StreamReceiver>,
    /// The token, when there is no token file to keep it in.
    pub(super) remembered: Option<String>,
}

impl fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientOptions")
            .field("url", &self.url)
            .field("token_file", &self.token_file)
            .field("on_code", &self.on_code.is_some())
            .field("initial_backoff", &self.initial_backoff)
            .field("max_backoff", &self.max_backoff)
            .field("max_attempts", &self.max_attempts)
            .field("serve", &self.serve)
            .field("streams", &self.streams.is_some())
            .field(
                "remembered",
                &self.remembered.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

impl ClientOptions {
    /// Connects to `url`, the vessel's device route (`ws://host:port/device`),
    /// with no token file, backoff from [`DEFAULT_INITIAL_BACKOFF`] to
    /// [`DEFAULT_MAX_BACKOFF`], no limit on attempts and the default
    /// [`ServeOptions`]. `wss://` needs TLS, which this crate does not build.
    pub fn new(url: impl Into<String>) -> Self {
        ClientOptions {
            url: url.into(),
            token_file: None,
            on_code: None,
            initial_backoff: DEFAULT_INITIAL_BACKOFF,
            max_backoff: DEFAULT_MAX_BACKOFF,
            max_attempts: None,
            serve: ServeOptions::default(),
            streams: None,
            remembered: None,
        }
    }

    /// Keeps the device token in the file at `path`: read at every
    /// connection (present: `device:auth`; absent or empty: `device:hello`),
    /// written with mode 0600 when the device pairs (its directory is created
    /// if missing), removed when the vessel refuses it or the person unpairs
    /// the device. A file that holds something other than a token is an
    /// error, never sent and never removed.
    ///
    /// Without a token file the token lives in these options only: the
    /// reconnects of one run authenticate, a new run pairs again.
    pub fn token_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.token_file = Some(path.into());
        self
    }

    /// Shows the 6-digit pairing code; the person compares it with the
    /// vessel's prompt. Without it the code is only logged (`tracing`).
    /// Codes that are not 6 digits are never shown.
    pub fn on_code(mut self, show: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.on_code = Some(Arc::new(show));
        self
    }

    /// Waits between reconnects: a random time ("full jitter") up to
    /// `initial`, doubling after each failed attempt, capped at `max`.
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_backoff = initial;
        self.max_backoff = max.max(initial);
        self
    }

    /// Gives up after `attempts` connections in a row (at least one) that
    /// did not last [`STABLE_SESSION`]; without it the client tries forever.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = Some(attempts.max(1));
        self
    }

    /// How calls are served on each connection: grace, calls in flight, the
    /// event queue and the notice hook, kept from one connection to the next.
    pub fn serve(mut self, serve: ServeOptions) -> Self {
        self.serve = serve;
        self
    }

    /// Sends the chunks queued in `streams` (see [`stream_channel`](crate::stream_channel))
    /// as binary stream messages, but only on a connection the vessel
    /// admitted as a streaming session (`device:streaming`), and only those
    /// within the cap it announced (larger ones are dropped and counted
    /// here). Until then chunks wait in the queue, which drops what does not
    /// fit.
    pub fn streams(mut self, streams: StreamReceiver) -> Self {
        self.streams = Some(streams);
        self
    }

    /// The vessel URL.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl ClientOptions {
    /// The token to authenticate with: the token file's, or the one kept in
    /// memory when there is no file.
    pub(super) fn stored_token(&self) -> Result<Option<String>, ClientError> {
        match &self.token_file {
            Some(path) => read_token(path).map_err(|e| token_file_error(&self.token_file, e)),
            None => Ok(self.remembered.clone()),
        }
    }
}
