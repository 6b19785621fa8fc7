//! Reading the whole store in pages ([`Pages`]): each page a bounded
//! number of rows and bytes, all of them in one snapshot.

use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use tokio_postgres::{IsolationLevel, Row};

use super::chain::recorded_key;
use super::errors::{db, get, stopped, unanswered, unreachable};
use super::queries::{read_agents, read_pairings};
use super::thread::Job;
use crate::audit::RawRow;
use crate::{StoreError, StoredAgent, StoredPairing};

/// A read-only transaction on the store's thread that answers the
/// state first, then a page of the log for each page asked for, until
/// the [`Pages`] is dropped. Each answer comes within the store's
/// timeout or is an error.
pub(super) fn read_pages(
    jobs: Option<&tokio::sync::mpsc::UnboundedSender<Job>>,
    timeout: Duration,
    page_bytes: usize,
) -> Result<Pages, StoreError> {
    let (asks, mut asked) = tokio::sync::mpsc::unbounded_channel::<(i64, i64)>();
    let (answer, answers) = std_mpsc::sync_channel::<Result<Read, StoreError>>(1);
    let job: Job = Box::new(move |pool| {
        Box::pin(async move {
            // One answer at a time is asked for: the channel always has
            // room, and the store's thread never waits on it.
            let said = |read: Result<Read, StoreError>| answer.try_send(read).is_ok();
            let read = async {
                let mut client =
                    within(timeout, async { pool.get().await.map_err(unreachable) }).await?;
                let tx = within(timeout, async {
                    client
                        .build_transaction()
                        .isolation_level(IsolationLevel::RepeatableRead)
                        .read_only(true)
                        .start()
                        .await
                        .map_err(db)
                })
                .await?;
                let state = within(timeout, async {
                    Ok(Read::State(
                        recorded_key(tx.client()).await?,
                        read_pairings(tx.client(), None).await?,
                        read_agents(tx.client()).await?,
                    ))
                })
                .await?;
                if !said(Ok(state)) {
                    return Ok(());
                }
                while let Some((after, limit)) = asked.recv().await {
                    let page = within(timeout, async {
                        let rows = tx
                            .query(
                                "SELECT seq, at_ms, kind, entry, prev_hash, hash FROM audit
                                 WHERE seq > $1 ORDER BY seq LIMIT $2",
                                &[&after, &limit],
                            )
                            .await
                            .map_err(db)?;
                        rows.iter().map(raw_row).collect::<Result<Vec<_>, _>>()
                    })
                    .await;
                    let failed = page.is_err();
                    if !said(page.map(Read::Page)) || failed {
                        return Ok(());
                    }
                }
                within(timeout, async { tx.commit().await.map_err(db) }).await
            };
            if let Err(error) = read.await {
                said(Err(error));
            }
        })
    });
    let jobs = jobs.ok_or_else(stopped)?;
    jobs.send(job).map_err(|_| stopped())?;
    Ok(Pages {
        asks,
        answers,
        timeout,
        page_bytes,
    })
}

/// How many entries a verification reads first; then as many as make
/// about [`PAGE_BYTES`], from 16 to [`MOST_PER_PAGE`].
pub(super) const FIRST_PAGE: i64 = 1_000;

/// About how many bytes of entries a verification holds at a time.
pub(super) const PAGE_BYTES: usize = 4 << 20;

/// The most entries a verification reads at a time.
pub(super) const MOST_PER_PAGE: i64 = 10_000;

/// What a row costs beside its entry's text (hashes, kind, numbers).
pub(super) const ROW_BYTES: usize = 200;

/// `work`, given at most `timeout`.
pub(super) async fn within<T>(
    timeout: Duration,
    work: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(timeout, work)
        .await
        .unwrap_or_else(|_| Err(unanswered(timeout)))
}

/// What a paged read answers: the state (the chain's recorded key, the
/// pairings, the agents), then pages of the log.
pub(super) enum Read {
    State(Option<(i64, String)>, Vec<StoredPairing>, Vec<StoredAgent>),
    Page(Vec<RawRow>),
}

/// The log and the state of one read-only transaction on the store's
/// thread ([`read_pages`]), read a page at a time.
pub(super) struct Pages {
    pub(super) asks: tokio::sync::mpsc::UnboundedSender<(i64, i64)>,
    pub(super) answers: std_mpsc::Receiver<Result<Read, StoreError>>,
    pub(super) timeout: Duration,
    pub(super) page_bytes: usize,
}

/// The state a [`Pages`] answers first.
pub(super) type State = (Option<(i64, String)>, Vec<StoredPairing>, Vec<StoredAgent>);

impl Pages {
    /// The next answer, waited for a little longer than the store's
    /// thread gives it.
    pub(super) fn next(&self) -> Result<Read, StoreError> {
        match self
            .answers
            .recv_timeout(self.timeout.saturating_add(Duration::from_secs(1)))
        {
            Ok(read) => read,
            Err(std_mpsc::RecvTimeoutError::Timeout) => Err(unanswered(self.timeout)),
            Err(std_mpsc::RecvTimeoutError::Disconnected) => Err(stopped()),
        }
    }

    /// The state, the first answer.
    pub(super) fn state(&self) -> Result<State, StoreError> {
        match self.next()? {
            Read::State(recorded, pairings, agents) => Ok((recorded, pairings, agents)),
            Read::Page(_) => Err(StoreError::Corrupt(
                "a page of the log came before the state".to_owned(),
            )),
        }
    }

    /// Gives every entry of the log to `take`, in stored order, a page at
    /// a time.
    pub(super) fn each(&self, take: &mut dyn FnMut(RawRow)) -> Result<(), StoreError> {
        let mut after = i64::MIN;
        let mut limit = FIRST_PAGE;
        loop {
            self.asks.send((after, limit)).map_err(|_| stopped())?;
            let page = match self.next()? {
                Read::Page(page) => page,
                Read::State(..) => {
                    return Err(StoreError::Corrupt(
                        "the state came again instead of a page of the log".to_owned(),
                    ));
                }
            };
            let Some(last) = page.last() else {
                return Ok(());
            };
            after = last.seq;
            let rows = page.len();
            let bytes: usize = page.iter().map(|row| row.entry.len() + ROW_BYTES).sum();
            let asked = limit;
            limit = i64::try_from(self.page_bytes.saturating_mul(rows) / bytes.max(1))
                .unwrap_or(MOST_PER_PAGE)
                .clamp(16, MOST_PER_PAGE);
            for row in page {
                take(row);
            }
            if i64::try_from(rows).unwrap_or(i64::MAX) < asked {
                return Ok(());
            }
        }
    }
}

pub(super) fn raw_row(row: &Row) -> Result<RawRow, StoreError> {
    Ok(RawRow {
        seq: get(row, 0)?,
        at_ms: get(row, 1)?,
        kind: get(row, 2)?,
        entry: get(row, 3)?,
        prev_hash: get(row, 4)?,
        hash: get(row, 5)?,
    })
}
