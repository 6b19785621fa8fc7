//! The reference lamp's manifest, from `fixtures/manifests/valid/`.

use serde_json::Value;

/// The reference lamp's manifest as its file spells it
/// (`fixtures/manifests/valid/desk-lamp.json`): id `desk-lamp`, with
/// `read_light`, `set_light` and `strobe`.
pub const LAMP_JSON: &str = include_str!("../../../fixtures/manifests/valid/desk-lamp.json");

/// The reference lamp's manifest as JSON, ready to send in a
/// `device:hello` or to pair.
#[must_use]
pub fn lamp() -> Value {
    #[expect(
        clippy::expect_used,
        reason = "the fixture is checked in and read by this crate's own test"
    )]
    serde_json::from_str(LAMP_JSON).expect("the lamp fixture is JSON")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lamp_is_the_desk_lamp_with_its_three_capabilities() {
        let lamp = lamp();
        assert_eq!(lamp["id"], "desk-lamp");
        let names: Vec<&str> = lamp["capabilities"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["name"].as_str())
            .collect();
        assert_eq!(names, ["read_light", "set_light", "strobe"]);
    }
}
