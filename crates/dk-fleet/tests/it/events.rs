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
    // restart): only the incarnation tells the replay. Both are read all
    // along, so what they drop is counted as it comes.
    let fresh = b.events().await.unwrap();
    let (heard, mut delivered) = tokio::sync::mpsc::unbounded_channel();
    let mut readers = Vec::new();
    for mut events in [events, fresh] {
        let heard = heard.clone();
        readers.push(tokio::spawn(async move {
            while let Some(event) = events.next().await {
                let _ = heard.send(event);
            }
        }));
    }
    let before = b.dropped();
    // The earlier incarnation's event, sent again: dropped (a replay where
    // it was seen, stale where it was not), never delivered.
    outsider
        .publish("dk.fleet.event", captured.payload.clone())
        .await
        .unwrap();
    outsider.flush().await.unwrap();
    eventually("the replay counted stale and replayed", || {
        let now = b.dropped();
        now.stale > before.stale && now.replayed > before.replayed
    })
    .await;
    again.publish(b"after").await.unwrap();
    for _ in 0..2 {
        let next = tokio::time::timeout(Duration::from_secs(20), delivered.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (next.payload.as_slice(), next.incarnation),
            (&b"after"[..], again.incarnation())
        );
    }
    for reader in readers {
        reader.abort();
    }
}
