//! The store's thread: a current-thread runtime that runs each job
//! ([`Job`]) it is sent against the pool, until the sender is dropped.

use std::future::Future;
use std::pin::Pin;
use std::thread::JoinHandle;

use deadpool_postgres::Pool;

/// An operation for the store's thread: given the pool, the task to run.
pub(super) type Job = Box<dyn FnOnce(Pool) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// Starts the store's thread: a current-thread runtime that runs each job
/// sent to it as a task of its own, with the pool, until the queue closes.
pub(super) fn drive(
    pool: Pool,
) -> std::io::Result<(tokio::sync::mpsc::UnboundedSender<Job>, JoinHandle<()>)> {
    let (jobs, mut queue) = tokio::sync::mpsc::unbounded_channel::<Job>();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()?;
    let thread = std::thread::Builder::new()
        .name("dk-store-pg".to_owned())
        .spawn(move || {
            runtime.block_on(async move {
                let mut tasks = tokio::task::JoinSet::new();
                while let Some(job) = queue.recv().await {
                    while tasks.try_join_next().is_some() {}
                    tasks.spawn(job(pool.clone()));
                }
                while tasks.join_next().await.is_some() {}
                pool.close();
            });
        })?;
    Ok((jobs, thread))
}
