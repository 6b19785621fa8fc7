//! Where and how the client connects: the vessel URL, the channel (dk/2 by
//! default, v1 when asked), the key or token file, the pairing-code hook,
//! the backoff and the serve options.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use dk_device_core::{Channel, Config, Credentials, DeviceCore, HANDSHAKE_TIMEOUT};

use super::backoff::{DEFAULT_INITIAL_BACKOFF, DEFAULT_MAX_BACKOFF};
use super::entropy::OsEntropy;
use super::error::ClientError;
use super::key_file::{generate, read_key, write_key};
use super::token_file::{read_token, token_file_error};
use crate::stream::StreamReceiver;
use crate::{Device, ServeOptions};

/// A device core kept from one connection to the next (the call ids it
/// saw), and the origin of its clock.
pub(super) struct KeptCore {
    pub(super) core: DeviceCore,
    pub(super) origin: tokio::time::Instant,
    pub(super) channel: Channel,
    pub(super) device_id: String,
}

/// Shows the pairing code (or the vessel's fingerprint) to the person.
type CodeHook = Arc<dyn Fn(&str) + Send + Sync>;

/// Hears of the connection coming and going.
type ConnectionHook = Arc<dyn Fn(&ConnectionEvent) + Send + Sync>;

/// The connection to the vessel came or went, as
/// [`ClientOptions::on_connection`] hears of it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectionEvent {
    /// The connection is open: upgraded, and on dk/2 the handshake done.
    Connected,
    /// The connection ended, or could not be opened, and the client will
    /// try again after `retry_in`.
    Disconnected {
        /// Why, in words (the close code and reason, the connection lost,
        /// the error opening it), made printable.
        why: String,
        /// How long the client waits before it tries again.
        retry_in: Duration,
    },
}

/// Where and how [`run_client`](crate::run_client) and [`connect_once`](crate::connect_once) connect.
///
/// ```
/// use std::time::Duration;
/// use dk_device::{ClientOptions, ServeOptions};
///
/// let options = ClientOptions::new("ws://127.0.0.1:7777/device")
///     .key_file(".dk/desk-lamp.key")
///     .on_code(|code| println!("Pairing code: {code}"))
///     .backoff(Duration::from_millis(500), Duration::from_secs(30))
///     .serve(ServeOptions::new().max_in_flight(8));
/// # drop(options);
/// ```
pub struct ClientOptions {
    /// The address tried next.
    pub(super) url: String,
    /// The other addresses, in the order they are tried after `url`.
    pub(super) others: std::collections::VecDeque<String>,
    /// Speak 8DK v1 (in clear, a bearer token) instead of dk/2.
    pub(super) v1: bool,
    pub(super) token_file: Option<PathBuf>,
    pub(super) key_file: Option<PathBuf>,
    /// Drop the pinned vessel key (and the pairing) at the next connection.
    pub(super) forget_vessel: bool,
    pub(super) pair_again: bool,
    /// The dk/2 credentials, as last read from the key file or kept in
    /// memory when there is none.
    pub(super) key: Option<Credentials>,
    pub(super) on_code: Option<CodeHook>,
    pub(super) on_vessel_pinned: Option<CodeHook>,
    pub(super) on_connection: Option<ConnectionHook>,
    /// The certificates (PEM) trusted for `wss://`, instead of the
    /// platform's roots.
    pub(super) tls_root: Option<Vec<u8>>,
    pub(super) initial_backoff: Duration,
    pub(super) max_backoff: Duration,
    pub(super) max_attempts: Option<u32>,
    /// How long a dk/2 handshake may take before the connection is
    /// dropped and tried again.
    pub(super) handshake_timeout: Duration,
    pub(super) serve: ServeOptions,
    /// Stream chunks to send once the vessel admits the device.
    pub(super) streams: Option<StreamReceiver>,
    /// The token, when there is no token file to keep it in.
    pub(super) remembered: Option<String>,
    /// The device core, kept from one connection to the next.
    pub(super) core: Option<KeptCore>,
}

impl fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientOptions")
            .field("url", &self.url)
            .field("others", &self.others)
            .field("v1", &self.v1)
            .field("token_file", &self.token_file)
            .field("key_file", &self.key_file)
            .field("forget_vessel", &self.forget_vessel)
            .field("pair_again", &self.pair_again)
            .field("key", &self.key.as_ref().map(|_| "<redacted>"))
            .field("on_code", &self.on_code.is_some())
            .field("on_vessel_pinned", &self.on_vessel_pinned.is_some())
            .field("on_connection", &self.on_connection.is_some())
            .field("tls_root", &self.tls_root.is_some())
            .field("initial_backoff", &self.initial_backoff)
            .field("max_backoff", &self.max_backoff)
            .field("max_attempts", &self.max_attempts)
            .field("handshake_timeout", &self.handshake_timeout)
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
    /// Connects to `url`, the vessel's device route (`ws://host:port/device`)
    /// over dk/2, with a key made for this run (no key file), backoff from
    /// [`DEFAULT_INITIAL_BACKOFF`] to [`DEFAULT_MAX_BACKOFF`], no limit on
    /// attempts and the default [`ServeOptions`]. A `wss://` URL (a vessel
    /// behind a TLS proxy) is checked against the platform's roots unless
    /// [`ClientOptions::tls_root`] names others.
    ///
    /// dk/2 is never given up silently: a vessel that does not answer
    /// `dk.2` ends the client with [`ClientError::NotDk2`]; v1 is spoken only
    /// after [`ClientOptions::v1`].
    pub fn new(url: impl Into<String>) -> Self {
        ClientOptions {
            url: url.into(),
            others: std::collections::VecDeque::new(),
            v1: false,
            token_file: None,
            key_file: None,
            forget_vessel: false,
            pair_again: false,
            key: None,
            on_code: None,
            on_vessel_pinned: None,
            on_connection: None,
            tls_root: None,
            initial_backoff: DEFAULT_INITIAL_BACKOFF,
            max_backoff: DEFAULT_MAX_BACKOFF,
            max_attempts: None,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            serve: ServeOptions::default(),
            streams: None,
            remembered: None,
            core: None,
        }
    }

    /// Speaks 8DK v1 instead of dk/2: frames in clear and a bearer token, the
    /// pairing code sent by the vessel. Only for vessels that speak nothing
    /// else (8DK) and on a machine's loopback, where a dk vessel allows it.
    pub fn v1(mut self) -> Self {
        self.v1 = true;
        self
    }

    /// Whether the client speaks v1 ([`ClientOptions::v1`]).
    pub fn is_v1(&self) -> bool {
        self.v1
    }

    /// Keeps the dk/2 key state in the file at `path` (mode 0600, written
    /// whole or not at all, its directory created if missing): the device's
    /// static key (its credential once paired), the vessel key it pinned at
    /// pairing and whether it is paired. Made with a fresh key at the first
    /// connection when missing; a file that is not a key file is an error,
    /// never overwritten.
    ///
    /// Without a key file the key lives in these options only: the
    /// reconnects of one run authenticate, a new run pairs again.
    pub fn key_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.key_file = Some(path.into());
        self
    }

    /// Forgets the pinned vessel key, and with it the pairing, at the next
    /// connection: for a person who really replaced the vessel. Never done
    /// automatically; a vessel whose key is not the pinned one otherwise
    /// ends the client with [`ClientError::VesselKeyChanged`].
    pub fn forget_vessel(mut self) -> Self {
        self.forget_vessel = true;
        self
    }

    /// Asks the vessel to pair again at the next connection, with the same
    /// key and the same pinned vessel, instead of authenticating: for a
    /// device whose manifest changed, which the vessel refuses until the
    /// person agrees to the new one (it shows them what changed). The key
    /// file is not changed until the vessel pairs it, so later connections
    /// authenticate first again. Never done automatically.
    pub fn pair_again(mut self) -> Self {
        self.pair_again = true;
        self
    }

    /// Trusts only the certificates in `pem` for `wss://` URLs: a private
    /// CA, or the TLS proxy's own self-signed certificate. Without it the
    /// platform's roots are used. Checked at each connection; a PEM with no
    /// usable certificate ends the client with [`ClientError::TlsRoot`].
    pub fn tls_root(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root = Some(pem.into());
        self
    }

    /// Shows the vessel's fingerprint once the device pinned its key (after
    /// a dk/2 pairing), for the person to compare with what the vessel
    /// prints. Without it the fingerprint is only logged.
    pub fn on_vessel_pinned(mut self, show: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.on_vessel_pinned = Some(Arc::new(show));
        self
    }

    /// Tells `hear` each time the connection opens
    /// ([`ConnectionEvent::Connected`]) and each time it ends or cannot be
    /// opened and the client will try again, with why and when
    /// ([`ConnectionEvent::Disconnected`]): for a device to show that it
    /// lost the vessel and found it again. Without it these are only logged.
    pub fn on_connection(
        mut self,
        hear: impl Fn(&ConnectionEvent) + Send + Sync + 'static,
    ) -> Self {
        self.on_connection = Some(Arc::new(hear));
        self
    }

    /// Keeps the v1 device token in the file at `path`: read at every
    /// connection (present: `device:auth`; absent or empty: `device:hello`),
    /// written with mode 0600 when the device pairs (its directory is created
    /// if missing), removed when the vessel refuses it or the person unpairs
    /// the device. A file that holds something other than a token is an
    /// error, never sent and never removed.
    ///
    /// Without a token file the token lives in these options only: the
    /// reconnects of one run authenticate, a new run pairs again. Used on
    /// v1 only ([`ClientOptions::v1`]); dk/2 keeps a key instead
    /// ([`ClientOptions::key_file`]).
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
    /// did not last [`STABLE_SESSION`](crate::STABLE_SESSION); without it the client tries forever.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = Some(attempts.max(1));
        self
    }

    /// How long a dk/2 handshake may take (from the socket's opening to the
    /// vessel's last handshake message) before the connection is dropped
    /// and tried again after the backoff; [`HANDSHAKE_TIMEOUT`] unless set.
    pub fn handshake_timeout(mut self, timeout: Duration) -> Self {
        self.handshake_timeout = timeout;
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

    /// Another address to reach the vessel at: the same vessel behind
    /// another name, or another member of its fleet (the members hold one
    /// dk/2 key, so the pin holds). A connection that cannot be opened or
    /// is lost moves the client on to the next address at once, in the
    /// order given and round again; it waits its backoff only once every
    /// address has failed in a row. A busy vessel's 503 is waited out at
    /// the same address (it is up). Each address is checked as the first
    /// one is.
    pub fn also_at(mut self, url: impl Into<String>) -> Self {
        self.others.push_back(url.into());
        self
    }

    /// The vessel URL the client tries next.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// How many addresses the client tries in turn: its URL and those
    /// given with [`ClientOptions::also_at`].
    pub fn addresses(&self) -> usize {
        1 + self.others.len()
    }
}

impl ClientOptions {
    /// Makes the next address the one tried next (the current one goes
    /// last); nothing changes with a single address.
    pub(super) fn move_on(&mut self) {
        if let Some(next) = self.others.pop_front() {
            let current = std::mem::replace(&mut self.url, next);
            self.others.push_back(current);
        }
    }

    /// Tells the connection hook, if there is one.
    pub(super) fn tell(&self, event: &ConnectionEvent) {
        if let Some(hear) = &self.on_connection {
            hear(event);
        }
    }

    /// Whether this is a dk/2 device its vessel paired: its refusals come
    /// inside the channel, so one from outside it is not believed.
    pub(super) fn is_paired_dk2(&self) -> bool {
        !self.v1 && self.key.as_ref().is_some_and(Credentials::is_paired)
    }

    /// The token to authenticate with: the token file's, or the one kept in
    /// memory when there is no file.
    pub(super) fn stored_token(&self) -> Result<Option<String>, ClientError> {
        match &self.token_file {
            Some(path) => read_token(path).map_err(|e| token_file_error(&self.token_file, e)),
            None => Ok(self.remembered.clone()),
        }
    }

    /// The dk/2 credentials: the key file's (made when missing), or the
    /// ones kept in memory when there is no file. Applies
    /// [`ClientOptions::forget_vessel`] once.
    pub(super) fn key_state(&mut self) -> Result<&mut Credentials, ClientError> {
        let error = |path: &PathBuf, source| ClientError::KeyFile {
            path: path.clone(),
            source,
        };
        let had_key = self.key.is_some();
        let mut state = match &self.key_file {
            Some(path) => match read_key(path).map_err(|e| error(path, e))? {
                Some(state) => state,
                // Made earlier in this run and gone since (removed, its
                // disk unmounted): making a new one would drop the pin.
                None if had_key => {
                    return Err(error(
                        path,
                        std::io::Error::new(
                            std::io::ErrorKind::NotFound,
                            "the key file disappeared while the device ran",
                        ),
                    ));
                }
                None => {
                    let state = generate().map_err(|e| error(path, e))?;
                    write_key(path, &state).map_err(|e| error(path, e))?;
                    tracing::info!(path = %path.display(), "made a device key");
                    state
                }
            },
            None => match self.key.take() {
                Some(state) => state,
                None => generate().map_err(|e| ClientError::Protocol(e.to_string()))?,
            },
        };
        if std::mem::take(&mut self.forget_vessel) {
            state = Credentials::from_parts(*state.secret(), None, false);
            if let Some(path) = &self.key_file {
                write_key(path, &state).map_err(|e| error(path, e))?;
            }
            tracing::info!("forgot the pinned vessel key");
        }
        if std::mem::take(&mut self.pair_again) && state.is_paired() {
            // Not written to the key file: a device started again before
            // the person answers authenticates first, as a paired one.
            state = Credentials::from_parts(*state.secret(), state.pinned().copied(), false);
            tracing::info!("asking to pair again with the same key");
        }
        Ok(self.key.insert(state))
    }

    /// The device core for `device` on `channel`: the one kept from the
    /// previous connection (with the call ids it saw), or a new one.
    pub(super) fn take_core(
        &mut self,
        device: &Device,
        channel: Channel,
    ) -> Result<KeptCore, ClientError> {
        let id = device.manifest().id();
        if let Some(kept) = self.core.take()
            && kept.channel == channel
            && kept.device_id == id
        {
            return Ok(kept);
        }
        let config = Config {
            handshake_timeout: self.handshake_timeout,
            ..self.serve.core_config(channel)
        };
        let core = DeviceCore::new(device.manifest(), config, Box::new(OsEntropy), None, None)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        Ok(KeptCore {
            core,
            origin: tokio::time::Instant::now(),
            channel,
            device_id: id.to_owned(),
        })
    }

    /// Keeps the device core for the next connection.
    pub(super) fn put_core(&mut self, core: KeptCore) {
        self.core = Some(core);
    }

    /// Keeps the credentials: in the key file when there is one.
    pub(super) fn save_key(&self) -> Result<(), ClientError> {
        if let (Some(path), Some(state)) = (&self.key_file, &self.key) {
            write_key(path, state).map_err(|source| ClientError::KeyFile {
                path: path.clone(),
                source,
            })?;
        }
        Ok(())
    }
}
