//! End-to-end tests for dk live in `it/`; this library is empty.

#![forbid(unsafe_code)]
