//! End-to-end tests for dk live in `it/`; this library is empty.
