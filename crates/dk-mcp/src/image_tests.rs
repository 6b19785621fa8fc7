//! Tests of image results: what is an image (a PNG or JPEG in standard
//! base64, as the result's own `image` member), what the rest of the result
//! becomes, and what merely looks like an image and stays JSON.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value, json};

use super::image::split_image;

/// A 2x1 PNG: a red pixel, then a blue one.
pub(crate) const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR\0\0\0\x02\0\0\0\x01\x08\x02\0\0\0\x7b\x40\xe8\xdd\0\0\0\x0dIDAT\x78\xda\x63\xf8\xcf\x00\x04\xff\x01\x07\x00\x01\xff\x3d\x7d\x8c\x49\0\0\0\0IEND\xae\x42\x60\x82";

/// A JPEG's first bytes (start of image, then an APP0 marker).
const JPEG: &[u8] = b"\xff\xd8\xff\xe0\0\x10JFIF\0";

fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

/// `result` is an image result: its data, type and what remains.
#[track_caller]
fn image(result: Value, mime_type: &str, data: &str, described: Value) {
    let split = split_image(object(result)).unwrap();
    assert_eq!(split.mime_type, mime_type);
    assert_eq!(split.data, data);
    assert_eq!(Value::Object(split.described), described);
}

/// `result` stays ordinary JSON, untouched.
#[track_caller]
fn not_image(result: Value) {
    assert_eq!(split_image(object(result.clone())), Err(object(result)));
}

#[test]
fn a_png_or_jpeg_member_is_an_image_and_the_rest_says_its_length() {
    let png = STANDARD.encode(PNG);
    image(
        json!({"width": 2, "height": 1, "image": {"type": "image", "mimeType": "image/png", "data": png}, "blacked_out": 0}),
        "image/png",
        &png,
        json!({"width": 2, "height": 1, "image": {"type": "image", "mimeType": "image/png", "bytes": PNG.len()}, "blacked_out": 0}),
    );
    let jpeg = STANDARD.encode(JPEG);
    image(
        json!({"image": {"data": jpeg, "mimeType": "image/jpeg", "type": "image"}}),
        "image/jpeg",
        &jpeg,
        json!({"image": {"type": "image", "mimeType": "image/jpeg", "bytes": JPEG.len()}}),
    );
}

#[test]
fn the_image_keeps_its_place_among_the_members() {
    let png = STANDARD.encode(PNG);
    let split = split_image(object(
        json!({"z": 1, "image": {"type": "image", "mimeType": "image/png", "data": png}, "a": 2}),
    ))
    .unwrap();
    let keys: Vec<&str> = split.described.keys().map(String::as_str).collect();
    assert_eq!(keys, ["z", "image", "a"]);
    assert_eq!(
        Value::Object(split.described).to_string(),
        format!(
            r#"{{"z":1,"image":{{"type":"image","mimeType":"image/png","bytes":{}}},"a":2}}"#,
            PNG.len()
        )
    );
}

#[test]
fn what_merely_looks_like_an_image_stays_json() {
    let png = STANDARD.encode(PNG);
    let jpeg = STANDARD.encode(JPEG);
    let unpadded = png.trim_end_matches('=');
    assert_ne!(unpadded, png, "the fixture's base64 ends in padding");
    for result in [
        // No image member, or not an object.
        json!({"width": 1}),
        json!({"image": png}),
        json!({"image": null}),
        // Bad base64: unpadded, URL-safe alphabet, white space, not base64.
        json!({"image": {"type": "image", "mimeType": "image/png", "data": unpadded}}),
        json!({"image": {"type": "image", "mimeType": "image/png", "data": png.replace('+', "-").replace('/', "_") + "-_"}}),
        json!({"image": {"type": "image", "mimeType": "image/png", "data": format!("{}\n{}", &png[..8], &png[8..])}}),
        json!({"image": {"type": "image", "mimeType": "image/png", "data": "not base64!"}}),
        json!({"image": {"type": "image", "mimeType": "image/png", "data": ""}}),
        // Wrong signature for the type, or no format's.
        json!({"image": {"type": "image", "mimeType": "image/png", "data": jpeg}}),
        json!({"image": {"type": "image", "mimeType": "image/jpeg", "data": png}}),
        json!({"image": {"type": "image", "mimeType": "image/png", "data": STANDARD.encode(b"GIF89a")}}),
        // An unknown or differently spelt type.
        json!({"image": {"type": "image", "mimeType": "image/gif", "data": png}}),
        json!({"image": {"type": "image", "mimeType": "IMAGE/PNG", "data": png}}),
        json!({"image": {"type": "image", "mimeType": "image/svg+xml", "data": png}}),
        json!({"image": {"type": "audio", "mimeType": "image/png", "data": png}}),
        json!({"image": {"mimeType": "image/png", "data": png}}),
        json!({"image": {"type": "image", "data": png}}),
        json!({"image": {"type": "image", "mimeType": "image/png"}}),
        json!({"image": {"type": "image", "mimeType": "image/png", "data": 12}}),
        // A member more.
        json!({"image": {"type": "image", "mimeType": "image/png", "data": png, "bytes": 3}}),
        // Nested one level deeper, or under another name.
        json!({"screen": {"image": {"type": "image", "mimeType": "image/png", "data": png}}}),
        json!({"picture": {"type": "image", "mimeType": "image/png", "data": png}}),
        json!({"result": [{"type": "image", "mimeType": "image/png", "data": png}]}),
    ] {
        not_image(result);
    }
}
