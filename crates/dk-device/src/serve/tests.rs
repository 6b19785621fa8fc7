//! Tests of the serve loop, driven through channels.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use serde_json::{Value, json};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;

use crate::samples::{Lamp, LampState};
use crate::{
    CallError, Device, EmitError, HandlerError, Notice, ServeError, ServeOptions, serve_device,
    serve_device_with,
};

/// A device whose handlers the test controls.
struct Probe {
    device: Device,
    /// `slow` waits for a permit here.
    gate: Arc<Semaphore>,
    /// Each handler sends its capability name when it starts.
    started: mpsc::UnboundedReceiver<String>,
    /// Held by every running `hang` call.
    alive: Arc<()>,
}

fn probe() -> Probe {
    let gate = Arc::new(Semaphore::new(0));
    let (started_tx, started) = mpsc::unbounded_channel();
    let alive = Arc::new(());
    let capabilities: Vec<Value> = ["fast", "slow", "fail", "explode", "hang", "sleepy"]
        .iter()
        .map(|name| json!({"name": name, "kind": "actuator", "description": "A probe."}))
        .collect();
    let manifest = json!({"id": "probe", "name": "Probe", "kind": "probe", "version": "1",
                          "capabilities": capabilities});
    let start = move |name: &'static str| {
        let started = started_tx.clone();
        move || {
            let _ = started.send(name.to_owned());
        }
    };
    let (on_fast, on_slow, on_fail) = (start("fast"), start("slow"), start("fail"));
    let (on_explode, on_hang, on_sleepy) = (start("explode"), start("hang"), start("sleepy"));
    let slow_gate = Arc::clone(&gate);
    let hang_alive = Arc::clone(&alive);
    let device = Device::define(&manifest)
        .handler("fast", move |input| {
            on_fast();
            async move { Ok(Value::Object(input)) }
        })
        .handler("slow", move |_input| {
            on_slow();
            let gate = Arc::clone(&slow_gate);
            async move {
                gate.acquire()
                    .await
                    .map_err(|e| HandlerError::new(e.to_string()))?
                    .forget();
                Ok(json!({"slow": true}))
            }
        })
        .handler("fail", move |_input| {
            on_fail();
            async move { Err(HandlerError::from("the probe failed")) }
        })
        .handler("explode", move |_input| {
            on_explode();
            async move {
                tokio::task::yield_now().await;
                panic!("the probe exploded")
            }
        })
        .handler("hang", move |_input| {
            on_hang();
            let alive = Arc::clone(&hang_alive);
            async move {
                let _alive = alive;
                std::future::pending::<Result<Value, HandlerError>>().await
            }
        })
        .handler("sleepy", move |_input| {
            on_sleepy();
            async move {
                // A handler that takes a second: a call still running.
                tokio::time::sleep(Duration::from_secs(1)).await;
                Ok(json!({"slept": true}))
            }
        })
        .build()
        .unwrap();
    Probe {
        device,
        gate,
        started,
        alive,
    }
}

/// A serve loop on channels, run by a task the test owns.
struct Link {
    to_device: UnboundedSender<String>,
    from_device: UnboundedReceiver<String>,
    server: JoinHandle<Result<(), ServeError>>,
    notices: Arc<Mutex<Vec<Notice>>>,
}

fn start(device: &Device, options: ServeOptions) -> Link {
    let (to_device, incoming) = unbounded::<String>();
    let (outgoing, from_device) = unbounded::<String>();
    let notices = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&notices);
    let options = options.on_notice(move |notice| seen.lock().unwrap().push(notice));
    let device = device.clone();
    let server =
        tokio::spawn(async move { serve_device_with(&device, incoming, outgoing, options).await });
    Link {
        to_device,
        from_device,
        server,
        notices,
    }
}

impl Link {
    fn send(&self, frame: &str) {
        self.to_device.unbounded_send(frame.to_owned()).unwrap();
    }

    fn invoke(&self, call_id: &str, capability: &str, input: Value) {
        self.send(
            &json!({"type": "device:invoke", "callId": call_id, "capability": capability,
                    "input": input})
            .to_string(),
        );
    }

    async fn next_text(&mut self) -> String {
        self.from_device.next().await.expect("the device answers")
    }

    async fn next(&mut self) -> Value {
        serde_json::from_str(&self.next_text().await).unwrap()
    }

    /// The notices other than calls starting.
    fn notices(&self) -> Vec<Notice> {
        let notices = self.notices.lock().unwrap();
        notices
            .iter()
            .filter(|n| !matches!(n, Notice::Invoked { .. }))
            .cloned()
            .collect()
    }

    /// The calls started, in order: (call id, capability, input).
    fn invoked(&self) -> Vec<(String, String, Value)> {
        let notices = self.notices.lock().unwrap();
        notices
            .iter()
            .filter_map(|n| match n {
                Notice::Invoked {
                    call_id,
                    capability,
                    input,
                } => Some((
                    call_id.clone(),
                    capability.clone(),
                    Value::Object(input.clone()),
                )),
                _ => None,
            })
            .collect()
    }

    /// Ends the incoming frames and waits for the loop; checks nothing more
    /// was sent.
    async fn finish(mut self) -> Result<(), ServeError> {
        drop(self.to_device);
        let result = self.server.await.unwrap();
        assert_eq!(self.from_device.next().await, None, "nothing more is sent");
        result
    }
}

fn ok(call_id: &str, result: Value) -> Value {
    json!({"type": "device:result", "callId": call_id, "ok": true, "result": result})
}

fn err(call_id: &str, error: &str) -> Value {
    json!({"type": "device:result", "callId": call_id, "ok": false, "error": error})
}

#[tokio::test]
async fn lamp_set_light_then_read_light() {
    let lamp = Lamp::new();
    let mut link = start(&lamp.device(), ServeOptions::new());
    link.invoke("c1", "set_light", json!({"on": true, "brightness": 50}));
    assert_eq!(
        link.next_text().await,
        r#"{"type":"device:result","callId":"c1","ok":true,"result":{"on":true,"brightness":50}}"#
    );
    link.invoke("c2", "read_light", json!({}));
    assert_eq!(
        link.next().await,
        ok("c2", json!({"on": true, "brightness": 50}))
    );
    link.invoke("c3", "set_light", json!({"on": false}));
    assert_eq!(
        link.next().await,
        ok("c3", json!({"on": false, "brightness": 50}))
    );
    assert_eq!(
        lamp.state(),
        LampState {
            on: false,
            brightness: 50.0
        }
    );
    link.finish().await.unwrap();
}

#[tokio::test]
async fn unknown_capability_failure_and_panic_are_answered() {
    let probe = probe();
    let mut link = start(&probe.device, ServeOptions::new());
    let cases = [
        ("c1", "dim", err("c1", "unknown capability \"dim\"")),
        ("c2", "fail", err("c2", "the probe failed")),
        (
            "c3",
            "explode",
            err("c3", "handler for \"explode\" panicked"),
        ),
        (
            "c4",
            "explode",
            err("c4", "handler for \"explode\" panicked"),
        ),
        ("c5", "fast", ok("c5", json!({"n": 1}))),
    ];
    for (call_id, capability, expected) in cases {
        link.invoke(call_id, capability, json!({"n": 1}));
        assert_eq!(link.next().await, expected, "{call_id} {capability}");
    }
    link.finish().await.unwrap();
}

#[tokio::test]
async fn strange_frames_are_ignored() {
    let probe = probe();
    let mut link = start(&probe.device, ServeOptions::new());
    let deep = format!("{}{}", "[".repeat(100), "]".repeat(100));
    let huge = format!(
        r#"{{"type":"device:invoke","callId":"big","capability":"fast","input":{{"x":"{}"}}}}"#,
        "a".repeat(dk_proto::MAX_FRAME_BYTES)
    );
    let strange = [
        "",
        "not json",
        "{",
        "[]",
        "42",
        "null",
        r#""device:invoke""#,
        "{}",
        r#"{"type":42}"#,
        r#"{"type":"device:nonsense"}"#,
        r#"{"type":"device:invoke"}"#,
        r#"{"type":"device:invoke","capability":"fast","input":{}}"#,
        r#"{"type":"device:invoke","callId":"","capability":"fast","input":{}}"#,
        r#"{"type":"device:invoke","callId":7,"capability":"fast","input":{}}"#,
        r#"{"type":"device:invoke","callId":"s1","input":{}}"#,
        r#"{"type":"device:invoke","callId":"s1","capability":null,"input":{}}"#,
        r#"{"type":"device:invoke","callId":"s1","capability":"fast"}"#,
        r#"{"type":"device:invoke","callId":"s1","capability":"fast","input":[1]}"#,
        r#"{"type":"device:invoke","callId":"s1","capability":"fast","input":"x"}"#,
        r#"{"type":"device:hello","manifest":{}}"#,
        r#"{"type":"device:auth","deviceId":"probe","token":"t"}"#,
        r#"{"type":"device:result","callId":"s1","ok":true,"result":1}"#,
        r#"{"type":"device:event","capability":"fast","data":1}"#,
        r#"{"type":"device:pairing"}"#,
        r#"{"type":"device:paired","deviceToken":""}"#,
        &deep,
        &huge,
    ];
    for frame in strange {
        link.send(frame);
    }
    // Vessel frames that are not invokes are reported, not answered.
    link.send(r#"{"type":"device:pairing","code":"042042"}"#);
    link.send(r#"{"type":"device:paired","deviceToken":"secret-token"}"#);
    link.send(r#"{"type":"device:revoked","capability":"fast"}"#);
    link.send(r#"{"type":"device:revoked"}"#);
    link.invoke("after", "fast", json!({"still": "here"}));
    assert_eq!(link.next().await, ok("after", json!({"still": "here"})));

    let notices = link.notices();
    let refused = notices
        .iter()
        .filter(|n| matches!(n, Notice::Refused { .. }))
        .count();
    assert_eq!(refused, strange.len());
    assert_eq!(
        notices.get(strange.len()..).unwrap(),
        [
            Notice::Pairing {
                code: "042042".into()
            },
            Notice::Paired {
                device_token: "secret-token".into()
            },
            Notice::Revoked {
                capability: Some("fast".into())
            },
            Notice::Revoked { capability: None },
        ]
    );
    let shown = format!("{notices:?}");
    assert!(!shown.contains("secret-token"), "{shown}");
    link.finish().await.unwrap();
}

#[tokio::test]
async fn a_slow_call_does_not_hold_up_a_fast_one() {
    let mut probe = probe();
    let mut link = start(&probe.device, ServeOptions::new());
    link.invoke("slow-1", "slow", json!({}));
    assert_eq!(probe.started.recv().await.unwrap(), "slow");
    link.invoke("fast-1", "fast", json!({}));
    link.invoke("fast-2", "fail", json!({}));
    assert_eq!(link.next().await, ok("fast-1", json!({})));
    assert_eq!(link.next().await, err("fast-2", "the probe failed"));
    probe.gate.add_permits(1);
    assert_eq!(link.next().await, ok("slow-1", json!({"slow": true})));
    link.finish().await.unwrap();
}

#[tokio::test]
async fn a_call_id_still_in_flight_is_not_run_twice() {
    let mut probe = probe();
    let mut link = start(&probe.device, ServeOptions::new());
    link.invoke("c1", "slow", json!({}));
    assert_eq!(probe.started.recv().await.unwrap(), "slow");
    link.invoke("c1", "slow", json!({}));
    link.invoke("c1", "fast", json!({}));
    link.invoke("c2", "fast", json!({}));
    assert_eq!(link.next().await, ok("c2", json!({})));
    assert_eq!(probe.started.recv().await.unwrap(), "fast");
    probe.gate.add_permits(2);
    assert_eq!(link.next().await, ok("c1", json!({"slow": true})));
    // Once answered, the id is answered with an error and still not run.
    link.invoke("c1", "fast", json!({"again": true}));
    assert_eq!(
        link.next().await,
        err("c1", "call \"c1\" was already received: not run again")
    );
    link.invoke("c2", "fast", json!({}));
    assert_eq!(
        link.next().await,
        err("c2", "call \"c2\" was already received: not run again")
    );
    assert!(probe.started.try_recv().is_err(), "the repeats never ran");
    assert_eq!(
        link.invoked(),
        [
            ("c1".to_owned(), "slow".to_owned(), json!({})),
            ("c2".to_owned(), "fast".to_owned(), json!({})),
        ],
        "only the calls that ran are reported"
    );
    let repeat = Notice::DuplicateCall {
        call_id: "c1".into(),
    };
    assert_eq!(
        link.notices(),
        [
            repeat.clone(),
            repeat.clone(),
            repeat,
            Notice::DuplicateCall {
                call_id: "c2".into()
            },
        ]
    );
    link.finish().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn calls_finishing_within_the_grace_are_answered_after_incoming_ends() {
    let mut probe = probe();
    let link = start(&probe.device, ServeOptions::new());
    link.invoke("c1", "sleepy", json!({}));
    assert_eq!(probe.started.recv().await.unwrap(), "sleepy");
    let Link {
        to_device,
        mut from_device,
        server,
        ..
    } = link;
    drop(to_device);
    assert_eq!(
        serde_json::from_str::<Value>(&from_device.next().await.unwrap()).unwrap(),
        ok("c1", json!({"slept": true}))
    );
    server.await.unwrap().unwrap();
    assert_eq!(from_device.next().await, None);
}

#[tokio::test(start_paused = true)]
async fn calls_outliving_the_grace_are_stopped() {
    let mut probe = probe();
    let link = start(
        &probe.device,
        ServeOptions::new().grace(Duration::from_secs(2)),
    );
    link.invoke("c1", "hang", json!({}));
    link.invoke("c2", "hang", json!({}));
    assert_eq!(probe.started.recv().await.unwrap(), "hang");
    assert_eq!(probe.started.recv().await.unwrap(), "hang");
    // The probe and the handler hold one each; each running call one more.
    assert_eq!(Arc::strong_count(&probe.alive), 4);
    link.finish().await.unwrap();
    assert_eq!(
        Arc::strong_count(&probe.alive),
        2,
        "no handler left running"
    );
}

#[tokio::test]
async fn a_failing_sink_stops_the_loop_and_its_calls() {
    let mut probe = probe();
    let link = start(&probe.device, ServeOptions::new());
    link.invoke("c1", "hang", json!({}));
    assert_eq!(probe.started.recv().await.unwrap(), "hang");
    let Link {
        to_device,
        from_device,
        server,
        ..
    } = link;
    drop(from_device);
    to_device
        .unbounded_send(
            json!({"type": "device:invoke", "callId": "c2", "capability": "fast", "input": {}})
                .to_string(),
        )
        .unwrap();
    let result = server.await.unwrap();
    assert!(
        matches!(&result, Err(ServeError::Send(message)) if !message.is_empty()),
        "{result:?}"
    );
    assert!(result.unwrap_err().to_string().starts_with("send failed: "));
    assert_eq!(
        Arc::strong_count(&probe.alive),
        2,
        "no handler left running"
    );
}

#[tokio::test]
async fn calls_beyond_the_limit_are_answered_busy() {
    let mut probe = probe();
    let mut link = start(&probe.device, ServeOptions::new().max_in_flight(1));
    link.invoke("c1", "slow", json!({}));
    assert_eq!(probe.started.recv().await.unwrap(), "slow");
    link.invoke("c2", "fast", json!({}));
    assert_eq!(
        link.next().await,
        err("c2", "device is busy: 1 calls in flight")
    );
    probe.gate.add_permits(1);
    assert_eq!(link.next().await, ok("c1", json!({"slow": true})));
    link.invoke("c3", "fast", json!({}));
    assert_eq!(link.next().await, ok("c3", json!({})));
    link.finish().await.unwrap();
}

#[tokio::test]
async fn events_go_out_through_the_same_sink() {
    let lamp = Lamp::new();
    let device = lamp.device();
    let (events, receiver) = device.events(1);
    let mut link = start(&device, ServeOptions::new().events(receiver));
    events
        .emit("read_light", json!({"on": true, "brightness": 5}))
        .await
        .unwrap();
    assert_eq!(
        link.next_text().await,
        r#"{"type":"device:event","capability":"read_light","data":{"on":true,"brightness":5}}"#
    );
    let refused = events.emit("dim", json!({})).await.unwrap_err();
    assert_eq!(refused, EmitError::UnknownCapability("dim".into()));
    assert_eq!(refused.to_string(), "unknown capability \"dim\"");
    // Calls are still answered while events flow, and after the senders are gone.
    link.invoke("c1", "read_light", json!({}));
    assert_eq!(
        link.next().await,
        ok("c1", json!({"on": false, "brightness": 0}))
    );
    let sender = events.clone();
    drop(events);
    sender.emit("strobe", Value::Null).await.unwrap();
    assert_eq!(
        link.next().await,
        json!({"type": "device:event", "capability": "strobe", "data": null})
    );
    drop(sender);
    link.invoke("c2", "strobe", json!({}));
    assert_eq!(link.next().await, ok("c2", json!({"strobed": true})));
    link.finish().await.unwrap();
}

#[tokio::test]
async fn emitting_without_a_loop_reports_full_then_closed() {
    let device = crate::samples::lamp();
    let (events, receiver) = device.events(0);
    events.try_emit("strobe", json!(1)).unwrap();
    assert_eq!(events.try_emit("strobe", json!(2)), Err(EmitError::Full));
    drop(receiver);
    assert_eq!(events.try_emit("strobe", json!(3)), Err(EmitError::Closed));
    assert_eq!(
        events.emit("strobe", json!(4)).await,
        Err(EmitError::Closed)
    );
    assert_eq!(
        events.try_emit("nope", json!(5)),
        Err(EmitError::UnknownCapability("nope".into()))
    );
}

#[tokio::test]
async fn serve_device_uses_the_defaults() {
    let device = crate::samples::lamp();
    let (to_device, incoming) = unbounded::<String>();
    let (outgoing, mut from_device) = unbounded::<String>();
    to_device
        .unbounded_send(
            json!({"type": "device:invoke", "callId": "c1", "capability": "strobe", "input": {}})
                .to_string(),
        )
        .unwrap();
    drop(to_device);
    serve_device(&device, incoming, outgoing).await.unwrap();
    let answer: Value = serde_json::from_str(&from_device.next().await.unwrap()).unwrap();
    assert_eq!(answer, ok("c1", json!({"strobed": true})));
    assert_eq!(from_device.next().await, None);
}

#[test]
fn serving_outside_a_runtime_is_an_error_not_a_panic() {
    let device = crate::samples::lamp();
    let (_to_device, incoming) = unbounded::<String>();
    let (outgoing, _from_device) = unbounded::<String>();
    let result = futures::executor::block_on(serve_device(&device, incoming, outgoing));
    assert_eq!(result, Err(ServeError::NoRuntime));
}

#[test]
fn options_show_their_settings() {
    let options = ServeOptions::new()
        .grace(Duration::from_millis(10))
        .max_in_flight(0);
    assert_eq!(
        format!("{options:?}"),
        "ServeOptions { grace: 10ms, max_in_flight: 1, events: false, on_notice: false, remembered_calls: 1024 }"
    );
    assert!(
        format!("{:?}", ServeOptions::new().remember_calls(0)).contains("remembered_calls: 1 ")
    );
}

#[tokio::test]
async fn a_task_that_fails_outside_its_handler_is_answered() {
    let mut handlers = super::Handlers::new(probe().device);
    let task = handlers
        .tasks
        .spawn(async { panic!("outside the handler") });
    handlers.by_task.insert(
        task.id(),
        super::Call {
            call_id: "c1".into(),
            capability: "fast".into(),
        },
    );
    let done = handlers.next().await.unwrap();
    assert_eq!(
        done,
        (
            "c1".to_owned(),
            Err("handler for \"fast\" panicked".to_owned())
        )
    );
    assert!(handlers.by_task.is_empty());

    let task = handlers.tasks.spawn(std::future::pending());
    task.abort();
    handlers.by_task.insert(
        task.id(),
        super::Call {
            call_id: "c2".into(),
            capability: "hang".into(),
        },
    );
    let done = handlers.next().await.unwrap();
    assert_eq!(
        done,
        (
            "c2".to_owned(),
            Err("handler for \"hang\" was stopped".to_owned())
        )
    );
}

#[test]
fn call_errors_say_what_the_core_says() {
    use dk_device_core::CallRefusal;
    let pairs = [
        (
            CallError::UnknownCapability("set_light".into()).to_string(),
            CallRefusal::UnknownCapability("set_light".into()).to_string(),
        ),
        (
            CallError::AlreadyReceived("c1".into()).to_string(),
            CallRefusal::AlreadyReceived("c1".into()).to_string(),
        ),
        (
            CallError::Busy(64).to_string(),
            CallRefusal::Busy(64).to_string(),
        ),
        (
            CallError::NotJson {
                capability: "read".into(),
                why: "EOF".into(),
            }
            .to_string(),
            CallRefusal::NotJson {
                capability: "read".into(),
                why: "EOF".into(),
            }
            .to_string(),
        ),
        (
            CallError::CannotBeSent {
                what: "result",
                capability: "read".into(),
                why: "too large".into(),
            }
            .to_string(),
            CallRefusal::CannotBeSent {
                what: "result",
                capability: "read".into(),
                why: "too large".into(),
            }
            .to_string(),
        ),
    ];
    for (ours, core) in pairs {
        assert_eq!(ours.as_bytes(), core.as_bytes());
    }
}

#[tokio::test]
async fn a_call_id_seen_before_a_reconnect_is_never_run_after_it() {
    let mut probe = probe();
    let device = probe.device.clone();
    let mut options = ServeOptions::new();
    // The first connection: `c1` runs and is answered; `c2` is still running
    // when the connection drops (its handler is stopped after the grace).
    options = options.grace(Duration::from_millis(1));
    let (to_device, mut incoming) = unbounded::<String>();
    let (mut outgoing, mut from_device) = unbounded::<String>();
    let invoke = |id: &str, capability: &str| {
        json!({"type": "device:invoke", "callId": id, "capability": capability, "input": {}})
            .to_string()
    };
    to_device.unbounded_send(invoke("c1", "fast")).unwrap();
    to_device.unbounded_send(invoke("c2", "hang")).unwrap();
    drop(to_device);
    super::serve_session(&device, &mut incoming, &mut outgoing, &mut options)
        .await
        .unwrap();
    let answer: Value = serde_json::from_str(&from_device.next().await.unwrap()).unwrap();
    assert_eq!(answer, ok("c1", json!({})));
    assert_eq!(probe.started.recv().await.unwrap(), "fast");
    assert_eq!(probe.started.recv().await.unwrap(), "hang");
    // The second connection, same client: both ids are refused, a new one runs.
    let (to_device, mut incoming) = unbounded::<String>();
    let (mut outgoing, from_device) = unbounded::<String>();
    for frame in [
        invoke("c1", "fast"),
        invoke("c2", "hang"),
        invoke("c3", "fast"),
    ] {
        to_device.unbounded_send(frame).unwrap();
    }
    drop(to_device);
    super::serve_session(&device, &mut incoming, &mut outgoing, &mut options)
        .await
        .unwrap();
    drop(outgoing);
    let answers: Vec<Value> = from_device
        .map(|text| serde_json::from_str(&text).unwrap())
        .collect()
        .await;
    assert_eq!(
        answers,
        [
            err("c1", "call \"c1\" was already received: not run again"),
            err("c2", "call \"c2\" was already received: not run again"),
            ok("c3", json!({})),
        ]
    );
    assert_eq!(probe.started.recv().await.unwrap(), "fast");
    assert!(probe.started.try_recv().is_err(), "no repeat ran");
}

#[tokio::test]
async fn only_the_last_remembered_ids_are_kept() {
    let mut probe = probe();
    let mut link = start(&probe.device, ServeOptions::new().remember_calls(2));
    for id in ["a", "b", "c"] {
        link.invoke(id, "fast", json!({}));
        assert_eq!(link.next().await, ok(id, json!({})));
    }
    // `a` is forgotten (memory is bounded), `c` is not.
    link.invoke("c", "fast", json!({}));
    assert_eq!(
        link.next().await,
        err("c", "call \"c\" was already received: not run again")
    );
    link.invoke("a", "fast", json!({}));
    assert_eq!(link.next().await, ok("a", json!({})));
    for _ in 0..4 {
        assert_eq!(probe.started.recv().await.unwrap(), "fast");
    }
    assert!(probe.started.try_recv().is_err());
    link.finish().await.unwrap();
}

/// `depth` arrays around `1`.
fn nested(depth: usize) -> Value {
    (0..depth).fold(json!(1), |inner, _| json!([inner]))
}

#[tokio::test]
async fn a_frame_the_vessel_would_refuse_is_never_sent_and_the_loop_goes_on() {
    let manifest = json!({"id": "deep", "name": "Deep", "kind": "probe", "version": "1",
        "capabilities": [
            {"name": "deep", "kind": "sensor", "description": "Answers 70 deep."},
            {"name": "huge", "kind": "sensor", "description": "Answers 2 MiB."},
            {"name": "loud", "kind": "sensor", "description": "Fails with 2 MiB."},
            {"name": "fine", "kind": "sensor", "description": "Answers 60 deep."}]});
    let device = Device::define(&manifest)
        .handler("deep", |_| async { Ok(nested(70)) })
        .handler("huge", |_| async { Ok(json!("x".repeat(2 << 20))) })
        .handler("loud", |_| async {
            Err::<Value, _>(HandlerError::new("x".repeat(2 << 20)))
        })
        .handler("fine", |_| async { Ok(nested(60)) })
        .build()
        .unwrap();
    let (events, receiver) = device.events(4);
    let mut link = start(&device, ServeOptions::new().events(receiver));
    for (call, capability) in [("c1", "deep"), ("c2", "huge"), ("c3", "loud")] {
        link.invoke(call, capability, json!({}));
        let text = link.next_text().await;
        assert!(
            dk_proto::DeviceFrame::parse(text.as_bytes()).is_ok(),
            "the vessel reads it"
        );
        let answer: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(answer["callId"], json!(call));
        assert_eq!(answer["ok"], json!(false), "{capability}");
        let error = answer["error"].as_str().unwrap();
        assert!(error.contains("cannot be sent"), "{error}");
        assert!(error.len() < 300, "{error}");
    }
    // An event the vessel would refuse is refused to the sender.
    let refused = events.try_emit("deep", nested(70)).unwrap_err();
    assert!(matches!(refused, EmitError::Refused(_)), "{refused}");
    assert!(refused.to_string().contains("deeper than 64"), "{refused}");
    let refused = events.emit("huge", json!("x".repeat(2 << 20))).await;
    assert!(matches!(refused, Err(EmitError::Refused(_))));
    // The loop goes on: what fits is sent.
    events.try_emit("fine", nested(60)).unwrap();
    let event = link.next().await;
    assert_eq!(event["type"], json!("device:event"));
    link.invoke("c4", "fine", json!({}));
    assert_eq!(link.next().await, ok("c4", nested(60)));
    drop(events);
    link.finish().await.unwrap();
}
