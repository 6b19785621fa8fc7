//! Limits on manifest text and size, as 8DK v1 sets them. Lengths are in
//! UTF-16 code units.

/// Device id.
pub const ID: usize = 24;
/// Device display name.
pub const NAME: usize = 80;
/// Device kind.
pub const KIND: usize = 40;
/// Device version.
pub const VERSION: usize = 40;
/// Capabilities per device.
pub const CAPABILITIES: usize = 32;
/// Capability name.
pub const CAPABILITY_NAME: usize = 30;
/// Capability description.
pub const CAPABILITY_DESCRIPTION: usize = 500;
/// Params per capability.
pub const PARAMS: usize = 16;
/// Param name.
pub const PARAM_NAME: usize = 30;
/// Param description.
pub const PARAM_DESCRIPTION: usize = 200;
/// Longest string value a call may pass for a string param, unless the
/// param declares a smaller `maxLength` (a dk extension).
pub const INPUT_STRING: usize = 1000;
/// Longest `maxLength` of a param declared `base64` (a dk extension):
/// 768 KiB of base64, 576 KiB of bytes, so that the call's frame stays
/// within a frame's 1 MiB.
pub const INPUT_BASE64: usize = 768 * 1024;
/// The dk manifest extension's limits: `UNIT`, `ENUM`, `TITLE`, `TOOL`,
/// `SCHEMA_BYTES`, `SCHEMA_DEPTH` and `EVENTS`.
pub use super::extension::{ENUM, EVENTS, SCHEMA_BYTES, SCHEMA_DEPTH, TITLE, TOOL, UNIT};
