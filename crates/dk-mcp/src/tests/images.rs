//! Image results over real sockets, with rmcp's client as the agent: a
//! device result carrying a PNG arrives as image content with the same
//! bytes, followed by the result's JSON with the data replaced by its
//! length, in both lifecycles; a screenshot-sized image arrives whole while
//! only its short text is paged; a result that merely looks like an image
//! stays JSON.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use rmcp::model::ContentBlock;

use super::*;
use crate::image_tests::PNG;

const READ: &str = "device__desk_lamp__read_light";

/// A device that answers every call with the same result.
struct Fixed(Value);

impl DeviceLink for Fixed {
    fn invoke<'a>(
        &'a self,
        _capability: &'a str,
        _input: &'a Map<String, Value>,
        _timeout: Duration,
    ) -> BoxFuture<'a, InvokeResult> {
        let result = RawValue::from_string(self.0.to_string()).unwrap();
        async move { Ok(Some(result)) }.boxed()
    }
}

/// The lamp, its `read_light` granted, answering every call with `result`.
async fn vessel_answering(result: Value) -> Arc<Vessel> {
    let vessel = vessel_with_lamp(&["read_light"]).await;
    vessel.links().connect("desk-lamp", Arc::new(Fixed(result)));
    vessel
}

fn screenshot(bytes: &[u8]) -> Value {
    json!({
        "width": 2,
        "height": 1,
        "image": {"type": "image", "mimeType": "image/png", "data": STANDARD.encode(bytes)},
        "blacked_out": 0
    })
}

fn described(bytes: usize) -> Value {
    json!({
        "width": 2,
        "height": 1,
        "image": {"type": "image", "mimeType": "image/png", "bytes": bytes},
        "blacked_out": 0
    })
}

/// The image a result carries first: its MIME type and decoded bytes.
#[track_caller]
fn image_of(result: &CallToolResult) -> (String, Vec<u8>) {
    let Some(ContentBlock::Image(image)) = result.content.first() else {
        panic!("no image first: {result:?}");
    };
    (
        image.mime_type.clone(),
        STANDARD.decode(&image.data).unwrap(),
    )
}

/// The text block after the image, as JSON.
#[track_caller]
fn text_after_image(result: &CallToolResult) -> Value {
    assert_eq!(result.content.len(), 2, "{result:?}");
    let text = result.content[1].as_text().unwrap();
    serde_json::from_str(&text.text).unwrap()
}

#[tokio::test]
async fn a_png_result_arrives_as_image_content_with_the_same_bytes_in_both_lifecycles() {
    let vessel = vessel_answering(screenshot(PNG)).await;
    let (agents, credential) = agents_with("main", AgentScope::AllDevices, AgentRole::User);
    let server = serve(&vessel, &agents).await;
    let (client, _) = connect(&server.url, &credential).await;
    let discover = connect_discover(&server.url, &credential).await;
    for result in [
        call(&client, READ, json!({})).await,
        call(&discover, READ, json!({})).await,
    ] {
        assert_eq!(result.is_error, Some(false));
        assert_eq!(image_of(&result), ("image/png".to_owned(), PNG.to_vec()));
        assert_eq!(text_after_image(&result), described(PNG.len()));
        assert_eq!(result.structured_content, Some(described(PNG.len())));
    }
    client.cancel().await.unwrap();
    discover.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn a_screenshot_sized_image_arrives_whole_and_only_its_text_is_paged() {
    // 786,000 bytes: as much PNG as fits a device's 1 MiB frame once in
    // base64, of bytes that do not compress.
    let mut bytes = PNG.to_vec();
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    while bytes.len() < 786_000 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        bytes.extend_from_slice(&state.to_le_bytes());
    }
    let vessel = vessel_answering(screenshot(&bytes)).await;
    let (agents, credential) = agents_with("main", AgentScope::AllDevices, AgentRole::User);
    let options = McpOptions {
        read_more_threshold: 40,
        ..McpOptions::default()
    };
    let server = serve_with(&vessel, &agents, options).await;
    let (client, _) = connect(&server.url, &credential).await;
    let result = call(&client, READ, json!({})).await;
    assert_eq!(image_of(&result), ("image/png".to_owned(), bytes.clone()));
    // The text is the first chunk of the result without its data.
    let page = text_after_image(&result);
    let total = described(bytes.len()).to_string();
    assert_eq!(page["truncated"], true);
    assert_eq!(page["totalBytes"], total.len());
    assert_eq!(result.structured_content, Some(page.clone()));
    let mut joined = page["chunk"].as_str().unwrap().to_owned();
    let handle = page["handle"].as_str().unwrap().to_owned();
    loop {
        let next = call(&client, "read_more", json!({"handle": handle})).await;
        assert_eq!(next.content.len(), 1, "read_more carries no image");
        let next = next.structured_content.unwrap();
        joined.push_str(next["chunk"].as_str().unwrap());
        if next["truncated"] == false {
            break;
        }
    }
    assert_eq!(joined, total);
    client.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn a_result_that_merely_looks_like_an_image_stays_json() {
    let png = STANDARD.encode(PNG);
    let looks_like = json!({
        "image": {"type": "image", "mimeType": "image/png", "data": png.trim_end_matches('=')}
    });
    let vessel = vessel_answering(looks_like.clone()).await;
    let (agents, credential) = agents_with("main", AgentScope::AllDevices, AgentRole::User);
    let server = serve(&vessel, &agents).await;
    let (client, _) = connect(&server.url, &credential).await;
    let result = call(&client, READ, json!({})).await;
    assert_eq!(result.content.len(), 1);
    assert_eq!(
        serde_json::from_str::<Value>(&text(&result)).unwrap(),
        looks_like
    );
    assert_eq!(result.structured_content, Some(looks_like));
    client.cancel().await.unwrap();
    server.stop().await;
}

/// A result carrying dk-proto's audio content, by its type, under a name of
/// the device's choosing, arrives as MCP audio content with the same bytes,
/// in both lifecycles, and the text says only its length.
#[tokio::test]
async fn an_audio_result_arrives_as_audio_content_by_its_type() {
    let wav = b"RIFF\x24\0\0\0WAVEfmt \x10\0\0\0\x01\0\x01\0\x80\x3e\0\0\0\x7d\0\0\x02\0\x10\0data\0\0\0\0";
    let audio =
        dk_proto::media::AudioContent::new(dk_proto::media::AudioMime::Wav, STANDARD.encode(wav));
    let vessel = vessel_answering(json!({"sound": audio, "duration_ms": 0})).await;
    let (agents, credential) = agents_with("main", AgentScope::AllDevices, AgentRole::User);
    let server = serve(&vessel, &agents).await;
    let (client, _) = connect(&server.url, &credential).await;
    let discover = connect_discover(&server.url, &credential).await;
    let described = json!({"sound": {"type": "audio", "mimeType": "audio/wav", "bytes": wav.len()}, "duration_ms": 0});
    for result in [
        call(&client, READ, json!({})).await,
        call(&discover, READ, json!({})).await,
    ] {
        assert_eq!(result.is_error, Some(false));
        let Some(ContentBlock::Audio(sound)) = result.content.first() else {
            panic!("no audio first: {result:?}");
        };
        assert_eq!(sound.mime_type, "audio/wav");
        assert_eq!(STANDARD.decode(&sound.data).unwrap(), wav.to_vec());
        assert_eq!(text_after_image(&result), described);
        assert_eq!(result.structured_content, Some(described.clone()));
    }
    client.cancel().await.unwrap();
    discover.cancel().await.unwrap();
    server.stop().await;
}
