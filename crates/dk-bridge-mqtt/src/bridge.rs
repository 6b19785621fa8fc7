//! The running bridge: one broker connection shared by every mapped
//! device, and one dk-device client per device.
//!
//! The connection task subscribes to every state topic at each connect
//! (so a restarted broker's retained states come back), keeps the last
//! state of each (JSON, at most [`MAX_STATE_BYTES`]; anything else is
//! dropped and counted), and tells waiting actuators and the devices'
//! events of every change. While the broker is down, calls fail at once
//! saying so, and the connection is tried again with a growing pause.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dk_device::{ClientOptions, Device, EventSender, HandlerError, ServeOptions, run_client};
use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, Packet, Publish, QoS, SubscribeFilter};
use serde_json::{Map, Value};
use tokio::sync::broadcast;

use crate::config::{ActuatorMap, BridgeConfig, DeviceMap, SensorMap};
use crate::template::fill;

/// Largest state payload kept (256 KiB); larger ones are dropped.
pub const MAX_STATE_BYTES: usize = 256 * 1024;
/// How long a connection must last for the reconnect pause to start over.
const STABLE: Duration = Duration::from_secs(10);
/// State topics asked for in one SUBSCRIBE.
const SUBSCRIBE_CHUNK: usize = 64;
/// Deepest state kept: an event wraps a sensor's value in two levels
/// (`{"data": {"value": ...}}`) inside the frame's own, so a deeper state
/// could make a frame the vessel refuses ([`dk_proto::MAX_FRAME_DEPTH`]).
pub const MAX_STATE_DEPTH: usize = dk_proto::MAX_FRAME_DEPTH - 2;
/// Largest packet read from the broker (2 MiB).
pub const MAX_PACKET_BYTES: usize = 2 * 1024 * 1024;

/// Tells the person a device's pairing code: `(device id, code)`.
pub type CodeHook = Arc<dyn Fn(&str, &str) + Send + Sync>;

/// A state heard on a topic, shared by every listener.
type Change = (Arc<str>, Arc<Value>);

/// State changes kept for listeners that fall behind.
const CHANGES: usize = 256;

/// Why the bridge could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BridgeError {
    /// The broker URL is not `mqtt://host[:port]`.
    #[error("`{0}` is not an mqtt://host[:port] URL")]
    BrokerUrl(String),
    /// The TLS configuration for `mqtts://` could not be made.
    #[error("TLS: {0}")]
    Tls(String),
    /// The broker refused or dropped the connection.
    #[error("the MQTT broker: {0}")]
    Broker(String),
    /// A user and password would go in clear (`mqtt://`) to a broker off
    /// loopback, and the person did not allow it.
    #[error(
        "the broker's user and password would cross the network in clear to `{0}`: use mqtts://, or allow it knowingly with --allow-clear-credentials"
    )]
    ClearCredentials(String),
    /// A device could not be defined.
    #[error("device `{device}`: {why}")]
    Device {
        /// The device.
        device: String,
        /// Why.
        why: String,
    },
}

/// What the bridge knows of the broker and the states it heard.
#[derive(Debug, Default)]
pub struct BrokerState {
    connected: AtomicBool,
    last_error: Mutex<Option<String>>,
    states: Mutex<HashMap<String, Arc<Value>>>,
    /// State payloads dropped: not JSON, too large, nested deeper than
    /// [`MAX_STATE_DEPTH`], or on a topic no mapping names.
    pub dropped: AtomicU64,
    /// Of those, the states nested deeper than [`MAX_STATE_DEPTH`].
    pub too_deep: AtomicU64,
    /// State payloads kept.
    pub received: AtomicU64,
}

impl BrokerState {
    /// Whether the broker is connected now.
    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    /// Why the last connection attempt failed or the last connection
    /// ended; `None` while none has.
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The last state seen on `topic`.
    pub fn state(&self, topic: &str) -> Option<Value> {
        self.last(topic).map(|state| Value::clone(&state))
    }

    fn last(&self, topic: &str) -> Option<Arc<Value>> {
        self.states
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(topic)
            .cloned()
    }

    fn down_reason(&self) -> String {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .unwrap_or_else(|| "not connected yet".to_owned())
    }
}

/// The broker's user and password. Over `mqtt://` MQTT sends them in
/// clear, so they go only to a broker on loopback (`localhost`,
/// 127.0.0.0/8, `::1`) or over `mqtts://`, unless
/// [`Credentials::allow_clear_off_loopback`] says the person knows.
#[derive(Clone)]
pub struct Credentials {
    user: String,
    password: String,
    clear_off_loopback: bool,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .field("clear_off_loopback", &self.clear_off_loopback)
            .finish()
    }
}

impl Credentials {
    /// A user and its password.
    pub fn new(user: impl Into<String>, password: impl Into<String>) -> Credentials {
        Credentials {
            user: user.into(),
            password: password.into(),
            clear_off_loopback: false,
        }
    }

    /// Lets them go in clear to a broker off loopback (a network the
    /// person trusts end to end).
    pub fn allow_clear_off_loopback(mut self) -> Credentials {
        self.clear_off_loopback = true;
        self
    }

    /// Refuses to send them in clear beyond loopback, unless allowed.
    pub(crate) fn check(&self, address: &BrokerAddress) -> Result<(), BridgeError> {
        if address.tls || self.clear_off_loopback || is_loopback(&address.host) {
            return Ok(());
        }
        Err(BridgeError::ClearCredentials(address.host.clone()))
    }

    /// Sets them on `options`.
    pub(crate) fn apply(self, options: &mut MqttOptions) {
        options.set_credentials(self.user, self.password);
    }
}

/// `localhost`, an address of 127.0.0.0/8, or `::1`.
fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.to_canonical().is_loopback())
}

/// Where the broker is: host, port, and whether to speak TLS.
pub(crate) struct BrokerAddress {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) tls: bool,
}

/// `mqtt://host[:port]` (1883 by default) or `mqtts://host[:port]` (TLS,
/// 8883 by default); a user or password in the URL is refused.
pub(crate) fn broker_address(url: &str) -> Result<BrokerAddress, BridgeError> {
    let bad = || BridgeError::BrokerUrl(url.to_owned());
    let (rest, tls) = match (url.strip_prefix("mqtt://"), url.strip_prefix("mqtts://")) {
        (Some(rest), _) => (rest, false),
        (None, Some(rest)) => (rest, true),
        (None, None) => return Err(bad()),
    };
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() || rest.contains(['/', '@', '?', '#']) {
        return Err(bad());
    }
    let default = if tls { 8883 } else { 1883 };
    let (host, port) = match rest.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') || host.starts_with('[') => (
            host.trim_matches(['[', ']']).to_owned(),
            port.parse().map_err(|_| bad())?,
        ),
        _ => (rest.to_owned(), default),
    };
    Ok(BrokerAddress { host, port, tls })
}

/// The TLS client configuration for `mqtts://`: the certificates of
/// `ca_file`, else the platform's roots; ring as the provider.
pub(crate) fn tls_config(
    ca_file: Option<&std::path::Path>,
) -> Result<rustls::ClientConfig, BridgeError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    let refused = |why: String| BridgeError::Tls(why);
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let pem = std::fs::read(path)
                .map_err(|e| refused(format!("cannot read `{}`: {e}", path.display())))?;
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| refused(format!("not a PEM certificate: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| refused(format!("a certificate rustls cannot use: {e}")))?;
            }
            if roots.is_empty() {
                return Err(refused(format!(
                    "`{}` holds no certificate",
                    path.display()
                )));
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err(refused(
                    "the platform has no root certificates; name the broker's CA with caFile"
                        .to_owned(),
                ));
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| refused(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// Letters, digits, `_`, `-` and `.`, 1 to 64 of them.
fn is_word(text: &str) -> bool {
    (1..=64).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// The value at a dot-separated `path` in `state`.
fn at_path<'v>(state: &'v Value, path: Option<&str>) -> Option<&'v Value> {
    let Some(path) = path else {
        return Some(state);
    };
    path.split('.').try_fold(state, |value, key| value.get(key))
}

/// Whether `state` shows everything `expected` says (objects compared as
/// subsets, anything else equal).
fn shows(state: &Value, expected: &Value) -> bool {
    match (state, expected) {
        (Value::Object(state), Value::Object(expected)) => expected
            .iter()
            .all(|(k, v)| state.get(k).is_some_and(|s| shows(s, v))),
        (state, expected) => state == expected,
    }
}

/// Runs the bridge until `shutdown` resolves: connects to `broker_url`
/// (credentials from `credentials`, never from the URL, and never in clear
/// beyond loopback unless they allow it), and serves every
/// device of `config` to the vessel at `vessel_url`, telling each
/// device's pairing code to `on_code`, and keeping what it hears of the
/// broker in `state`.
pub async fn run_bridge(
    config: BridgeConfig,
    broker_url: String,
    credentials: Option<Credentials>,
    vessel_url: String,
    on_code: CodeHook,
    state: Arc<BrokerState>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), BridgeError> {
    let address = broker_address(&broker_url)?;
    if let Some(credentials) = &credentials {
        credentials.check(&address)?;
    }
    let options = mqtt_options(address, config.broker.ca_file.as_deref(), credentials)?;
    let (client, eventloop) = broker_client(options);
    // Changes are shared, never copied per receiver: one state of 256 KiB
    // is one value however many devices and calls listen.
    let (changes, _) = broadcast::channel::<Change>(CHANGES);
    let topics: Vec<String> = config
        .device
        .iter()
        .map(|d| d.state_topic.clone())
        .collect();
    let devices = define_all(&config, &client, &state, &changes)?;
    let connection = keep_connected(
        eventloop,
        client.clone(),
        topics,
        Arc::clone(&state),
        changes.clone(),
    );
    let all = serve_all(devices, &vessel_url, &on_code, &changes);
    tokio::select! {
        () = shutdown => {}
        () = connection => {}
        () = all => {}
    }
    let _ = client.disconnect().await;
    Ok(())
}

/// The MQTT options of a bridge connecting to `address`: a random client
/// id, TLS when the address says (trusting `ca_file`, else the
/// platform's roots), and `credentials` if any.
fn mqtt_options(
    address: BrokerAddress,
    ca_file: Option<&std::path::Path>,
    credentials: Option<Credentials>,
) -> Result<MqttOptions, BridgeError> {
    let id = dk_files::hex::random(6);
    let mut options = MqttOptions::new(format!("dk-bridge-{id}"), address.host, address.port);
    if address.tls {
        let tls = tls_config(ca_file)?;
        options.set_transport(rumqttc::Transport::Tls(rumqttc::TlsConfiguration::Rustls(
            Arc::new(tls),
        )));
    }
    options.set_keep_alive(Duration::from_secs(15));
    // Read packets well past the largest state kept, so a large one is
    // dropped here and counted; past this the client ends the connection
    // and the bridge connects again.
    options.set_max_packet_size(MAX_PACKET_BYTES, 64 * 1024);
    options.set_clean_session(true);
    if let Some(credentials) = credentials {
        credentials.apply(&mut options);
    }
    Ok(options)
}

/// The broker client and the event loop that drives its connection.
fn broker_client(options: MqttOptions) -> (AsyncClient, EventLoop) {
    let (client, mut eventloop) = AsyncClient::new(options, 256);
    // A command is one small packet: sent at once, not held for more
    // (Nagle's wait added some 40 ms to every call).
    let mut network = rumqttc::NetworkOptions::new();
    network.set_tcp_nodelay(true);
    eventloop.set_network_options(network);
    (client, eventloop)
}

/// A device of `config` mapped on `map`, with its events.
type Defined = (DeviceMap, Device, Events);

/// The dk device of every map of `config`, in order; the first that
/// cannot be defined stops the bridge.
fn define_all(
    config: &BridgeConfig,
    client: &AsyncClient,
    state: &Arc<BrokerState>,
    changes: &broadcast::Sender<Change>,
) -> Result<Vec<Defined>, BridgeError> {
    let mut devices = Vec::new();
    for map in &config.device {
        let (device, events) = define(map, client, state, changes, config.confirm_timeout())?;
        devices.push((map.clone(), device, events));
    }
    Ok(devices)
}

/// Drives the broker connection for as long as the bridge runs:
/// subscribes to `topics` at each connect, keeps each state heard, and
/// connects again after a pause that grows while connections do not last.
async fn keep_connected(
    mut eventloop: EventLoop,
    client: AsyncClient,
    topics: Vec<String>,
    state: Arc<BrokerState>,
    changes: broadcast::Sender<Change>,
) {
    let known: HashMap<String, Arc<str>> = topics
        .iter()
        .map(|t| (t.clone(), Arc::from(t.as_str())))
        .collect();
    let mut pause = Duration::from_millis(100);
    let mut connected_at: Option<tokio::time::Instant> = None;
    let mut told = false;
    loop {
        match eventloop.poll().await {
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                state.connected.store(true, Ordering::Release);
                connected_at = Some(tokio::time::Instant::now());
                subscribe(&client, &topics);
                tracing::info!("bridge: connected to the broker");
            }
            Ok(Event::Incoming(Packet::Publish(publish))) => {
                keep_state(&publish, &known, &state, &changes);
            }
            Ok(_) => {}
            Err(error) => {
                let was = state.connected.swap(false, Ordering::AcqRel);
                *state
                    .last_error
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(error.to_string());
                if was || !told {
                    tracing::warn!("bridge: the broker connection ended: {error}");
                    told = true;
                }
                // The pause starts over only after a connection that
                // lasted: one dropped at once (a retained packet over the
                // limit, a refused subscription) keeps doubling it.
                if connected_at.take().is_some_and(|at| at.elapsed() >= STABLE) {
                    pause = Duration::from_millis(100);
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Subscribes to every state topic, [`SUBSCRIBE_CHUNK`] per SUBSCRIBE.
fn subscribe(client: &AsyncClient, topics: &[String]) {
    // Subscribing from another task: requests wait in the client's queue,
    // which only the connection's loop drains.
    let (client, topics) = (client.clone(), topics.to_vec());
    tokio::spawn(async move {
        for chunk in topics.chunks(SUBSCRIBE_CHUNK) {
            let filters = chunk
                .iter()
                .map(|t| SubscribeFilter::new(t.clone(), QoS::AtLeastOnce));
            let _ = client.subscribe_many(filters).await;
        }
    });
}

/// Keeps the state `publish` carries and tells every listener, when it is
/// on a mapped state topic, JSON, within [`MAX_STATE_BYTES`] and
/// [`MAX_STATE_DEPTH`]; else counts it dropped (or too deep).
fn keep_state(
    publish: &Publish,
    known: &HashMap<String, Arc<str>>,
    state: &BrokerState,
    changes: &broadcast::Sender<Change>,
) {
    // Only the mapped state topics are kept, whatever a broker sends.
    let Some(topic) = known.get(publish.topic.as_str()).cloned() else {
        state.dropped.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let parsed = (publish.payload.len() <= MAX_STATE_BYTES)
        .then(|| serde_json::from_slice::<Value>(&publish.payload).ok())
        .flatten();
    let deep = parsed.is_some() && dk_proto::nests_deeper_than(&publish.payload, MAX_STATE_DEPTH);
    if deep {
        state.too_deep.fetch_add(1, Ordering::Relaxed);
    }
    match parsed.filter(|_| !deep) {
        Some(value) => {
            state.received.fetch_add(1, Ordering::Relaxed);
            let value = Arc::new(value);
            state
                .states
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(topic.to_string(), Arc::clone(&value));
            let _ = changes.send((topic, value));
        }
        None => {
            state.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Serves every device to the vessel at `vessel_url`, each with its own
/// client and its events forwarded from the states heard, until all stop.
async fn serve_all(
    devices: Vec<Defined>,
    vessel_url: &str,
    on_code: &CodeHook,
    changes: &broadcast::Sender<Change>,
) {
    let serving = devices.into_iter().map(|(map, device, events)| {
        let on_code = Arc::clone(on_code);
        let id = map.id.clone();
        let options = ClientOptions::new(vessel_url)
            .key_file(map.key_file())
            .serve(ServeOptions::new().events(events.1))
            .on_code(move |code| on_code(&id, code));
        let forwarder = forward_events(map, events.0, changes.subscribe());
        async move {
            let run = run_client(&device, options, std::future::pending::<()>());
            let (served, ()) = tokio::join!(run, forwarder);
            if let Err(error) = served {
                tracing::warn!(
                    "bridge: device `{}` stopped: {error}",
                    device.manifest().id()
                );
            }
        }
    });
    futures::future::join_all(serving).await;
}

type Events = (EventSender, dk_device::EventReceiver);

/// The dk device of `map`: a handler per capability.
fn define(
    map: &DeviceMap,
    client: &AsyncClient,
    state: &Arc<BrokerState>,
    changes: &broadcast::Sender<Change>,
    timeout: Duration,
) -> Result<(Device, Events), BridgeError> {
    let refuse = |why: String| BridgeError::Device {
        device: map.id.clone(),
        why,
    };
    let manifest = map.manifest().map_err(|e| refuse(e.to_string()))?;
    let mut builder = Device::define_validated(manifest);
    for sensor in &map.sensor {
        let (state, topic, path) = (
            Arc::clone(state),
            map.state_topic.clone(),
            sensor.path.clone(),
        );
        builder = builder.handler(&sensor.name, move |_input| {
            let answer = read(&state, &topic, path.as_deref());
            async move { answer }
        });
    }
    for actuator in &map.actuator {
        let act = Actuate {
            client: client.clone(),
            state: Arc::clone(state),
            changes: changes.clone(),
            state_topic: map.state_topic.clone(),
            map: actuator.clone(),
            timeout,
        };
        let act = Arc::new(act);
        builder = builder.handler(&actuator.name, move |input| {
            let act = Arc::clone(&act);
            async move { act.run(input).await }
        });
    }
    let device = builder.build().map_err(|e| refuse(e.to_string()))?;
    let events = device.events(16);
    Ok((device, events))
}

/// A sensor's answer: the value at its path in the last state.
fn read(state: &BrokerState, topic: &str, path: Option<&str>) -> Result<Value, HandlerError> {
    if !state.is_connected() {
        return Err(HandlerError::new(format!(
            "the MQTT broker is not reachable ({}); no state to read",
            state.down_reason()
        )));
    }
    let last = state
        .state(topic)
        .ok_or_else(|| HandlerError::new(format!("no state seen yet on `{topic}`")))?;
    match at_path(&last, path) {
        Some(Value::Object(fields)) => Ok(Value::Object(fields.clone())),
        Some(value) => Ok(serde_json::json!({ "value": value })),
        None => Err(HandlerError::new(format!(
            "the state on `{topic}` has no `{}`",
            path.unwrap_or_default()
        ))),
    }
}

struct Actuate {
    client: AsyncClient,
    state: Arc<BrokerState>,
    changes: broadcast::Sender<Change>,
    state_topic: String,
    map: ActuatorMap,
    timeout: Duration,
}

impl Actuate {
    /// Publishes the payload, then waits for the state to show it.
    async fn run(&self, input: Map<String, Value>) -> Result<Value, HandlerError> {
        if !self.state.is_connected() {
            return Err(HandlerError::new(format!(
                "the MQTT broker is not reachable ({}); nothing was sent",
                self.state.down_reason()
            )));
        }
        let payload =
            fill(&self.map.payload, &input).map_err(|e| HandlerError::new(e.to_string()))?;
        let expected = match &self.map.expect {
            Some(expect) => fill(expect, &input).map_err(|e| HandlerError::new(e.to_string()))?,
            None => payload.clone(),
        };
        // Listen before publishing, so a fast confirmation is not missed.
        let mut changes = self.changes.subscribe();
        // A payload that is one string goes as its text (`ON` for Tasmota's
        // `cmnd/.../POWER`); anything else as JSON. As the whole payload
        // is then the input, only a word may be sent that way: text that
        // could read as JSON or a command list on the other side is
        // refused.
        let wire = match &payload {
            Value::String(text) if is_word(text) => text.clone(),
            Value::String(_) => {
                return Err(HandlerError::new(
                    "a text command takes one word (letters, digits, `_`, `-`, `.`, at most 64)",
                ));
            }
            other => other.to_string(),
        };
        // QoS 0: the state topic's confirmation is the acknowledgement
        // that counts. (At QoS 1 the broker's PUBACK, held by Nagle's wait
        // on brokers without TCP_NODELAY, delayed the state by ~40 ms.)
        self.client
            .publish(self.map.command_topic.clone(), QoS::AtMostOnce, false, wire)
            .await
            .map_err(|e| HandlerError::new(format!("cannot publish: {e}")))?;
        let wait = async {
            loop {
                match changes.recv().await {
                    Ok((topic, state))
                        if *topic == *self.state_topic && shows(&state, &expected) =>
                    {
                        return Ok(Value::clone(&state));
                    }
                    // Fell behind: the confirming state may have gone by,
                    // and is then the last one kept.
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        if let Some(state) = self.state.last(&self.state_topic)
                            && shows(&state, &expected)
                        {
                            return Ok(Value::clone(&state));
                        }
                    }
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Closed) => {
                        return Err(HandlerError::new("the bridge is stopping"));
                    }
                }
            }
        };
        match tokio::time::timeout(self.timeout, wait).await {
            Ok(result) => result,
            Err(_) => Err(HandlerError::new(format!(
                "sent to `{}`, but `{}` did not confirm it within {} ms{}",
                self.map.command_topic,
                self.state_topic,
                self.timeout.as_millis(),
                if self.state.is_connected() {
                    String::new()
                } else {
                    format!(" (the broker went away: {})", self.state.down_reason())
                }
            ))),
        }
    }
}

/// Turns state changes of `map`'s topic into device events: each sensor
/// whose value changed sends one (dropped, not queued, when the queue is
/// full: a flood of states never backs up into the bridge).
async fn forward_events(
    map: DeviceMap,
    events: EventSender,
    mut changes: broadcast::Receiver<Change>,
) {
    let mut last: HashMap<String, Value> = HashMap::new();
    loop {
        match changes.recv().await {
            Ok((topic, state)) if *topic == *map.state_topic => {
                for SensorMap { name, path, .. } in &map.sensor {
                    let Some(value) = at_path(&state, path.as_deref()) else {
                        continue;
                    };
                    if last.get(name) != Some(value) {
                        last.insert(name.clone(), value.clone());
                        let _ = events.try_emit(name, serde_json::json!({ "value": value }));
                    }
                }
            }
            Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{Credentials, at_path, broker_address, shows};

    /// The bridge's depth check (dk-proto's, on the state's text).
    fn nests_deeper(value: &serde_json::Value, max: usize) -> bool {
        dk_proto::nests_deeper_than(value.to_string().as_bytes(), max)
    }

    #[test]
    fn urls_paths_and_confirmations() {
        let at = |url: &str| {
            let a = broker_address(url).unwrap();
            (a.host, a.port, a.tls)
        };
        assert_eq!(
            at("mqtt://127.0.0.1:1884"),
            ("127.0.0.1".to_owned(), 1884, false)
        );
        assert_eq!(at("mqtt://broker"), ("broker".to_owned(), 1883, false));
        assert_eq!(at("mqtts://broker"), ("broker".to_owned(), 8883, true));
        for bad in [
            "http://x",
            "mqtt://",
            "mqtt://u:p@host",
            "mqtt://h:port",
            "mqtt://h/x",
        ] {
            assert!(broker_address(bad).is_err(), "{bad}");
        }
        let state = json!({"state": "ON", "climate": {"current": 21.5}});
        assert_eq!(at_path(&state, Some("climate.current")), Some(&json!(21.5)));
        assert_eq!(at_path(&state, Some("nope.x")), None);
        assert!(shows(&state, &json!({"state": "ON"})));
        assert!(!shows(&state, &json!({"state": "OFF"})));
        assert!(shows(&state, &json!({"climate": {"current": 21.5}})));
        let clear = |url: &str| Credentials::new("u", "p").check(&broker_address(url).unwrap());
        for near in [
            "mqtt://127.0.0.1",
            "mqtt://127.8.9.10:1884",
            "mqtt://localhost",
            "mqtt://[::1]:1883",
            "mqtts://broker.example",
        ] {
            assert!(clear(near).is_ok(), "{near}");
        }
        for far in [
            "mqtt://192.0.2.1",
            "mqtt://broker.example",
            "mqtt://[fd00::2]:1883",
        ] {
            let refused = clear(far).unwrap_err().to_string();
            assert!(refused.contains("--allow-clear-credentials"), "{refused}");
        }
        let allowed = Credentials::new("u", "p").allow_clear_off_loopback();
        assert!(
            allowed
                .check(&broker_address("mqtt://192.0.2.1").unwrap())
                .is_ok()
        );
        assert!(!format!("{allowed:?}").contains("\"p\""));
        let nested = |n: usize| (0..n).fold(json!(1), |inner, _| json!([inner]));
        assert!(!nests_deeper(&nested(62), 62));
        assert!(nests_deeper(&nested(63), 62));
        assert!(!nests_deeper(&json!({"a": [1, {"b": 2}]}), 3));
        assert!(nests_deeper(&json!({"a": [1, {"b": []}]}), 3));
    }
}
