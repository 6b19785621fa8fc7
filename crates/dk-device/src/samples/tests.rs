//! Tests of the samples module.
