//! What the benches of `tests/benches/` share: a vessel on loopback with
//! its device and admin listeners.

use std::sync::Arc;

use dk_http::{AdminClient, AdminToken, Console, serve_admin, serve_devices};
use dk_policy::PolicySet;
use dk_vessel::{Limits, Vessel};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// An error of a bench's set-up, with its cause's text.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A vessel on loopback: its device URL, its admin client, and what stops it.
pub async fn vessel() -> Result<(Arc<Vessel>, String, AdminClient, watch::Sender<bool>), BoxError> {
    let vessel = Vessel::new(PolicySet::empty(), Limits::default());
    let devices = TcpListener::bind("127.0.0.1:0").await?;
    let admin = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("ws://{}/device", devices.local_addr()?);
    let admin_addr = admin.local_addr()?;
    let token = AdminToken::generate();
    let (stop, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let (a, b) = (stopped(stop_rx.clone()), stopped(stop_rx));
    let (v1, v2, t) = (Arc::clone(&vessel), Arc::clone(&vessel), token.clone());
    tokio::spawn(async move {
        let _ = tokio::join!(
            serve_devices(devices, v1, a),
            serve_admin(admin, v2, t, Console::new(), b)
        );
    });
    Ok((vessel, url, AdminClient::new(admin_addr, token), stop))
}
