//! Waiting for something another task does: poll a check until it holds,
//! looking often at first and less often as the wait goes on, failing the
//! test past one generous ceiling. Never a fixed sleep followed by an
//! assertion.

use std::future::Future;
use std::time::{Duration, Instant};

/// How long a wait lasts before it fails the test: long enough for
/// anything on loopback on a loaded machine; only something broken waits
/// it out.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// The first pause between two looks, short so that a wait for something
/// about to happen ends soon after it does.
const FIRST_POLL: Duration = Duration::from_millis(1);

/// The longest pause between two looks: a long wait (a process starting, a
/// check that runs a command) does not keep the machine busy looking.
const LAST_POLL: Duration = Duration::from_millis(50);

/// The pause after `pause`: twice as long, up to [`LAST_POLL`].
fn next_poll(pause: Duration) -> Duration {
    (pause * 2).min(LAST_POLL)
}

/// Waits until `check` holds, looking every few milliseconds; fails the
/// test, naming `what`, once [`PATIENCE`] is over.
///
/// The ceiling is measured on the system clock, so a test running on
/// tokio's paused clock still fails instead of hanging.
pub async fn eventually(what: &str, check: impl FnMut() -> bool) {
    eventually_within(what, PATIENCE, check).await;
}

/// [`eventually`] with its own ceiling, for a wait known to be longer than
/// most (a program under valgrind, a large log verified).
pub async fn eventually_within(what: &str, patience: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + patience;
    let mut pause = FIRST_POLL;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(pause).await;
        pause = next_poll(pause);
    }
}

/// [`eventually`] on this thread, for a test without a runtime (a store's,
/// a writer thread's): sleeps between looks.
pub fn eventually_blocking(what: &str, check: impl FnMut() -> bool) {
    eventually_blocking_within(what, PATIENCE, check);
}

/// [`eventually_blocking`] with its own ceiling.
pub fn eventually_blocking_within(what: &str, patience: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + patience;
    let mut pause = FIRST_POLL;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(pause);
        pause = next_poll(pause);
    }
}

/// [`eventually_some`] on this thread, for a test without a runtime.
pub fn eventually_blocking_some<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let mut found = None;
    eventually_blocking(what, || {
        found = check();
        found.is_some()
    });
    #[expect(
        clippy::expect_used,
        reason = "the wait above ends only once a value was found"
    )]
    found.expect("a value was found")
}

/// Waits until `check` gives a value, which it returns; fails the test,
/// naming `what`, once [`PATIENCE`] is over.
pub async fn eventually_some<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let mut found = None;
    eventually(what, || {
        found = check();
        found.is_some()
    })
    .await;
    #[expect(
        clippy::expect_used,
        reason = "the wait above ends only once a value was found"
    )]
    found.expect("a value was found")
}

/// [`eventually_some`] for a check that awaits (an HTTP request, a query).
pub async fn eventually_async<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + PATIENCE;
    let mut pause = FIRST_POLL;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(pause).await;
        pause = next_poll(pause);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test]
    async fn a_wait_ends_when_another_task_makes_the_check_hold() {
        let count = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&count);
        let task = tokio::spawn(async move {
            for _ in 0..3 {
                tokio::task::yield_now().await;
                counter.fetch_add(1, Ordering::SeqCst);
            }
        });
        eventually("three counts", || count.load(Ordering::SeqCst) == 3).await;
        let got = eventually_some("the count", || {
            let n = count.load(Ordering::SeqCst);
            (n == 3).then_some(n)
        })
        .await;
        assert_eq!(got, 3);
        let counted = Arc::clone(&count);
        std::thread::spawn(move || {
            eventually_blocking("three counts, on a thread", || {
                counted.load(Ordering::SeqCst) == 3
            });
        })
        .join()
        .unwrap();
        let got = eventually_async("the count", || async {
            let n = count.load(Ordering::SeqCst);
            (n == 3).then_some(n)
        })
        .await;
        assert_eq!(got, 3);
        task.await.unwrap();
    }

    #[test]
    fn the_pause_doubles_up_to_its_longest() {
        let mut pauses = vec![FIRST_POLL];
        for _ in 0..7 {
            pauses.push(next_poll(*pauses.last().unwrap()));
        }
        let ms: Vec<u128> = pauses.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [1, 2, 4, 8, 16, 32, 50, 50]);
    }

    #[tokio::test]
    async fn a_check_that_never_holds_fails_the_wait_naming_it() {
        let waiting = tokio::spawn(async {
            eventually_within("the impossible", Duration::from_millis(20), || false).await;
        });
        let failed = waiting.await.unwrap_err().into_panic();
        assert_eq!(
            failed.downcast_ref::<String>().map(String::as_str),
            Some("timed out waiting for the impossible")
        );
    }
}
