//! SQLite's errors as [`StoreError`]s, corruption told apart, and the
//! checked reads of a column's number or hash.

use rusqlite::ErrorCode;

use crate::{Cause, StoreError};

/// The database's error, kept as the [`StoreError::Database`]'s source;
/// corruption is told apart (as text, like every [`StoreError::Corrupt`]).
pub(super) fn db(error: rusqlite::Error) -> StoreError {
    match &error {
        rusqlite::Error::InvalidColumnType(..)
        | rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::IntegralValueOutOfRange(..) => StoreError::Corrupt(error.to_string()),
        _ => match error.sqlite_error_code() {
            Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => {
                StoreError::Corrupt(error.to_string())
            }
            Some(ErrorCode::DiskFull) => StoreError::DiskFull(Cause::new(error)),
            _ => StoreError::Database(Cause::new(error)),
        },
    }
}

pub(super) fn unsigned(value: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::Corrupt(format!("{what} is {value}")))
}

/// A 32-byte hash read from a column, or corruption naming `what`.
pub(super) fn hash32(
    bytes: Vec<u8>,
    what: impl FnOnce() -> String,
) -> Result<[u8; 32], StoreError> {
    let len = bytes.len();
    <[u8; 32]>::try_from(bytes)
        .map_err(|_| StoreError::Corrupt(format!("{} is {len} bytes, not 32", what())))
}
