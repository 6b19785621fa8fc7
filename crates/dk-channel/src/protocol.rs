//! The constants of dk/2 both sides and any other implementation agree on.

/// The WebSocket subprotocol a dk/2 device asks for and a dk/2 vessel
/// answers with (`Sec-WebSocket-Protocol: dk.2`).
pub const SUBPROTOCOL: &str = "dk.2";

/// The Noise prologue: the four ASCII bytes `dk/2`, mixed into the
/// handshake hash by both sides.
pub const PROLOGUE: &[u8] = b"dk/2";

/// The Noise protocol name, fixed so that a device written with another
/// Noise library interoperates.
pub const NOISE_PATTERN: &str = "Noise_XX_25519_ChaChaPoly_SHA256";

/// The largest Noise message, its 16-byte tag included; a longer WebSocket
/// message after the handshake is a channel failure.
pub const MAX_MESSAGE: usize = 65_535;

/// The most frame bytes one record carries: [`MAX_MESSAGE`] less the tag
/// and the header byte.
pub const MAX_PIECE: usize = MAX_MESSAGE - TAG_LEN - 1;

/// The exact lengths of the three handshake messages (their payloads are
/// empty): `e`; `e, ee, s, es`; `s, se`.
pub const HANDSHAKE_LENGTHS: [usize; 3] = [32, 96, 64];

/// The length of a ChaChaPoly tag.
pub(crate) const TAG_LEN: usize = 16;
