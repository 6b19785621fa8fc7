//! Tests of the call correlator and the table of links.

use serde_json::json;

use super::*;

fn result_frame(call_id: &str, body: &str) -> String {
    format!(r#"{{"type":"device:result","callId":"{call_id}",{body}}}"#)
}

/// A correlator, and the receiving end of its outgoing frames.
fn correlator(max_pending: usize) -> (Arc<CallCorrelator>, mpsc::Receiver<String>) {
    let (tx, rx) = mpsc::channel(16);
    (
        Arc::new(CallCorrelator::with_max_pending(tx, max_pending)),
        rx,
    )
}

/// Reads the next invoke frame and returns its callId.
async fn next_call_id(rx: &mut mpsc::Receiver<String>) -> String {
    let text = rx.recv().await.unwrap();
    let frame = VesselFrame::parse(text.as_bytes()).unwrap();
    let VesselFrame::Invoke {
        call_id,
        capability,
        input,
    } = frame
    else {
        panic!("{text}")
    };
    assert_eq!(capability, "set_light");
    assert_eq!(Value::Object(input.into_owned()), json!({"on": true}));
    call_id.into_owned()
}

fn input() -> Map<String, Value> {
    json!({"on": true}).as_object().unwrap().clone()
}

#[track_caller]
fn feed(c: &CallCorrelator, text: &str) -> Handled {
    c.handle(&DeviceFrame::parse(text.as_bytes()).unwrap())
}

#[tokio::test]
async fn results_settle_their_calls() {
    let (c, mut rx) = correlator(4);
    let input = input();
    let call = c.invoke("set_light", &input, Duration::from_secs(5));
    let answer = async {
        let id = next_call_id(&mut rx).await;
        assert_eq!(uuid::Uuid::parse_str(&id).unwrap().get_version_num(), 4);
        assert_eq!(
            feed(&c, &result_frame(&id, r#""ok":true,"result":{"on":true}"#)),
            Handled::Settled
        );
        assert_eq!(
            feed(&c, &result_frame(&id, r#""ok":true"#)),
            Handled::UnknownCall
        );
    };
    let (result, ()) = tokio::join!(call, answer);
    assert_eq!(result.unwrap().unwrap().get(), r#"{"on":true}"#);
    assert_eq!(c.unknown_results(), 1);
    assert_eq!(c.pending_calls(), 0);
}

#[tokio::test]
async fn error_results() {
    let (c, mut rx) = correlator(4);
    let input = input();
    for (body, expected) in [
        (
            r#""ok":false"#,
            Err(InvokeError::Device("device error".to_owned())),
        ),
        (
            r#""ok":false,"error":"bulb broken""#,
            Err(InvokeError::Device("bulb broken".to_owned())),
        ),
        (
            r#""ok":false,"error":7"#,
            Err(InvokeError::Device("device error".to_owned())),
        ),
        (r#""ok":true"#, Ok(None)),
    ] {
        let call = c.invoke("set_light", &input, Duration::from_secs(5));
        let answer = async {
            let id = next_call_id(&mut rx).await;
            feed(&c, &result_frame(&id, body));
        };
        let (result, ()) = tokio::join!(call, answer);
        assert_eq!(
            result.map(|r| r.map(|r| r.get().to_owned())),
            expected,
            "{body}"
        );
    }
    assert_eq!(
        feed(&c, r#"{"type":"device:event","capability":"x"}"#),
        Handled::NotAResult
    );
}

#[tokio::test(start_paused = true)]
async fn unanswered_calls_time_out_and_late_results_are_ignored() {
    let (c, mut rx) = correlator(4);
    let input = input();
    let result = c
        .invoke("set_light", &input, Duration::from_millis(250))
        .await;
    assert_eq!(
        result.unwrap_err().to_string(),
        "device did not answer within 250ms"
    );
    let id = next_call_id(&mut rx).await;
    assert_eq!(
        feed(&c, &result_frame(&id, r#""ok":true"#)),
        Handled::UnknownCall
    );
    assert_eq!(c.pending_calls(), 0);
}

#[tokio::test(start_paused = true)]
async fn closing_fails_every_pending_call_at_once() {
    let (c, _rx) = correlator(8);
    let input = input();
    let started = tokio::time::Instant::now();
    let calls = futures::future::join_all(
        (0..3).map(|_| c.invoke("set_light", &input, Duration::from_secs(10))),
    );
    let close = async {
        tokio::task::yield_now().await;
        assert_eq!(c.pending_calls(), 3);
        c.close(LinkClosed::Disconnected);
    };
    let (results, ()) = tokio::join!(calls, close);
    for r in results {
        assert_eq!(r.unwrap_err().to_string(), "device disconnected");
    }
    // Failed at once, not at the timeout (paused time only moves when waited on).
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(
        c.invoke("set_light", &input, Duration::from_secs(1))
            .await
            .unwrap_err()
            .to_string(),
        "device disconnected"
    );
}

#[tokio::test]
async fn send_failures_and_the_pending_cap() {
    let (c, rx) = correlator(2);
    drop(rx);
    let input = input();
    assert_eq!(
        c.invoke("set_light", &input, Duration::from_secs(1))
            .await
            .unwrap_err()
            .to_string(),
        "send failed: connection closed"
    );
    assert_eq!(c.pending_calls(), 0);

    let (c, _rx) = correlator(2);
    let first = c.invoke("set_light", &input, Duration::from_secs(30));
    let second = c.invoke("set_light", &input, Duration::from_secs(30));
    let third = async {
        tokio::task::yield_now().await;
        let refused = c.invoke("set_light", &input, Duration::from_secs(30)).await;
        c.close(LinkClosed::Replaced);
        refused
    };
    let (a, b, refused) = tokio::join!(first, second, third);
    assert_eq!(
        refused.unwrap_err().to_string(),
        "too many calls in flight (at most 2)"
    );
    assert_eq!(
        (a.unwrap_err().to_string(), b.unwrap_err().to_string()),
        (
            "replaced by a newer connection".to_owned(),
            "replaced by a newer connection".to_owned()
        )
    );
}

#[tokio::test]
async fn a_call_given_up_by_its_caller_gives_its_place_back() {
    let (c, mut rx) = correlator(1);
    let input = input();
    // The device never answers; the caller stops waiting after the send.
    {
        let call = c.invoke("set_light", &input, Duration::from_secs(3600));
        tokio::pin!(call);
        tokio::select! {
            _ = &mut call => panic!("no answer was given"),
            id = next_call_id(&mut rx) => assert!(!id.is_empty()),
        }
        assert_eq!(c.pending_calls(), 1);
    }
    assert_eq!(c.pending_calls(), 0);
    // The one place is free for the next call, which is answered.
    let call = c.invoke("set_light", &input, Duration::from_secs(5));
    let answer = async {
        let id = next_call_id(&mut rx).await;
        feed(&c, &result_frame(&id, r#""ok":true,"result":{"on":true}"#))
    };
    let (outcome, handled) = tokio::join!(call, answer);
    assert_eq!(handled, Handled::Settled);
    assert_eq!(outcome.unwrap().unwrap().get(), r#"{"on":true}"#);
}

#[test]
fn links_table() {
    let links = Links::new();
    let (tx, _rx) = mpsc::channel(1);
    let a: Arc<dyn DeviceLink> = Arc::new(CallCorrelator::new(tx.clone()));
    let b: Arc<dyn DeviceLink> = Arc::new(CallCorrelator::new(tx));
    assert!(links.connect("lamp", Arc::clone(&a)).is_none());
    assert!(links.connect("lamp", Arc::clone(&b)).is_some());
    // The old connection closing does not remove the new one.
    links.disconnect("lamp", &a);
    assert!(links.is_connected("lamp"));
    links.disconnect("lamp", &b);
    assert!(!links.is_connected("lamp"));
    assert!(links.get("lamp").is_none());
}
