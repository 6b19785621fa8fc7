//! Routed requests: answered once, sealed both ways, and each failure a
//! clear error at the right time: no such member and NATS down at once,
//! a silent member at the deadline; requests work again once NATS is back.

use std::time::{Duration, Instant};

use dk_fleet::{MemberId, RequestError};

use crate::harness::{Nats, eventually, member, nats_or_skip};

#[tokio::test]
async fn requests_reach_the_member_and_fail_clearly() {
    let Some(binary) = nats_or_skip("requests_reach_the_member_and_fail_clearly") else {
        return;
    };
    let mut nats = Nats::start(binary, "");
    let a = member(&nats, "a").await;
    let b = member(&nats, "b").await;
    let silent = member(&nats, "silent").await;
    let mut served = b.serve().await.unwrap();
    let server = tokio::spawn(async move {
        while let Some(request) = served.next().await {
            let mut answer = b"echo ".to_vec();
            answer.extend_from_slice(request.payload());
            answer.extend_from_slice(format!(" from {}", request.from()).as_bytes());
            assert!(request.deadline() > Instant::now());
            request.respond(&answer).await.unwrap();
        }
    });
    let mut unanswered = silent.serve().await.unwrap();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Some(request) = unanswered.next().await {
            held.push(request);
        }
    });
    let soon = || Instant::now() + Duration::from_secs(5);

    let reply = a.request(b.member(), b"hello", soon()).await.unwrap();
    assert_eq!(reply, b"echo hello from a");
    // What a routed request costs on loopback (said, not asserted).
    let mut took = Vec::new();
    for _ in 0..200 {
        let started = Instant::now();
        a.request(b.member(), b"hello", soon()).await.unwrap();
        took.push(started.elapsed());
    }
    took.sort();
    eprintln!(
        "routed request round trip: median {:?}",
        took[took.len() / 2]
    );

    let started = Instant::now();
    let nobody = MemberId::new("nobody").unwrap();
    assert_eq!(
        a.request(&nobody, b"hello", soon()).await,
        Err(RequestError::NoSuchMember(nobody))
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );

    let started = Instant::now();
    let deadline = Instant::now() + Duration::from_millis(300);
    assert_eq!(
        a.request(silent.member(), b"hello", deadline).await,
        Err(RequestError::DeadlinePassed)
    );
    assert!(started.elapsed() >= Duration::from_millis(290));
    assert!(started.elapsed() < Duration::from_secs(2));

    // NATS down: a request fails at once, not at its deadline.
    nats.stop();
    eventually(Duration::from_secs(5), "a sees NATS gone", || {
        !a.is_connected()
    })
    .await;
    let started = Instant::now();
    assert_eq!(
        a.request(b.member(), b"hello", soon()).await,
        Err(RequestError::NatsDown)
    );
    // At once: well before the 5 s deadline.
    assert!(started.elapsed() < Duration::from_secs(1));

    // Back on the same port: the clients reconnect and requests work again.
    nats.resume();
    let back = Instant::now();
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        match a.request(b.member(), b"again", soon()).await {
            Ok(reply) => {
                assert_eq!(reply, b"echo again from a");
                break;
            }
            Err(RequestError::NatsDown | RequestError::NoSuchMember(_))
                if Instant::now() < until =>
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(other) => panic!("after NATS came back: {other}"),
        }
    }
    eprintln!(
        "requests answered again {:?} after NATS came back",
        back.elapsed()
    );
    server.abort();
    hold.abort();
}
