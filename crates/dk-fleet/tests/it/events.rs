//! Broadcast events reach every other member, verified, and never their
//! own publisher; an event of a member's earlier incarnation, replayed
//! after it restarted, is dropped.

use std::time::Duration;

use futures::StreamExt as _;

use crate::harness::{Nats, all_present, eventually, member, nats_or_skip};

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
    let wait = Duration::from_secs(20);
    for events in [&mut at_b, &mut at_c] {
        let event = tokio::time::timeout(wait, events.next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (
                event.from.as_str(),
                event.payload.as_slice(),
                event.incarnation
            ),
            ("a", &b"tools changed"[..], a.incarnation())
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
        let event = tokio::time::timeout(Duration::from_secs(20), events.next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(event.payload, b"tools changed");
    }
    assert_eq!(b.dropped(), dk_fleet::Dropped::default());
}

#[tokio::test]
async fn an_event_of_an_earlier_incarnation_is_stale() {
    let Some(binary) = nats_or_skip("an_event_of_an_earlier_incarnation_is_stale") else {
        return;
    };
    let nats = Nats::start(binary, "");
    let outsider = async_nats::connect(nats.url()).await.unwrap();
    let mut recorded = outsider.subscribe("dk.fleet.event").await.unwrap();
    outsider.flush().await.unwrap();
    let first = member(&nats, "a").await;
    let b = member(&nats, "b").await;
    let mut events = b.events().await.unwrap();
    all_present(&[&first, &b]).await;
    first.publish(b"allow this").await.unwrap();
    let captured = tokio::time::timeout(Duration::from_secs(20), recorded.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(events.next().await.unwrap().payload, b"allow this");
    // a restarts: a later incarnation, and b hears it.
    first.leave().await.unwrap();
    let again = member(&nats, "a").await;
    all_present(&[&again, &b]).await;
    // A subscription made now remembers no message ids (as after b's own
    // restart): only the incarnation tells the replay.
    let mut fresh = b.events().await.unwrap();
    let stale_before = b.dropped().stale;
    // The earlier incarnation's event, sent again: dropped as stale, not
    // delivered (the next event b sees is the new incarnation's).
    outsider
        .publish("dk.fleet.event", captured.payload.clone())
        .await
        .unwrap();
    outsider.flush().await.unwrap();
    again.publish(b"after").await.unwrap();
    for events in [&mut events, &mut fresh] {
        let next = tokio::time::timeout(Duration::from_secs(20), events.next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (next.payload.as_slice(), next.incarnation),
            (&b"after"[..], again.incarnation())
        );
    }
    eventually("the replay counted as stale", || {
        b.dropped().stale > stale_before
    })
    .await;
}
