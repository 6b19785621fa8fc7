//! Tests of the device module.
