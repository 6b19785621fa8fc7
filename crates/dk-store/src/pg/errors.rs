//! PostgreSQL's errors as the store's ([`StoreError`]), and the checked
//! reads of a row's columns.

use std::time::Duration;

use deadpool_postgres::PoolError;
use tokio_postgres::Row;
use tokio_postgres::types::FromSql;

use crate::{Cause, StoreError};

/// An error of the driver, its text with the texts of its sources (the
/// driver's own text is often only "db error"), and itself kept as the
/// source.
#[derive(Debug)]
pub(super) struct PgError {
    text: String,
    error: Box<dyn std::error::Error + Send + Sync + 'static>,
}

impl PgError {
    pub(super) fn new(
        context: &str,
        error: impl std::error::Error + Send + Sync + 'static,
    ) -> PgError {
        let mut text = context.to_owned();
        let mut next: Option<&dyn std::error::Error> = Some(&error);
        while let Some(error) = next {
            let said = error.to_string();
            if !text.ends_with(&said) {
                if !text.is_empty() {
                    text.push_str(": ");
                }
                text.push_str(&said);
            }
            next = error.source();
        }
        PgError {
            text,
            error: Box::new(error),
        }
    }
}

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for PgError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.error)
    }
}

/// The database's error as a [`StoreError::Database`].
pub(super) fn db(error: tokio_postgres::Error) -> StoreError {
    StoreError::Database(Cause::new(PgError::new("", error)))
}

/// The pool's error: the server could not be reached in time.
pub(super) fn unreachable(error: PoolError) -> StoreError {
    StoreError::Database(Cause::new(PgError::new(
        "cannot reach the PostgreSQL server",
        error,
    )))
}

/// The error of an operation that did not finish within `timeout`.
pub(super) fn unanswered(timeout: Duration) -> StoreError {
    StoreError::Database(Cause::msg(format!(
        "the PostgreSQL server did not answer within {} ms",
        timeout.as_millis()
    )))
}

/// The error of an operation sent to a store whose thread is gone.
pub(super) fn stopped() -> StoreError {
    StoreError::Database(Cause::msg("the PostgreSQL store's thread has stopped"))
}

/// Column `at` of `row`, a wrong type being a corrupt store.
pub(super) fn get<'a, T: FromSql<'a>>(row: &'a Row, at: usize) -> Result<T, StoreError> {
    row.try_get(at)
        .map_err(|error| StoreError::Corrupt(PgError::new("", error).to_string()))
}

pub(super) fn unsigned(value: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::Corrupt(format!("{what} is {value}")))
}

pub(super) fn hash32(
    bytes: Vec<u8>,
    what: impl FnOnce() -> String,
) -> Result<[u8; 32], StoreError> {
    let len = bytes.len();
    <[u8; 32]>::try_from(bytes)
        .map_err(|_| StoreError::Corrupt(format!("{} is {len} bytes, not 32", what())))
}
