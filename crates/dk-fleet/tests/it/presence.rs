//! Presence: who holds which device, a goodbye forgotten at once (also
//! when a member leaves with its fleet shared by other tasks), a member
//! that stops beating forgotten after the expiry, a restart told as one,
//! and 10,000 devices of 24-character ids carried while every beat stays
//! a few bytes.

use std::time::{Duration, Instant};

use dk_fleet::PresenceChange;
use futures::StreamExt as _;

use crate::harness::{Nats, all_present, eventually, member, nats_or_skip, options};

#[tokio::test]
async fn holders_are_seen_and_forgotten() {
    let Some(binary) = nats_or_skip("holders_are_seen_and_forgotten") else {
        return;
    };
    let nats = Nats::start(binary, "");
    let a = std::sync::Arc::new(member(&nats, "a").await);
    // b forgets a silent member after 2 s, so a goodbye seen well before
    // is told apart from expiry even on a busy machine.
    let b = dk_fleet::Fleet::connect(
        options(&nats, "b").presence(Duration::from_millis(100), Duration::from_secs(2)),
    )
    .await
    .unwrap();
    let mut changes = b.presence_changes();
    let c = member(&nats, "c").await;
    a.announce(["lamp", "lock"]).unwrap();
    c.announce(["fan"]).unwrap();
    assert_eq!(a.holder_of("lamp"), Some(a.member().clone()));
    eventually("b sees a's lamp", || {
        b.holder_of("lamp").as_ref() == Some(a.member())
    })
    .await;
    eventually("b sees c's fan", || {
        b.holder_of("fan").as_ref() == Some(c.member())
    })
    .await;
    assert_eq!(b.holder_of("door"), None);
    assert_eq!(b.members(), vec![a.member().clone(), c.member().clone()]);

    // A change is said at once, not at the next beat.
    a.announce(["lamp"]).unwrap();
    eventually("b sees the lock gone", || b.holder_of("lock").is_none()).await;

    // A clean stop says goodbye, even while another task holds the fleet:
    // forgotten well before the expiry.
    // (Told as a goodbye below, not as silence.)
    let held_elsewhere = std::sync::Arc::clone(&a);
    a.leave().await.unwrap();
    eventually("b forgets a", || b.holder_of("lamp").is_none()).await;
    drop(held_elsewhere);

    // A member that vanishes without a word expires, and not before the
    // expiry.
    let dropped = Instant::now();
    drop(c);
    eventually("b forgets c", || b.holder_of("fan").is_none()).await;
    let forgotten = Instant::now();
    assert!(forgotten >= dropped + Duration::from_secs(1));
    assert!(b.members().is_empty());
    // What b was told, in order: a and c joined, a said goodbye, c went silent.
    let mut told = Vec::new();
    while let Ok(change) = changes.try_recv() {
        told.push(match change {
            PresenceChange::Joined { member, .. } => format!("joined {member}"),
            PresenceChange::Restarted { member, .. } => format!("restarted {member}"),
            PresenceChange::Left {
                member, goodbye, ..
            } => {
                format!(
                    "left {member} {}",
                    if goodbye { "goodbye" } else { "silent" }
                )
            }
        });
    }
    told.sort();
    assert_eq!(
        told,
        ["joined a", "joined c", "left a goodbye", "left c silent"]
    );
    b.leave().await.unwrap();
}

#[tokio::test]
async fn a_restart_is_told_and_the_devices_follow() {
    let Some(binary) = nats_or_skip("a_restart_is_told_and_the_devices_follow") else {
        return;
    };
    let nats = Nats::start(binary, "");
    let b = member(&nats, "b").await;
    let mut changes = b.presence_changes();
    let first = member(&nats, "a").await;
    first.announce(["lamp"]).unwrap();
    eventually("b sees the lamp", || b.holder_of("lamp").is_some()).await;
    let was = first.incarnation();
    // Killed without a goodbye, and started again at once with other devices.
    drop(first);
    let again = member(&nats, "a").await;
    again.announce(["door"]).unwrap();
    all_present(&[&again, &b]).await;
    eventually("b sees the door", || b.holder_of("door").is_some()).await;
    assert_eq!(b.holder_of("lamp"), None);
    let mut restarted = false;
    while let Ok(change) = changes.try_recv() {
        if let PresenceChange::Restarted {
            incarnation,
            was: before,
            ..
        } = change
        {
            assert_eq!((incarnation, before), (again.incarnation(), was));
            restarted = true;
        }
    }
    assert!(restarted);
}

#[tokio::test]
async fn ten_thousand_devices_are_carried_and_beats_stay_small() {
    let Some(binary) = nats_or_skip("ten_thousand_devices_are_carried_and_beats_stay_small") else {
        return;
    };
    let nats = Nats::start(binary, "");
    let listener = async_nats::connect(nats.url()).await.unwrap();
    let mut presence = listener.subscribe("dk.fleet.presence").await.unwrap();
    listener.flush().await.unwrap();
    let a = member(&nats, "a").await;
    let b = member(&nats, "b").await;
    // 24-character ids: 10,000 of them are about 270 KB as a list.
    let ids: Vec<String> = (0..10_000)
        .map(|n| format!("thermostat-room-{n:08}"))
        .collect();
    assert!(ids.iter().all(|id| id.len() == 24));
    a.announce(ids.clone()).unwrap();
    eventually("b sees all 10,000", || {
        b.seen().first().is_some_and(|s| s.devices == 10_000)
    })
    .await;
    assert!(
        ids.iter()
            .all(|id| b.holder_of(id).as_ref() == Some(a.member()))
    );
    // A member joining late reads the whole set at once (asked, not beaten).
    let late = member(&nats, "late").await;
    eventually("late sees all 10,000", || {
        late.seen()
            .iter()
            .any(|s| s.member == *a.member() && s.devices == 10_000)
    })
    .await;
    // Every beat is small; only deltas carry ids, each within the limit.
    let until = tokio::time::Instant::now() + Duration::from_millis(500);
    let mut beats = 0;
    while let Ok(Some(message)) = tokio::time::timeout_at(until, presence.next()).await {
        assert!(message.payload.len() <= 1024 * 1024);
        if message.payload.len() < 256 {
            beats += 1;
        }
    }
    assert!(beats > 0);
}
