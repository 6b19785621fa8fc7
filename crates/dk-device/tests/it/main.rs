//! The device SDK used from outside, as a device maker would: sample devices
//! and a typed device served over channels.

// Test code throughout: the lint wall's test allowances apply to all of it.
#![cfg(test)]

use std::collections::HashSet;

use dk_device::samples::{Lock, LockState, Thermostat};
use dk_device::{Device, HandlerError, ServeOptions, serve_device, serve_device_with};
use futures::channel::mpsc::unbounded;
use futures::{SinkExt as _, StreamExt as _};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

fn invoke(call_id: &str, capability: &str, input: Value) -> String {
    json!({"type": "device:invoke", "callId": call_id, "capability": capability, "input": input})
        .to_string()
}

fn parse(frame: &str) -> Value {
    serde_json::from_str(frame).unwrap()
}

#[tokio::test]
async fn a_lock_is_unlocked_and_locked_again() {
    let lock = Lock::new();
    let (mut to_device, incoming) = unbounded::<String>();
    let (outgoing, mut from_device) = unbounded::<String>();
    let device = lock.device();
    let server = tokio::spawn(async move { serve_device(&device, incoming, outgoing).await });

    to_device
        .send(invoke("a", "unlock", json!({})))
        .await
        .unwrap();
    assert_eq!(
        parse(&from_device.next().await.unwrap()),
        json!({"type": "device:result", "callId": "a", "ok": true, "result": {"locked": false}})
    );
    assert_eq!(lock.state(), LockState { locked: false });
    to_device
        .send(invoke("b", "lock", json!({})))
        .await
        .unwrap();
    assert_eq!(
        parse(&from_device.next().await.unwrap()),
        json!({"type": "device:result", "callId": "b", "ok": true, "result": {"locked": true}})
    );
    drop(to_device);
    server.await.unwrap().unwrap();
    assert_eq!(from_device.next().await, None);
}

#[tokio::test]
async fn a_thermostat_reports_its_drift_as_events() {
    let thermostat = Thermostat::new();
    let device = thermostat.device();
    let (events, receiver) = device.events(8);
    let (mut to_device, incoming) = unbounded::<String>();
    let (outgoing, mut from_device) = unbounded::<String>();
    let server = tokio::spawn(async move {
        serve_device_with(
            &device,
            incoming,
            outgoing,
            ServeOptions::new().events(receiver),
        )
        .await
    });

    to_device
        .send(invoke("t1", "set_target", json!({"celsius": 21})))
        .await
        .unwrap();
    assert_eq!(
        parse(&from_device.next().await.unwrap()),
        json!({"type": "device:result", "callId": "t1", "ok": true,
               "result": {"current": 20, "target": 21, "mode": "auto"}})
    );
    while let Some((capability, data)) = thermostat.tick() {
        events.emit(&capability, data).await.unwrap();
    }
    for current in [json!(20.5), json!(21)] {
        assert_eq!(
            parse(&from_device.next().await.unwrap()),
            json!({"type": "device:event", "capability": "read_temperature",
                   "data": {"current": current, "target": 21, "mode": "auto"}})
        );
    }
    drop(to_device);
    server.await.unwrap().unwrap();
}

#[derive(Deserialize)]
struct Add {
    a: f64,
    b: f64,
}

#[derive(Serialize)]
struct Sum {
    sum: f64,
}

fn adder() -> Device {
    Device::define(&json!({
        "id": "adder", "name": "Adder", "kind": "calculator", "version": "1.0.0",
        "capabilities": [{"name": "add", "kind": "sensor", "description": "Add two numbers.",
                          "params": {"a": {"type": "number", "required": true},
                                     "b": {"type": "number", "required": true}}}]
    }))
    .typed_handler("add", |Add { a, b }| async move {
        tokio::task::yield_now().await;
        Ok::<_, HandlerError>(Sum { sum: a + b })
    })
    .build()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_calls_in_flight_are_each_answered_once() {
    let device = adder();
    let (mut to_device, incoming) = unbounded::<String>();
    let (outgoing, from_device) = unbounded::<String>();
    let server = tokio::spawn(async move { serve_device(&device, incoming, outgoing).await });
    for n in 0..50 {
        to_device
            .send(invoke(
                &format!("call-{n}"),
                "add",
                json!({"a": n, "b": 0.5}),
            ))
            .await
            .unwrap();
    }
    to_device
        .send(invoke("bad", "add", json!({"a": "one", "b": 2})))
        .await
        .unwrap();
    drop(to_device);
    server.await.unwrap().unwrap();

    let answers: Vec<Value> = from_device.map(|frame| parse(&frame)).collect().await;
    assert_eq!(answers.len(), 51);
    let mut ids = HashSet::new();
    for answer in answers {
        let call_id = answer["callId"].as_str().unwrap().to_owned();
        if call_id == "bad" {
            assert_eq!(
                answer,
                json!({"type": "device:result", "callId": "bad", "ok": false,
                       "error": "invalid input for \"add\": invalid type: string \"one\", expected f64"})
            );
        } else {
            let n: f64 = call_id.trim_start_matches("call-").parse().unwrap();
            assert_eq!(answer["result"], json!({"sum": n + 0.5}), "{call_id}");
        }
        assert!(ids.insert(call_id), "answered once");
    }
}
