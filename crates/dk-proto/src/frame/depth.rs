//! How deep arrays and objects nest in a JSON text, found in one pass over
//! its bytes before any parser runs.

/// True when arrays and objects in the JSON text `bytes` nest deeper than
/// `max` (an outermost object is depth 1). One pass, skipping string
/// contents; it runs before serde so a hostile frame cannot drive the
/// parser's recursion, and serves anyone who must know, before sending,
/// whether a value fits [`MAX_FRAME_DEPTH`](crate::MAX_FRAME_DEPTH).
pub fn nests_deeper_than(bytes: &[u8], max: usize) -> bool {
    // Depth cannot exceed the number of opening brackets: when there are few
    // (the usual frame), this vectorised count saves the exact pass.
    // `[` is 0x5B and `{` is 0x7B: one masked compare finds both. Each chunk
    // of at most 255 bytes is counted in a byte, so the loop runs sixteen
    // bytes to a vector instead of widening every byte to a word.
    let opening: usize = bytes
        .chunks(255)
        .map(|chunk| {
            let count = chunk
                .iter()
                .fold(0u8, |n, &b| n.wrapping_add(u8::from(b | 0x20 == b'{')));
            usize::from(count)
        })
        .sum();
    if opening <= max {
        return false;
    }
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in bytes {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}
