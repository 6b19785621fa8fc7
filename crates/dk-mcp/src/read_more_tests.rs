//! Tests of `read_more`: chunking on character boundaries, and oversized
//! results paged back over real sockets with rmcp's client, with handles
//! owned by their session, expiring, and bounded in memory.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use rmcp::model::CallToolResult;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use super::McpOptions;
use super::read_more::{MAX_HANDLES, Owner, ReadMoreError, ResultPages, chunk_at};
use super::tests::{agents_with, call, connect, connect_discover, lamp, serve_with, text};
use crate::agents::AgentDirectory;
use crate::agents::{AgentRole, AgentScope};
use crate::link::{DeviceLink, InvokeResult};
use crate::registry::ConsentDecision;
use crate::vessel::{Limits, Vessel};
use dk_policy::PolicySet;

const READ: &str = "device__desk_lamp__read_light";
const SET: &str = "device__desk_lamp__set_light";

/// A reading of many samples, with quotes and characters of two, three and
/// four bytes, about 17 KB of JSON.
fn big_reading() -> Value {
    let samples: Vec<Value> = (0..400)
        .map(|i| json!({"i": i, "label": format!("é{i}€😀 \"q\" ñ")}))
        .collect();
    json!({ "samples": samples })
}

/// The lamp's device side: `read_light` answers with [`big_reading`],
/// anything else with a small object.
struct BigLamp;

impl DeviceLink for BigLamp {
    fn invoke<'a>(
        &'a self,
        capability: &'a str,
        _input: &'a Map<String, Value>,
        _timeout: Duration,
    ) -> BoxFuture<'a, InvokeResult> {
        let result = if capability == "read_light" {
            big_reading()
        } else {
            json!({"ok": true})
        };
        async move { Ok(Some(RawValue::from_string(result.to_string()).unwrap())) }.boxed()
    }
}

async fn big_lamp() -> Arc<Vessel> {
    let vessel = Vessel::new(PolicySet::empty(), Limits::default());
    let decision = ConsentDecision::approve(["read_light", "set_light"]);
    vessel
        .registry()
        .pair(
            &lamp(),
            |_| {},
            |_| async move { Ok::<_, ()>(decision) },
            Duration::from_secs(1),
        )
        .await
        .unwrap();
    vessel.links().connect("desk-lamp", Arc::new(BigLamp));
    vessel
}

fn options(threshold: usize) -> McpOptions {
    McpOptions {
        read_more_threshold: threshold,
        ..McpOptions::default()
    }
}

fn page(result: &CallToolResult) -> Value {
    assert_eq!(result.is_error, Some(false), "{}", text(result));
    result.structured_content.clone().unwrap()
}

fn handle(page: &Value) -> String {
    page["handle"].as_str().unwrap().to_owned()
}

async fn read_more(client: &rmcp::Peer<rmcp::RoleClient>, input: Value) -> CallToolResult {
    call(client, "read_more", input).await
}

/// Reads every chunk after `first` and returns the joined text.
async fn read_all(client: &rmcp::Peer<rmcp::RoleClient>, first: &Value, limit: usize) -> String {
    let handle = handle(first);
    let mut joined = first["chunk"].as_str().unwrap().to_owned();
    let mut next = first["nextOffset"].clone();
    let mut chunks = 1;
    while let Some(offset) = next.as_u64() {
        assert_eq!(offset, joined.len() as u64);
        let more = page(&read_more(client, json!({"handle": handle, "offset": offset})).await);
        assert_eq!(more["offset"], offset);
        assert_eq!(more["handle"], handle.as_str());
        assert_eq!(more["totalBytes"], first["totalBytes"]);
        let chunk = more["chunk"].as_str().unwrap();
        assert!(!chunk.is_empty() && chunk.len() <= limit, "{chunk:?}");
        joined.push_str(chunk);
        next = more["nextOffset"].clone();
        assert_eq!(more["truncated"], !next.is_null());
        chunks += 1;
        assert!(chunks <= 1_000, "paging does not end");
    }
    joined
}

#[tokio::test]
async fn an_oversized_result_is_paged_back_to_the_exact_bytes() {
    let vessel = big_lamp().await;
    let (agents, credential) = agents_with("main", AgentScope::AllDevices, AgentRole::User);
    let server = serve_with(&vessel, &agents, options(1000)).await;
    let (client, _) = connect(&server.url, &credential).await;
    let expected = big_reading().to_string();
    assert!(expected.len() > 10_000);

    let result = call(&client, READ, json!({})).await;
    let first = page(&result);
    // The same JSON as text, as for any result.
    assert_eq!(
        serde_json::from_str::<Value>(&text(&result)).unwrap(),
        first
    );
    assert_eq!(first["truncated"], true);
    assert_eq!(first["totalBytes"], expected.len());
    assert_eq!(first["offset"], 0);
    assert_eq!(first["expiresInSeconds"], 600);
    assert!(handle(&first).starts_with("rm_"));
    assert!(first["chunk"].as_str().unwrap().len() <= 1000);
    assert!(first["note"].as_str().unwrap().contains("read_more"));

    let joined = read_all(&client, &first, 1000).await;
    assert_eq!(joined, expected);
    assert_eq!(
        serde_json::from_str::<Value>(&joined).unwrap(),
        big_reading()
    );

    // A chunk can be read again, and the end is an empty last chunk.
    let again = page(&read_more(&client, json!({"handle": handle(&first), "offset": 0})).await);
    assert_eq!(again["chunk"], first["chunk"]);
    let end = page(
        &read_more(
            &client,
            json!({"handle": handle(&first), "offset": expected.len()}),
        )
        .await,
    );
    assert_eq!(end["chunk"], "");
    assert_eq!(end["nextOffset"], Value::Null);
    assert_eq!(end["truncated"], false);

    // A result within the threshold comes whole.
    let small = call(&client, SET, json!({"on": true})).await;
    assert_eq!(small.structured_content, Some(json!({"ok": true})));

    // One decision per device call; read_more is not a device call.
    assert_eq!(vessel.recent_decisions().len(), 2);
    client.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn foreign_unknown_and_bad_handles_and_offsets_are_tool_errors() {
    let vessel = big_lamp().await;
    let (agents, credential) = agents_with("main", AgentScope::AllDevices, AgentRole::User);
    let (_, other) = agents
        .add("other", AgentScope::AllDevices, AgentRole::User)
        .unwrap();
    let server = serve_with(&vessel, &agents, options(1000)).await;
    let (client, _) = connect(&server.url, &credential).await;
    let first = page(&call(&client, READ, json!({})).await);
    let mine = handle(&first);
    let total = first["totalBytes"].as_u64().unwrap();

    let refused = |result: CallToolResult| {
        assert_eq!(result.is_error, Some(true), "{result:?}");
        assert_eq!(result.structured_content, None);
        text(&result)
    };
    let foreign = format!("read_more handle `{mine}` belongs to another MCP session");
    // Another session of the same agent, and another agent.
    let (second, _) = connect(&server.url, &credential).await;
    let input = json!({"handle": mine, "offset": 0});
    assert_eq!(refused(read_more(&second, input.clone()).await), foreign);
    let (stranger, _) = connect(&server.url, other.expose()).await;
    assert_eq!(refused(read_more(&stranger, input.clone()).await), foreign);

    assert_eq!(
        refused(read_more(&client, json!({"handle": "rm_0123", "offset": 0})).await),
        "unknown or expired read_more handle `rm_0123`: call the tool again for a fresh result"
    );
    assert_eq!(
        refused(read_more(&client, json!({"handle": mine, "offset": total + 1})).await),
        format!(
            "offset {} is past the end of the result ({total} bytes)",
            total + 1
        )
    );
    let expected = big_reading().to_string();
    let inside = (0..expected.len())
        .find(|&i| !expected.is_char_boundary(i))
        .unwrap();
    assert_eq!(
        refused(read_more(&client, json!({"handle": mine, "offset": inside})).await),
        format!(
            "offset {inside} falls inside a character: use the nextOffset of the previous chunk"
        )
    );
    let bad_input = "read_more takes {\"handle\": string} and, to read from a given byte, \"offset\": integer of at least 0";
    for input in [
        json!({"handle": mine, "offset": null}),
        json!({"handle": mine, "offset": "0"}),
        json!({"handle": mine, "offset": -1}),
        json!({"handle": mine, "offset": 1.5}),
        json!({"handle": 7, "offset": 0}),
        json!({"handle": mine, "offset": 0, "extra": true}),
        json!({}),
    ] {
        assert_eq!(refused(read_more(&client, input).await), bad_input);
    }
    // Nothing above spoilt the handle for its own session.
    assert_eq!(read_all(&client, &first, 1000).await, expected);

    // A client without a session: its handles are its agent's, across
    // requests, and neither kind of handle opens the other.
    let discover = connect_discover(&server.url, &credential).await;
    let stateless = page(&call(&discover, READ, json!({})).await);
    assert_eq!(read_all(&discover, &stateless, 1000).await, expected);
    assert_eq!(refused(read_more(&discover, input).await), foreign);
    let theirs = json!({"handle": handle(&stateless), "offset": 0});
    assert_eq!(
        refused(read_more(&client, theirs.clone()).await),
        format!(
            "read_more handle `{}` belongs to another MCP session",
            handle(&stateless)
        )
    );
    assert!(refused(read_more(&stranger, theirs).await).contains("belongs to another"));

    for c in [client, second, stranger] {
        c.cancel().await.unwrap();
    }
    discover.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn an_expired_handle_is_refused() {
    let vessel = big_lamp().await;
    let (agents, credential) = agents_with("main", AgentScope::AllDevices, AgentRole::User);
    let options = McpOptions {
        read_more_expiry: Duration::ZERO,
        ..options(1000)
    };
    let server = serve_with(&vessel, &agents, options).await;
    let (client, _) = connect(&server.url, &credential).await;
    let first = page(&call(&client, READ, json!({})).await);
    assert_eq!(first["expiresInSeconds"], 0);
    let refused = read_more(&client, json!({"handle": handle(&first), "offset": 0})).await;
    assert_eq!(refused.is_error, Some(true));
    assert!(
        text(&refused).starts_with("unknown or expired read_more handle"),
        "{}",
        text(&refused)
    );
    client.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn past_the_memory_bound_the_oldest_handles_are_dropped() {
    let vessel = big_lamp().await;
    let (agents, credential) = agents_with("main", AgentScope::AllDevices, AgentRole::User);
    let size = big_reading().to_string().len();
    let options = McpOptions {
        read_more_memory: size * 2 + size / 2,
        ..options(1000)
    };
    let server = serve_with(&vessel, &agents, options).await;
    let (client, _) = connect(&server.url, &credential).await;
    let mut handles = Vec::new();
    for _ in 0..3 {
        handles.push(handle(&page(&call(&client, READ, json!({})).await)));
    }
    let oldest = read_more(&client, json!({"handle": handles[0], "offset": 0})).await;
    assert_eq!(oldest.is_error, Some(true));
    assert!(text(&oldest).starts_with("unknown or expired"));
    for kept in &handles[1..] {
        let page = page(&read_more(&client, json!({"handle": kept, "offset": 0})).await);
        assert_eq!(page["totalBytes"], size);
    }
    client.cancel().await.unwrap();
    server.stop().await;
}

/// Reads every chunk after `first` by handle alone and returns the joined
/// text.
async fn read_on(client: &rmcp::Peer<rmcp::RoleClient>, first: &Value) -> String {
    let handle = handle(first);
    let mut joined = first["chunk"].as_str().unwrap().to_owned();
    let mut more = first.clone();
    while more["truncated"] == true {
        more = page(&read_more(client, json!({ "handle": handle })).await);
        assert_eq!(more["offset"], joined.len());
        assert_eq!(more["handle"], handle.as_str());
        joined.push_str(more["chunk"].as_str().unwrap());
        assert!(joined.len() <= 100_000, "paging does not end");
    }
    assert_eq!(more["nextOffset"], Value::Null);
    joined
}

#[tokio::test]
async fn read_more_with_the_handle_alone_returns_the_next_chunk() {
    let vessel = big_lamp().await;
    let (agents, credential) = agents_with("main", AgentScope::AllDevices, AgentRole::User);
    let server = serve_with(&vessel, &agents, options(1000)).await;
    let expected = big_reading().to_string();
    let (client, _) = connect(&server.url, &credential).await;
    let discover = connect_discover(&server.url, &credential).await;
    for client in [client.peer(), discover.peer()] {
        let first = page(&call(client, READ, json!({})).await);
        assert!(
            first["note"]
                .as_str()
                .unwrap()
                .contains(&format!("{{\"handle\": \"{}\"}}", handle(&first))),
            "{first}"
        );
        assert_eq!(read_on(client, &first).await, expected);
        // Past the last chunk: a clear error, and the handle still reads
        // at an offset.
        let done = read_more(client, json!({"handle": handle(&first)})).await;
        assert_eq!(done.is_error, Some(true));
        assert_eq!(
            text(&done),
            format!(
                "read_more handle `{}` has no more: all {} bytes were served (give an offset to read a chunk again)",
                handle(&first),
                expected.len()
            )
        );
        // An offset reads again, and the handle alone goes on from there.
        let again = page(&read_more(client, json!({"handle": handle(&first), "offset": 0})).await);
        assert_eq!(again["chunk"], first["chunk"]);
        let second = page(&read_more(client, json!({"handle": handle(&first)})).await);
        assert_eq!(second["offset"], first["nextOffset"]);
        let second_at = json!({"handle": handle(&first), "offset": first["nextOffset"]});
        assert_eq!(
            page(&read_more(client, second_at).await)["chunk"],
            second["chunk"]
        );
    }
    client.cancel().await.unwrap();
    discover.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn one_agent_filling_its_share_never_drops_another_agent_s_handles() {
    let vessel = big_lamp().await;
    let agents = Arc::new(AgentDirectory::new());
    let [greedy, modest] = ["greedy", "modest"].map(|name| {
        agents
            .add(name, AgentScope::AllDevices, AgentRole::User)
            .unwrap()
            .1
            .expose()
            .to_owned()
    });
    let size = big_reading().to_string().len();
    let options = McpOptions {
        read_more_memory: size * 4,
        read_more_memory_per_agent: size * 2,
        ..options(1000)
    };
    let server = serve_with(&vessel, &agents, options).await;
    let (modest, _) = connect(&server.url, &modest).await;
    let kept = handle(&page(&call(&modest, READ, json!({})).await));
    let (greedy, _) = connect(&server.url, &greedy).await;
    let mut handles = Vec::new();
    for _ in 0..10 {
        handles.push(handle(&page(&call(&greedy, READ, json!({})).await)));
    }
    // The greedy agent keeps its share, its newest; the other's handle
    // was never touched.
    let mut readable = Vec::new();
    for handle in &handles {
        let result = read_more(&greedy, json!({"handle": handle, "offset": 0})).await;
        readable.push(result.is_error == Some(false));
    }
    assert_eq!(readable.iter().filter(|r| **r).count(), 2);
    assert!(readable[8] && readable[9]);
    let page = page(&read_more(&modest, json!({"handle": kept, "offset": 0})).await);
    assert_eq!(page["totalBytes"], size);
    greedy.cancel().await.unwrap();
    modest.cancel().await.unwrap();
    server.stop().await;
}

#[test]
fn chunks_end_on_character_boundaries_and_join_to_the_text() {
    let text = "aé€😀\"b\\ñ😀😀z";
    for size in 1..=text.len() + 1 {
        let mut joined = String::new();
        let mut offset = 0;
        loop {
            let (chunk, next) = chunk_at(text, offset, size).unwrap();
            assert!(!chunk.is_empty());
            // Never more than the size, unless one character is larger.
            assert!(
                chunk.len() <= size || chunk.chars().count() == 1,
                "{size} {chunk:?}"
            );
            joined.push_str(chunk);
            match next {
                Some(n) => offset = n,
                None => break,
            }
        }
        assert_eq!(joined, text);
    }
    assert_eq!(chunk_at(text, text.len(), 4), Ok(("", None)));
    assert_eq!(chunk_at(text, 2, 4), Err(ReadMoreError::InsideCharacter(2)));
    assert_eq!(
        chunk_at(text, 99, 4),
        Err(ReadMoreError::PastEnd {
            offset: 99,
            total: text.len()
        })
    );
    assert_eq!(chunk_at("", 0, 4), Ok(("", None)));
}

#[test]
fn the_memory_bound_holds_and_a_result_larger_than_it_is_not_kept() {
    let value = big_reading();
    let size = value.to_string().len();
    let pages = ResultPages::new(&McpOptions {
        read_more_memory: size * 2 + 1,
        ..options(100)
    });
    let agent = "main".into();
    for _ in 0..5 {
        let result = pages.result_for(value.clone(), Owner::Agent, &agent);
        assert_eq!(result.structured_content.unwrap()["truncated"], true);
        let (count, bytes) = pages.held();
        assert!(count <= 2 && bytes <= size * 2 + 1, "{count} {bytes}");
    }
    assert_eq!(pages.held(), (2, size * 2));
    pages.forget_session("none", &agent);
    assert_eq!(pages.held(), (2, size * 2));

    let tiny = ResultPages::new(&McpOptions {
        read_more_memory: size - 1,
        ..options(100)
    });
    let page = tiny
        .result_for(value, Owner::Session("s".into()), &agent)
        .structured_content
        .unwrap();
    assert_eq!(page["handle"], Value::Null);
    assert_eq!(page["truncated"], true);
    assert!(page["chunk"].as_str().unwrap().len() <= 100);
    assert_eq!(tiny.held(), (0, 0));
}

#[test]
fn a_session_s_handles_go_with_it() {
    let pages = ResultPages::new(&options(100));
    let agent = "main".into();
    let value = big_reading();
    pages.result_for(value.clone(), Owner::Session("one".into()), &agent);
    pages.result_for(value.clone(), Owner::Session("two".into()), &agent);
    pages.result_for(value.clone(), Owner::Agent, &agent);
    assert_eq!(pages.held().0, 3);
    // Only the agent's own session's handles.
    pages.forget_session("one", &"other".into());
    assert_eq!(pages.held().0, 3);
    pages.forget_session("one", &agent);
    assert_eq!(pages.held().0, 2);
    pages.forget_session("two", &agent);
    assert_eq!(pages.held().0, 1);
}

#[test]
fn the_number_of_handles_is_bounded_too() {
    let pages = ResultPages::new(&options(1));
    let agent = "main".into();
    for n in 0..MAX_HANDLES + 10 {
        pages.result_for(json!({ "n": n }), Owner::Agent, &agent);
    }
    assert_eq!(pages.held().0, MAX_HANDLES);
}

#[test]
fn past_the_pool_the_agent_holding_the_most_loses_its_oldest() {
    let value = big_reading();
    let size = value.to_string().len();
    let pages = ResultPages::new(&McpOptions {
        read_more_memory: size * 4,
        read_more_memory_per_agent: size * 2,
        ..options(100)
    });
    let keep = |agent: &str| {
        let page = pages
            .result_for(value.clone(), Owner::Agent, &agent.to_owned())
            .structured_content
            .unwrap();
        page["handle"].as_str().unwrap().to_owned()
    };
    let readable = |handle: &str, agent: &str| {
        pages
            .read_more(
                json!({ "handle": handle, "offset": 0 })
                    .as_object()
                    .unwrap(),
                &Owner::Agent,
                &agent.to_owned(),
            )
            .is_error
            == Some(false)
    };
    let a = [keep("a"), keep("a")];
    let b = keep("b");
    let c = keep("c");
    assert_eq!(pages.held(), (4, size * 4));
    // The pool is full: d's first handle costs a, which holds the most
    // (its oldest), not b or c.
    let d = keep("d");
    assert!(!readable(&a[0], "a"));
    assert!(readable(&a[1], "a") && readable(&b, "b") && readable(&c, "c"));
    // Every agent holds one: the one adding more pays for it itself.
    let d2 = keep("d");
    assert!(!readable(&d, "d") && readable(&d2, "d"));
    assert!(readable(&a[1], "a") && readable(&b, "b") && readable(&c, "c"));
    assert_eq!(pages.held(), (4, size * 4));
    // A result larger than an agent's share is not kept at all.
    let small_share = ResultPages::new(&McpOptions {
        read_more_memory_per_agent: size - 1,
        ..options(100)
    });
    let page = small_share
        .result_for(value, Owner::Agent, &"a".to_owned())
        .structured_content
        .unwrap();
    assert_eq!(page["handle"], Value::Null);
    assert_eq!(small_share.held(), (0, 0));
}
