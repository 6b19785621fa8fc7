//! Waiting for a place among an address's unauthenticated connections.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::Ordering;
use std::time::Duration;

use dk_policy::PolicySet;

use super::{ConnectionRefused, Vessel};
use crate::Limits;

const HERE: Option<IpAddr> = Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7)));
const THERE: Option<IpAddr> = Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 8)));

fn one_place() -> std::sync::Arc<Vessel> {
    Vessel::new(
        PolicySet::empty(),
        Limits {
            max_unauthenticated_per_address: 1,
            ..Limits::default()
        },
    )
}

#[tokio::test(start_paused = true)]
async fn a_connection_over_the_cap_waits_for_a_place_and_gets_it() {
    let vessel = one_place();
    let mut first = vessel.admit(HERE).unwrap();
    let waiter = {
        let vessel = vessel.clone();
        tokio::spawn(async move { vessel.admit_waiting(HERE, Duration::from_secs(5)).await })
    };
    // The paused clock a second on: long enough for a wait to end were it not held.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!waiter.is_finished(), "it waits while the place is taken");
    // Another address is not held up.
    drop(vessel.admit_waiting(THERE, Duration::ZERO).await.unwrap());
    first.authenticated();
    let second = waiter.await.unwrap().unwrap();
    assert_eq!(second.address(), HERE);
    assert_eq!(
        vessel.stats().refused_connections.load(Ordering::Relaxed),
        0
    );
    assert!(
        vessel.waiting.lock().unwrap().is_empty(),
        "no waiter is left behind"
    );
}

#[tokio::test(start_paused = true)]
async fn waiters_come_in_one_per_place_freed() {
    let vessel = one_place();
    let first = vessel.admit(HERE).unwrap();
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let vessel = vessel.clone();
            tokio::spawn(async move { vessel.admit_waiting(HERE, Duration::from_secs(60)).await })
        })
        .collect();
    // The paused clock on until every task waits.
    tokio::time::sleep(Duration::from_millis(10)).await;
    drop(first);
    // The paused clock on until every task waits.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let done: Vec<_> = waiters.iter().filter(|w| w.is_finished()).collect();
    assert_eq!(done.len(), 1, "one place freed, one waiter in");
    for waiter in waiters {
        // Each one in ends (its connection closes), letting the next in.
        let permit = waiter.await.unwrap().unwrap();
        drop(permit);
    }
}

#[tokio::test(start_paused = true)]
async fn a_waiter_is_refused_once_its_patience_is_spent() {
    let vessel = one_place();
    let _first = vessel.admit(HERE).unwrap();
    let started = tokio::time::Instant::now();
    let refused = vessel
        .admit_waiting(HERE, Duration::from_secs(2))
        .await
        .unwrap_err();
    assert_eq!(refused, ConnectionRefused::TooManyUnauthenticated);
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert_eq!(
        vessel.stats().refused_connections.load(Ordering::Relaxed),
        1
    );
    assert!(vessel.waiting.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn other_refusals_are_not_waited_on() {
    let vessel = Vessel::new(
        PolicySet::empty(),
        Limits {
            max_connections: 1,
            ..Limits::default()
        },
    );
    let _first = vessel.admit(HERE).unwrap();
    let started = tokio::time::Instant::now();
    let refused = vessel
        .admit_waiting(THERE, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert_eq!(refused, ConnectionRefused::TooMany);
    assert_eq!(started.elapsed(), Duration::ZERO);
}
