//! A NATS client without the fleet key, subscribed to everything: it reads
//! none of what members say, and what it forges, replays or oversizes is
//! dropped and counted, never delivered.

use std::time::{Duration, Instant};

use futures::StreamExt as _;

use crate::harness::{Nats, all_present, eventually, member, nats_or_skip};

const MARK: &[u8] = b"marked-input-7f3a";

#[tokio::test]
async fn an_outsider_reads_nothing_and_injects_nothing() {
    let Some(binary) = nats_or_skip("an_outsider_reads_nothing_and_injects_nothing") else {
        return;
    };
    let nats = Nats::start(binary, "");
    let outsider = async_nats::connect(nats.url()).await.unwrap();
    let mut everything = outsider.subscribe(">").await.unwrap();
    outsider.flush().await.unwrap();

    let a = member(&nats, "a").await;
    let b = member(&nats, "b").await;
    let mut served = b.serve().await.unwrap();
    let mut events = b.events().await.unwrap();
    let soon = || Instant::now() + Duration::from_secs(30);
    all_present(&[&a, &b]).await;

    // Members speak with the mark in requests, replies, events and presence.
    let ask = a.request(b.member(), MARK, soon());
    let answer = async {
        let request = served.next().await.unwrap();
        assert_eq!(request.payload(), MARK);
        request.respond(MARK).await.unwrap();
    };
    let (reply, ()) = tokio::join!(ask, answer);
    assert_eq!(reply.unwrap(), MARK);
    a.publish(MARK).await.unwrap();
    assert_eq!(events.next().await.unwrap().payload, MARK);
    a.announce([String::from_utf8_lossy(MARK).into_owned()])
        .unwrap();
    eventually("b sees the marked device", || {
        b.holder_of(&String::from_utf8_lossy(MARK)).is_some()
    })
    .await;

    // The outsider saw every message, and the mark in none.
    let mut seen = Vec::new();
    // Presence beats go on, so the outsider listens for a fixed while.
    let until = tokio::time::Instant::now() + Duration::from_millis(300);
    while let Ok(Some(message)) = tokio::time::timeout_at(until, everything.next()).await {
        seen.push(message);
    }
    let request_subject = format!("dk.fleet.request.{}", b.member());
    let event = seen
        .iter()
        .find(|m| m.subject.as_str() == "dk.fleet.event")
        .unwrap()
        .clone();
    let request = seen
        .iter()
        .find(|m| m.subject.as_str() == request_subject)
        .unwrap()
        .clone();
    assert!(seen.len() >= 4, "{} messages", seen.len());
    for message in &seen {
        assert!(
            !message.payload.windows(MARK.len()).any(|w| w == MARK),
            "plaintext on {}",
            message.subject
        );
    }

    // Forged messages: dropped and counted, never delivered.
    let before = b.dropped();
    outsider
        .publish("dk.fleet.event", MARK.to_vec().into())
        .await
        .unwrap();
    outsider
        .publish_with_reply(
            request_subject.clone(),
            "_INBOX.outsider",
            MARK.to_vec().into(),
        )
        .await
        .unwrap();
    let mut forged_event = event.payload.to_vec();
    if let Some(last) = forged_event.last_mut() {
        *last ^= 1;
    }
    outsider
        .publish("dk.fleet.event", forged_event.into())
        .await
        .unwrap();
    // A sealed event moved to another subject does not open there.
    outsider
        .publish("dk.fleet.presence", event.payload.clone())
        .await
        .unwrap();
    // Replays of what members sent: the event, and the request with its reply.
    outsider
        .publish("dk.fleet.event", event.payload.clone())
        .await
        .unwrap();
    outsider
        .publish_with_reply(
            request_subject,
            request.reply.clone().unwrap(),
            request.payload.clone(),
        )
        .await
        .unwrap();
    // Junk of another layout: not read.
    outsider
        .publish("dk.fleet.event", vec![1u8; 70 * 1024].into())
        .await
        .unwrap();
    // A round trip: the server has taken all of the outsider's messages
    // before a's next one (it keeps one connection's order, not two's).
    let inbox = outsider.new_inbox();
    let mut back = outsider.subscribe(inbox.clone()).await.unwrap();
    outsider.publish(inbox, Vec::new().into()).await.unwrap();
    back.next().await.unwrap();

    // Nothing of it is delivered: the next event b sees is a's, and no
    // request comes. (Reading on is what drops and counts them.)
    a.publish(b"after").await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(2), events.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(next.payload, b"after");
    // The next request b serves is a's, sent after all of the outsider's.
    let ask = a.request(b.member(), b"after", soon());
    let answer = async {
        let request = served.next().await.unwrap();
        assert_eq!(request.payload(), b"after");
        request.respond(b"ok").await.unwrap();
    };
    let (reply, ()) = tokio::join!(ask, answer);
    assert_eq!(reply.unwrap(), b"ok");
    eventually("the outsider's messages counted", || {
        let now = b.dropped();
        now.forged >= before.forged + 4
            && now.replayed >= before.replayed + 2
            && now.other_version > before.other_version
    })
    .await;
    eprintln!("dropped at b: {:?}", b.dropped());
}
