//! `GET /metrics`: the vessel's counters, gauges and histograms in
//! Prometheus' text exposition format (0.0.4), behind the admin API's guard
//! (the admin token, `Host` and `Origin`). prometheus-client writes the
//! text; what it writes is read at each scrape from dk-core's atomics
//! ([`Metrics`]) and from the vessel's state (devices paired and
//! connected, prompts waiting, the audit queue, the listeners' counters).
//! Every label value is one of a bounded set: never a device, tool or
//! agent. `docs/ADMIN-API.md` lists the metrics.
//!
//! [`serve_metrics`] serves the same text alone on a listener of its own,
//! without the token, for a scraper that should not hold it: that
//! listener answers `/metrics` and nothing else.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::listen::HttpLimits;
use crate::listener::ListenerStats;
use crate::metrics::{
    CallDecision, CallKind, HandshakeFailure, HistogramSnapshot, LimitReached, Metrics, PromptKind,
};
use crate::vessel::Vessel;

/// The content type of Prometheus' text format.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The exposition, on the metrics listener.
async fn open_metrics(State(vessel): State<Arc<Vessel>>) -> Response {
    answer(&vessel)
}

/// Serves `/metrics` alone on `listener`, without the admin token, until
/// `shutdown` resolves: for a scraper that should not hold the token. The
/// listener has the admin API's caps and deadlines from `limits`; any
/// other path is 404. The metrics name no device, tool or agent, but they
/// do tell how busy the vessel is: bind it where only the scraper reaches.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    vessel: Arc<Vessel>,
    limits: HttpLimits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let stats = Arc::clone(&vessel.stats().metrics_listener);
    let app = Router::new()
        .route("/metrics", get(open_metrics))
        .with_state(vessel);
    crate::listen::serve_http(listener, app, limits.admin_listener(), stats, shutdown).await
}

/// The exposition, written fresh for each scrape, as an answer.
pub(super) fn answer(vessel: &Arc<Vessel>) -> Response {
    match exposition(vessel) {
        Ok(text) => (
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, TEXT_FORMAT),
                (header::CACHE_CONTROL, "no-store"),
            ],
            text,
        )
            .into_response(),
        Err(fmt::Error) => {
            tracing::error!("the metrics could not be written");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// The vessel's metrics as Prometheus' text format.
pub(crate) fn exposition(vessel: &Arc<Vessel>) -> Result<String, fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(VesselCollector(Arc::clone(vessel))));
    let mut text = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut text, &registry)?;
    Ok(text)
}

/// Reads a vessel's metrics at each scrape.
#[derive(Debug)]
struct VesselCollector(Arc<Vessel>);

/// The listeners by the name their label gives them.
fn listeners(vessel: &Vessel) -> [(&'static str, &ListenerStats); 6] {
    let stats = vessel.stats();
    [
        ("device", &stats.device_listener),
        ("admin", &stats.admin_listener),
        ("mcp", &stats.mcp_listener),
        ("admin_socket", &stats.admin_socket),
        ("mcp_socket", &stats.mcp_socket),
        ("metrics", &stats.metrics_listener),
    ]
}

fn counter(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: u64,
) -> Result<(), fmt::Error> {
    let metric = ConstCounter::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

fn gauge(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: usize,
) -> Result<(), fmt::Error> {
    let metric = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

/// A counter with one label, a value for each of its values.
fn counters(
    encoder: &mut DescriptorEncoder<'_>,
    (name, help, label): (&str, &str, &str),
    values: impl IntoIterator<Item = (&'static str, u64)>,
) -> Result<(), fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (value, count) in values {
        let labels = [(label, value)];
        ConstCounter::new(count).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// A histogram with one label, a snapshot for each of its values.
fn histograms(
    encoder: &mut DescriptorEncoder<'_>,
    (name, help, label): (&str, &str, &str),
    values: impl IntoIterator<Item = (&'static str, Option<HistogramSnapshot>)>,
) -> Result<(), fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for (value, snapshot) in values {
        let Some(snapshot) = snapshot else { continue };
        let labels = [(label, value)];
        family
            .encode_family(&labels)?
            .encode_histogram::<NoLabelSet>(
                snapshot.sum_seconds,
                snapshot.count,
                &snapshot.buckets,
                None,
            )?;
    }
    Ok(())
}

/// A gauge with one label, a value for each of its values.
fn gauges(
    encoder: &mut DescriptorEncoder<'_>,
    (name, help, label): (&str, &str, &str),
    values: impl IntoIterator<Item = (&'static str, usize)>,
) -> Result<(), fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (value, count) in values {
        let labels = [(label, value)];
        ConstGauge::new(i64::try_from(count).unwrap_or(i64::MAX))
            .encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

impl Collector for VesselCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        let vessel = &self.0;
        let e = &mut encoder;
        calls(e, vessel.metrics())?;
        devices_and_prompts(e, vessel)?;
        audit(e, vessel)?;
        listener_connections(e, vessel)?;
        device_connections(e, vessel)?;
        if let Some(status) = vessel.fleet_status() {
            fleet(e, &status)?;
        }
        Ok(())
    }
}

/// Tool calls: decided (by kind and decision), how long each took to
/// decide, and those refused for a limit.
fn calls(e: &mut DescriptorEncoder<'_>, metrics: &Metrics) -> Result<(), fmt::Error> {
    let mut calls = e.encode_descriptor(
        "dk_calls",
        "Tool calls decided, by the kind of capability called and the decision.",
        None,
        MetricType::Counter,
    )?;
    for kind in CallKind::ALL {
        for decision in CallDecision::ALL {
            let labels = [("kind", kind.as_str()), ("decision", decision.as_str())];
            ConstCounter::new(metrics.calls(*kind, *decision))
                .encode(calls.encode_family(&labels)?)?;
        }
    }
    histograms(
        e,
        (
            "dk_call_duration_seconds",
            "Time from a tool call's start to its decision (the person's answer and the device's included).",
            "kind",
        ),
        CallKind::ALL
            .iter()
            .map(|kind| (kind.as_str(), metrics.call_seconds(*kind))),
    )?;
    counters(
        e,
        (
            "dk_rate_limited_calls",
            "Tool calls refused for a rate or budget reached, by the limit.",
            "limit",
        ),
        LimitReached::ALL
            .iter()
            .map(|limit| (limit.as_str(), metrics.rate_limited_calls(*limit))),
    )
}

/// Devices paired and connected, the prompts waiting for the person, and
/// how long the person took to answer.
fn devices_and_prompts(e: &mut DescriptorEncoder<'_>, vessel: &Vessel) -> Result<(), fmt::Error> {
    gauge(
        e,
        "dk_devices_paired",
        "Devices paired now.",
        vessel.registry().count(),
    )?;
    gauge(
        e,
        "dk_devices_connected",
        "Devices connected now.",
        vessel.links().count(),
    )?;
    let (pairings, approvals) = vessel.person().waiting();
    gauges(
        e,
        (
            "dk_prompts_pending",
            "Prompts waiting for the person's answer, by what is asked.",
            "prompt",
        ),
        [
            (PromptKind::Pairing.as_str(), pairings),
            (PromptKind::Approval.as_str(), approvals),
        ],
    )?;
    let metrics = vessel.metrics();
    histograms(
        e,
        (
            "dk_prompt_answer_duration_seconds",
            "Time from asking the person to their answer, by what was asked.",
            "prompt",
        ),
        PromptKind::ALL
            .iter()
            .map(|prompt| (prompt.as_str(), metrics.answer_seconds(*prompt))),
    )
}

/// The audit writer: its queue, the entries it committed, and how long
/// each batch took.
fn audit(e: &mut DescriptorEncoder<'_>, vessel: &Vessel) -> Result<(), fmt::Error> {
    gauge(
        e,
        "dk_audit_queue_depth",
        "Places taken in the audit writer's queue: entries waiting for a commit and calls holding one.",
        vessel.audit_queue_depth(),
    )?;
    counter(
        e,
        "dk_audit_entries_committed",
        "Audit entries committed to the store, those written with their change included.",
        vessel.audit_committed(),
    )?;
    let commits = vessel.metrics().audit_commit_seconds();
    e.encode_descriptor(
        "dk_audit_commit_duration_seconds",
        "Time one batch of audit entries took to commit.",
        None,
        MetricType::Histogram,
    )?
    .encode_histogram::<NoLabelSet>(
        commits.sum_seconds,
        commits.count,
        &commits.buckets,
        None,
    )
}

/// Each listener's connections: held now, accepted, refused at accept and
/// closed for idling.
fn listener_connections(e: &mut DescriptorEncoder<'_>, vessel: &Vessel) -> Result<(), fmt::Error> {
    let listeners = listeners(vessel);
    gauges(
        e,
        (
            "dk_listener_connections_open",
            "Connections a listener holds now.",
            "listener",
        ),
        listeners.map(|(listener, stats)| (listener, stats.open.load(Ordering::Relaxed))),
    )?;
    let count = |read: fn(&ListenerStats) -> u64| {
        listeners
            .into_iter()
            .map(move |(listener, stats)| (listener, read(stats)))
    };
    counters(
        e,
        (
            "dk_listener_connections_opened",
            "Connections a listener accepted and served.",
            "listener",
        ),
        count(|s| s.accepted.load(Ordering::Relaxed)),
    )?;
    counters(
        e,
        (
            "dk_listener_connections_refused",
            "Connections a listener closed at accept, over its caps (in all or per address).",
            "listener",
        ),
        count(|s| s.refused_at_accept.load(Ordering::Relaxed)),
    )?;
    counters(
        e,
        (
            "dk_listener_connections_idle_closed",
            "Connections a listener closed for moving no byte for its idle timeout.",
            "listener",
        ),
        count(|s| s.idle_closed.load(Ordering::Relaxed)),
    )
}

/// Device connections refused over the caps, and dk/2's handshakes and
/// channels: finished, failed (by why), closed for not holding.
fn device_connections(e: &mut DescriptorEncoder<'_>, vessel: &Vessel) -> Result<(), fmt::Error> {
    let stats = vessel.stats();
    counter(
        e,
        "dk_device_connections_refused",
        "Device connections refused before their handshake, over the vessel's connection caps.",
        stats.refused_connections.load(Ordering::Relaxed),
    )?;
    counter(
        e,
        "dk_secure_handshakes",
        "dk/2 handshakes that finished.",
        stats.secure_handshakes.load(Ordering::Relaxed),
    )?;
    let metrics = vessel.metrics();
    counters(
        e,
        (
            "dk_secure_handshake_failures",
            "dk/2 handshakes that did not finish, by why.",
            "reason",
        ),
        HandshakeFailure::ALL
            .iter()
            .map(|why| (why.as_str(), metrics.handshake_failures(*why))),
    )?;
    counter(
        e,
        "dk_secure_channel_failures",
        "dk/2 connections closed 4012: a handshake or record that did not hold.",
        stats.channel_failures.load(Ordering::Relaxed),
    )
}

/// A fleet member's gauges and counters: no member or device in a label.
fn fleet(
    e: &mut DescriptorEncoder<'_>,
    status: &dk_proto::admin::FleetStatus,
) -> Result<(), fmt::Error> {
    gauge(
        e,
        "dk_fleet_connected",
        "Whether this member's connection to NATS is up (1) or down (0).",
        usize::from(status.connected),
    )?;
    gauge(
        e,
        "dk_fleet_members",
        "Other members of the fleet present (heard within the presence expiry).",
        status.members.len(),
    )?;
    let count = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    gauge(
        e,
        "dk_fleet_devices",
        "Devices connected to this member, as it announces them to the fleet.",
        count(status.devices),
    )?;
    gauge(
        e,
        "dk_fleet_devices_elsewhere",
        "Devices connected to the other members present, as they announce them.",
        status
            .members
            .iter()
            .map(|m| count(m.devices))
            .fold(0, usize::saturating_add),
    )?;
    let d = status.dropped;
    counters(
        e,
        (
            "dk_fleet_messages_dropped",
            "Fleet messages dropped, by why: forged, replayed, stale (too old, or for or from an earlier run of a member), too_large, other_version.",
            "reason",
        ),
        [
            ("forged", d.forged),
            ("replayed", d.replayed),
            ("stale", d.stale),
            ("too_large", d.too_large),
            ("other_version", d.other_version),
        ],
    )
}

#[cfg(test)]
mod tests;
