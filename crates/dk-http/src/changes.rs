//! The person's changes (a grant, a revoke, an unpairing, an agent added,
//! removed or re-scoped), as the admin API and the console both make them:
//! each waits for the store's commit, so it runs on a blocking thread,
//! never on the async threads that serve the calls and requests meanwhile.

/// Runs `change` on a blocking thread and gives its result; an error when
/// the thread ended without one.
pub(crate) async fn on_blocking_thread<T: Send + 'static>(
    change: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(change)
        .await
        .map_err(|error| format!("the change did not finish: {error}"))
}
