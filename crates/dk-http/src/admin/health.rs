//! Health for load balancers and service managers, on the admin listener
//! beside the API: `GET /healthz` (the process answers) and `GET /readyz`
//! (the vessel can do its work). Neither asks for the admin token nor
//! checks `Host` or `Origin`: a prober has no credentials, and the answer
//! is a status word and, when not ready, the names of the checks that
//! fail, nothing else (no path, count, error text or token).
//!
//! A check reads what the vessel already knows and never waits: whether
//! the store took a write within the durability bound is what the audit
//! writer found with its own commits and probes (the same fact a call reads
//! before it reaches a device), so a probe costs the store nothing, and
//! probes that come often, or while the store hangs, pile up no work.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

use crate::vessel::Vessel;

/// One readiness check, by the name `/readyz` gives it (its `Display` is
/// that name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadinessCheck {
    /// The store took a write within the durability bound; while it has
    /// not, no call reaches a device.
    Store,
    /// The audit writer keeps up.
    Audit,
    /// The device listener accepts connections.
    Listeners,
}

impl std::fmt::Display for ReadinessCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ReadinessCheck::Store => "store",
            ReadinessCheck::Audit => "audit",
            ReadinessCheck::Listeners => "listeners",
        })
    }
}

/// The body of both answers.
#[derive(Debug, Serialize)]
struct Health {
    status: &'static str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    failing: Vec<ReadinessCheck>,
}

/// The two routes, without the admin API's guard.
pub(super) fn routes(vessel: Arc<Vessel>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(vessel)
}

/// 200 `{"status":"alive"}` whenever the process answers at all.
async fn healthz() -> Response {
    answer(
        StatusCode::OK,
        Health {
            status: "alive",
            failing: Vec::new(),
        },
    )
}

/// 200 `{"status":"ready"}` when every check passes, else 503
/// `{"status":"not ready","failing":[...]}` naming the checks that failed.
async fn readyz(State(vessel): State<Arc<Vessel>>) -> Response {
    let failing = readiness_failures(&vessel);
    if failing.is_empty() {
        answer(
            StatusCode::OK,
            Health {
                status: "ready",
                failing,
            },
        )
    } else {
        tracing::warn!(failing = %named(&failing), "not ready");
        answer(
            StatusCode::SERVICE_UNAVAILABLE,
            Health {
                status: "not ready",
                failing,
            },
        )
    }
}

/// The readiness checks `vessel` fails now, in the order `/readyz` names
/// them; none when it is ready. The same checks answer `/readyz` and decide
/// a service manager's watchdog ping. A few atomic reads: it never waits
/// for the store.
pub fn readiness_failures(vessel: &Arc<Vessel>) -> Vec<ReadinessCheck> {
    let mut failing = Vec::new();
    if !vessel.store_takes_writes() {
        failing.push(ReadinessCheck::Store);
    }
    if !vessel.audit_keeping_up() {
        failing.push(ReadinessCheck::Audit);
    }
    if !vessel
        .stats()
        .device_listener
        .serving
        .load(Ordering::Relaxed)
    {
        failing.push(ReadinessCheck::Listeners);
    }
    failing
}

/// The names of `checks`, as `/readyz` gives them, separated by commas: a
/// plain value for a log field.
fn named(checks: &[ReadinessCheck]) -> String {
    checks
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn answer(status: StatusCode, body: Health) -> Response {
    (status, [(header::CACHE_CONTROL, "no-store")], Json(body)).into_response()
}

#[cfg(test)]
mod tests;
