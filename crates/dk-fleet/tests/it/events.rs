//! Broadcast events reach every other member, verified, and never their
//! own publisher.

use std::time::Duration;

use crate::harness::{Nats, member, nats_or_skip};

#[tokio::test]
async fn events_reach_the_others_only() {
    let Some(binary) = nats_or_skip("events_reach_the_others_only") else {
        return;
    };
    let nats = Nats::start(binary, "");
    let a = member(&nats, "a").await;
    let b = member(&nats, "b").await;
    let c = member(&nats, "c").await;
    let mut at_a = a.events().await.unwrap();
    let mut at_b = b.events().await.unwrap();
    let mut at_c = c.events().await.unwrap();
    a.publish(b"tools changed").await.unwrap();
    let wait = Duration::from_secs(2);
    for events in [&mut at_b, &mut at_c] {
        let event = tokio::time::timeout(wait, events.next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (event.from.as_str(), event.payload.as_slice()),
            ("a", &b"tools changed"[..])
        );
    }
    // a's own event is skipped: the first a sees is b's.
    b.publish(b"prompt answered").await.unwrap();
    let event = tokio::time::timeout(wait, at_a.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (event.from.as_str(), event.payload.as_slice()),
        ("b", &b"prompt answered"[..])
    );
    assert_eq!(a.dropped(), dk_fleet::Dropped::default());
}

#[tokio::test]
async fn every_subscription_gets_each_event() {
    let Some(binary) = nats_or_skip("every_subscription_gets_each_event") else {
        return;
    };
    let nats = Nats::start(binary, "");
    let a = member(&nats, "a").await;
    let b = member(&nats, "b").await;
    let mut first = b.events().await.unwrap();
    let mut second = b.events().await.unwrap();
    a.publish(b"tools changed").await.unwrap();
    for events in [&mut first, &mut second] {
        let event = tokio::time::timeout(Duration::from_secs(2), events.next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(event.payload, b"tools changed");
    }
    assert_eq!(b.dropped(), dk_fleet::Dropped::default());
}
