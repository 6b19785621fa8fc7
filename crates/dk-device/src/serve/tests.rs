//! Tests of the serve module.
