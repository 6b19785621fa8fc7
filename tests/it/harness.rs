//! A vessel (registry, links, adapter) and devices connected to it through
//! in-process channels that carry frames as JSON text, exactly as a socket would.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dk_core::{
    adapter::{DecisionRecord, DeviceToolAdapter},
    link::{CallCorrelator, DeviceLink, Links, pump_device_frames},
    registry::{ConsentDecision, DeviceRegistry, Paired},
};
use dk_device::{Device, serve_device};
use dk_policy::PolicySet;
use futures::StreamExt;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

/// The vessel side, with every decision record kept as JSON text.
pub struct Vessel {
    pub adapter: DeviceToolAdapter,
    pub decisions: Arc<Mutex<Vec<Value>>>,
    tasks: JoinSet<()>,
}

impl Vessel {
    pub fn new(rules: &str) -> Vessel {
        let decisions = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&decisions);
        let adapter =
            DeviceToolAdapter::new(Arc::new(DeviceRegistry::new()), Arc::new(Links::new()))
                .with_policies(Arc::new(PolicySet::from_yaml_str(rules).unwrap()))
                .with_decision_hook(Arc::new(move |d: &DecisionRecord<'_>| {
                    sink.lock().unwrap().push(serde_json::to_value(d).unwrap());
                }));
        Vessel {
            adapter,
            decisions,
            tasks: JoinSet::new(),
        }
    }

    pub fn registry(&self) -> &Arc<DeviceRegistry> {
        self.adapter.registry()
    }

    /// Pairs `device` with the person granting `grant`.
    pub async fn pair(&self, device: &Device, grant: &[&str]) -> Paired {
        let manifest: Value = serde_json::from_str(&device.manifest().to_json()).unwrap();
        let decision = ConsentDecision::approve(grant.iter().copied());
        self.registry()
            .pair(
                &manifest,
                |_| {},
                |_| async move { Ok::<_, ()>(decision) },
                Duration::from_secs(5),
            )
            .await
            .unwrap()
    }

    /// Connects `device` through a text pipe and serves it. Returns the
    /// vessel-side link and a handle that drops the connection.
    pub fn connect(&mut self, device: &Device) -> Connection {
        let id = device.manifest().id().to_owned();
        let (to_device, mut device_inbox) = mpsc::channel::<String>(64);
        let (to_vessel, vessel_inbox) = futures::channel::mpsc::channel::<String>(64);
        let correlator = Arc::new(CallCorrelator::new(to_device));
        let link: Arc<dyn DeviceLink> = correlator.clone();
        self.adapter.links().connect(&id, Arc::clone(&link));
        let (cut, mut cut_rx) = tokio::sync::oneshot::channel::<()>();
        let device = device.clone();
        // The device reads until the vessel side hangs up or the test cuts the line.
        self.tasks.spawn(async move {
            let incoming = futures::stream::poll_fn(move |cx| device_inbox.poll_recv(cx));
            // Only an explicit cut ends the line; dropping the handle does not.
            let incoming = incoming.take_until(async move {
                if (&mut cut_rx).await.is_err() {
                    std::future::pending::<()>().await;
                }
            });
            let _ = serve_device(&device, Box::pin(incoming), to_vessel).await;
        });
        let links = Arc::clone(self.adapter.links());
        self.tasks.spawn(async move {
            pump_device_frames(&id, &correlator, vessel_inbox, None).await;
            links.disconnect(&id, &link);
        });
        Connection { cut: Some(cut) }
    }
}

/// One device connection; `drop_line` cuts it as a lost socket would.
pub struct Connection {
    cut: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Connection {
    pub fn drop_line(&mut self) {
        if let Some(cut) = self.cut.take() {
            let _ = cut.send(());
        }
    }
}
