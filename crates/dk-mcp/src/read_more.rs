//! Oversized results: a device result whose JSON is longer than the
//! threshold is kept here under a random handle, and the agent gets its
//! first chunk; the `read_more` tool returns the next chunk for a handle
//! (the one after the last served), or the chunk at an offset. A handle
//! belongs to the MCP session that made it (or, for clients served without
//! a session, to the agent) and lasts a fixed time. What handles hold is
//! bounded per agent (its own oldest dropped first) and in all (the agent
//! holding the most loses its oldest), so no agent can push out the
//! handles of one that holds less.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolResult, ContentBlock, JsonObject, Tool, ToolAnnotations};
use serde_json::{Value, json};

use super::options::McpOptions;
use crate::agents::AgentId;

/// The name of the built-in tool that returns the next chunk of a result.
pub(crate) const READ_MORE_TOOL: &str = "read_more";

/// What a handle starts with, so a handle is recognisable in a transcript.
const HANDLE_PREFIX: &str = "rm_";

/// The most handles kept at once, whatever their size (with a tiny
/// threshold, the byte bound alone would let bookkeeping outgrow the data).
pub(crate) const MAX_HANDLES: usize = 4096;

/// Who may read a handle: the MCP session that made it, or, for a client
/// served without a session, the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Owner {
    /// An `initialize` session, by its `Mcp-Session-Id`.
    Session(String),
    /// A client of the `server/discover` lifecycle, by its agent.
    Agent,
}

/// One kept result.
struct Kept {
    owner: Owner,
    agent: AgentId,
    text: Arc<str>,
    made: Instant,
    /// Where the chunk after the last one served starts (the end of the
    /// text once the last chunk was served).
    next: usize,
}

/// What one agent's handles hold.
#[derive(Debug, Default, Clone, Copy)]
struct Held {
    bytes: usize,
    handles: usize,
}

#[derive(Default)]
struct Inner {
    by_handle: HashMap<String, Kept>,
    /// Handles in the order they were made (so also in the order they
    /// expire); may name handles already taken out.
    order: VecDeque<String>,
    bytes: usize,
    /// Per agent holding any.
    held: HashMap<AgentId, Held>,
}

impl Inner {
    fn remove(&mut self, handle: &str) {
        let Some(kept) = self.by_handle.remove(handle) else {
            return;
        };
        self.bytes = self.bytes.saturating_sub(kept.text.len());
        if let Some(held) = self.held.get_mut(&kept.agent) {
            held.bytes = held.bytes.saturating_sub(kept.text.len());
            held.handles = held.handles.saturating_sub(1);
            if held.handles == 0 {
                self.held.remove(&kept.agent);
            }
        }
    }

    fn insert(&mut self, handle: String, kept: Kept) {
        let held = self.held.entry(kept.agent.clone()).or_default();
        held.bytes = held.bytes.saturating_add(kept.text.len());
        held.handles = held.handles.saturating_add(1);
        self.bytes = self.bytes.saturating_add(kept.text.len());
        self.order.push_back(handle.clone());
        self.by_handle.insert(handle, kept);
    }

    fn held(&self, agent: &str) -> Held {
        self.held.get(agent).copied().unwrap_or_default()
    }

    /// Drops `agent`'s oldest handle; false when it has none.
    fn drop_oldest_of(&mut self, agent: &str) -> bool {
        let oldest = self
            .order
            .iter()
            .find(|h| self.by_handle.get(*h).is_some_and(|k| k.agent == agent))
            .cloned();
        let Some(oldest) = oldest else {
            return false;
        };
        self.remove(&oldest);
        self.compact();
        true
    }

    /// The agent holding the most by `measure`; `keeper` when it is among
    /// them.
    fn largest_holder(&self, keeper: &str, measure: fn(&Held) -> usize) -> Option<AgentId> {
        let most = self.held.values().map(measure).max()?;
        if measure(&self.held(keeper)) == most {
            return Some(keeper.to_owned());
        }
        self.held
            .iter()
            .filter(|(_, h)| measure(h) == most)
            .map(|(agent, _)| agent)
            .min()
            .cloned()
    }

    /// Forgets the order's entries for handles taken out, once they
    /// outnumber the handles kept.
    fn compact(&mut self) {
        if self.order.len() > 2 * self.by_handle.len() + 64 {
            let Inner {
                by_handle, order, ..
            } = self;
            order.retain(|h| by_handle.contains_key(h));
        }
    }

    /// Drops the handles made before `made_before`.
    fn sweep(&mut self, now: Instant, expiry: Duration) {
        while let Some(handle) = self.order.front() {
            let expired = match self.by_handle.get(handle) {
                Some(kept) => now.saturating_duration_since(kept.made) >= expiry,
                None => true,
            };
            if !expired {
                break;
            }
            if let Some(handle) = self.order.pop_front() {
                self.remove(&handle);
            }
        }
    }
}

/// Why `read_more` could not return a chunk. Every variant is told to the
/// agent as a tool error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReadMoreError {
    /// The input is not `{"handle": string}` with an optional
    /// `"offset": integer >= 0`.
    BadInput,
    /// No such handle: never made, expired, or dropped to keep memory bounded.
    Unknown(String),
    /// The handle belongs to another session or agent.
    Foreign(String),
    /// The offset is past the end of the result.
    PastEnd {
        /// The offset asked for.
        offset: u64,
        /// The result's length.
        total: usize,
    },
    /// The offset falls inside a character.
    InsideCharacter(u64),
    /// No offset, and the last chunk was served already.
    NoMore {
        /// The handle.
        handle: String,
        /// The result's length.
        total: usize,
    },
}

impl std::fmt::Display for ReadMoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadMoreError::BadInput => write!(
                f,
                "read_more takes {{\"handle\": string}} and, to read from a given byte, \"offset\": integer of at least 0"
            ),
            ReadMoreError::Unknown(handle) => write!(
                f,
                "unknown or expired read_more handle `{handle}`: call the tool again for a fresh result"
            ),
            ReadMoreError::Foreign(handle) => write!(
                f,
                "read_more handle `{handle}` belongs to another MCP session"
            ),
            ReadMoreError::PastEnd { offset, total } => write!(
                f,
                "offset {offset} is past the end of the result ({total} bytes)"
            ),
            ReadMoreError::InsideCharacter(offset) => write!(
                f,
                "offset {offset} falls inside a character: use the nextOffset of the previous chunk"
            ),
            ReadMoreError::NoMore { handle, total } => write!(
                f,
                "read_more handle `{handle}` has no more: all {total} bytes were served (give an offset to read a chunk again)"
            ),
        }
    }
}

/// The chunk of `text` that starts at `offset`: at most `size` bytes, cut
/// on a character boundary (but always at least one character, so paging
/// moves on), and the offset of the next chunk if there is one.
pub(crate) fn chunk_at(
    text: &str,
    offset: usize,
    size: usize,
) -> Result<(&str, Option<usize>), ReadMoreError> {
    let total = text.len();
    if offset > total {
        return Err(ReadMoreError::PastEnd {
            offset: offset as u64,
            total,
        });
    }
    if !text.is_char_boundary(offset) {
        return Err(ReadMoreError::InsideCharacter(offset as u64));
    }
    let mut end = offset.saturating_add(size.max(1)).min(total);
    while end > offset && !text.is_char_boundary(end) {
        end -= 1;
    }
    if end == offset && end < total {
        end += 1;
        while end < total && !text.is_char_boundary(end) {
            end += 1;
        }
    }
    let chunk = text.get(offset..end).unwrap_or_default();
    Ok((chunk, (end < total).then_some(end)))
}

/// The results too large to return whole, by handle.
pub(crate) struct ResultPages {
    threshold: usize,
    expiry: Duration,
    memory: usize,
    memory_per_agent: usize,
    inner: Mutex<Inner>,
}

/// A page as the agent reads it: `{truncated, handle, totalBytes,
/// offset, nextOffset, chunk, expiresInSeconds, note}`.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Shown<'a> {
    truncated: bool,
    handle: Option<&'a str>,
    total_bytes: usize,
    offset: usize,
    next_offset: Option<usize>,
    chunk: &'a str,
    expires_in_seconds: u64,
    note: String,
}

/// A page told to the agent.
struct Page<'a> {
    handle: Option<&'a str>,
    total: usize,
    offset: usize,
    chunk: &'a str,
    next: Option<usize>,
    expires_in: Duration,
}

impl Page<'_> {
    fn into_result(self, first: bool) -> CallToolResult {
        let note = match (self.next, self.handle) {
            (Some(next), Some(handle)) => {
                let lead = if first {
                    format!(
                        "the result is {} bytes of JSON, too large to return at once; this is its first chunk. ",
                        self.total
                    )
                } else {
                    String::new()
                };
                format!(
                    "{lead}Call read_more with {{\"handle\": \"{handle}\"}} for the next chunk (with \"offset\": {next} to read from that byte), and join the chunks in order to get the result's JSON."
                )
            }
            (Some(_), None) => format!(
                "the result is {} bytes of JSON, more than the vessel can keep; only its first chunk is shown.",
                self.total
            ),
            (None, _) => {
                "This is the last chunk: join the chunks in order to get the result's JSON."
                    .to_owned()
            }
        };
        let shown = Shown {
            truncated: self.next.is_some(),
            handle: self.handle,
            total_bytes: self.total,
            offset: self.offset,
            next_offset: self.next,
            chunk: self.chunk,
            expires_in_seconds: self.expires_in.as_secs(),
            note,
        };
        CallToolResult::structured(serde_json::to_value(&shown).unwrap_or(Value::Null))
    }
}

impl ResultPages {
    pub(crate) fn new(options: &McpOptions) -> ResultPages {
        ResultPages {
            threshold: options.read_more_threshold.max(1),
            expiry: options.read_more_expiry,
            memory: options.read_more_memory,
            memory_per_agent: options.read_more_memory_per_agent,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The result to send for the device result `object`: itself as
    /// structured content when its JSON is at most the threshold, else its
    /// first chunk with a handle for the rest.
    pub(crate) fn result_for(
        &self,
        object: Value,
        owner: Owner,
        agent: &AgentId,
    ) -> CallToolResult {
        let text = object.to_string();
        if text.len() <= self.threshold {
            return CallToolResult::structured(object);
        }
        let Ok((chunk, next)) = chunk_at(&text, 0, self.threshold) else {
            return CallToolResult::error(vec![ContentBlock::text(
                "the result could not be paged",
            )]);
        };
        let served = next.unwrap_or(text.len());
        let handle = self.keep(Arc::from(text.as_str()), served, owner, agent);
        Page {
            handle: handle.as_deref(),
            total: text.len(),
            offset: 0,
            chunk,
            next,
            expires_in: if handle.is_some() {
                self.expiry
            } else {
                Duration::ZERO
            },
        }
        .into_result(true)
    }

    /// Keeps `text`, served up to `served`, under a new handle: drops
    /// expired handles, then `agent`'s own oldest until it fits the agent's
    /// share, then the oldest of the agent holding the most until it fits
    /// the pool. `None` when it alone is over the agent's share or the pool.
    fn keep(&self, text: Arc<str>, served: usize, owner: Owner, agent: &AgentId) -> Option<String> {
        if text.len() > self.memory || text.len() > self.memory_per_agent {
            return None;
        }
        let handle = format!("{HANDLE_PREFIX}{}", dk_files::hex::random(16));
        let now = Instant::now();
        let mut inner = self.lock();
        inner.sweep(now, self.expiry);
        while inner.held(agent).bytes.saturating_add(text.len()) > self.memory_per_agent {
            if !inner.drop_oldest_of(agent) {
                break;
            }
        }
        loop {
            let measure: fn(&Held) -> usize =
                if inner.bytes.saturating_add(text.len()) > self.memory {
                    |h| h.bytes
                } else if inner.by_handle.len() >= MAX_HANDLES {
                    |h| h.handles
                } else {
                    break;
                };
            let Some(holder) = inner.largest_holder(agent, measure) else {
                break;
            };
            if !inner.drop_oldest_of(&holder) {
                break;
            }
        }
        inner.insert(
            handle.clone(),
            Kept {
                owner,
                agent: agent.clone(),
                text,
                made: now,
                next: served,
            },
        );
        Some(handle)
    }

    /// Answers a `read_more` call with `arguments`, for `owner`.
    pub(crate) fn read_more(
        &self,
        arguments: &JsonObject,
        owner: &Owner,
        agent: &AgentId,
    ) -> CallToolResult {
        match self.try_read_more(arguments, owner, agent) {
            Ok(result) => result,
            Err(e) => CallToolResult::error(vec![ContentBlock::text(e.to_string())]),
        }
    }

    fn try_read_more(
        &self,
        arguments: &JsonObject,
        owner: &Owner,
        agent: &AgentId,
    ) -> Result<CallToolResult, ReadMoreError> {
        let handle = arguments
            .get("handle")
            .and_then(Value::as_str)
            .ok_or(ReadMoreError::BadInput)?;
        let offset = match arguments.get("offset") {
            None => None,
            Some(offset) => Some(offset.as_u64().ok_or(ReadMoreError::BadInput)?),
        };
        if arguments.keys().any(|k| k != "handle" && k != "offset") {
            return Err(ReadMoreError::BadInput);
        }
        let now = Instant::now();
        // Found, checked and moved on under one lock, so two calls without
        // an offset get two successive chunks.
        let (text, made, start, end) = {
            let mut inner = self.lock();
            inner.sweep(now, self.expiry);
            let kept = inner
                .by_handle
                .get_mut(handle)
                .ok_or_else(|| ReadMoreError::Unknown(printable_handle(handle)))?;
            if &kept.owner != owner || &kept.agent != agent {
                return Err(ReadMoreError::Foreign(printable_handle(handle)));
            }
            let total = kept.text.len();
            let start = match offset {
                Some(offset) => {
                    usize::try_from(offset).map_err(|_| ReadMoreError::PastEnd { offset, total })?
                }
                None if kept.next >= total => {
                    return Err(ReadMoreError::NoMore {
                        handle: printable_handle(handle),
                        total,
                    });
                }
                None => kept.next,
            };
            let (chunk, next) = chunk_at(&kept.text, start, self.threshold)?;
            let end = start + chunk.len();
            kept.next = next.unwrap_or(total);
            (Arc::clone(&kept.text), kept.made, start, end)
        };
        let chunk = text.get(start..end).unwrap_or_default();
        let next = (end < text.len()).then_some(end);
        Ok(Page {
            handle: Some(handle),
            total: text.len(),
            offset: start,
            chunk,
            next,
            expires_in: self
                .expiry
                .saturating_sub(now.saturating_duration_since(made)),
        }
        .into_result(false))
    }

    /// Drops every handle `agent` made in the session `session` (it ended).
    pub(crate) fn forget_session(&self, session: &str, agent: &AgentId) {
        let mut inner = self.lock();
        let gone: Vec<String> = inner
            .by_handle
            .iter()
            .filter(|(_, k)| {
                &k.agent == agent && matches!(&k.owner, Owner::Session(s) if s == session)
            })
            .map(|(h, _)| h.clone())
            .collect();
        if gone.is_empty() {
            return;
        }
        for handle in &gone {
            inner.remove(handle);
        }
        inner.compact();
    }

    /// How many handles are kept and the bytes they hold.
    #[cfg(test)]
    pub(crate) fn held(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.by_handle.len(), inner.bytes)
    }
}

/// A handle as an agent gave it, short and safe to repeat in a message.
fn printable_handle(handle: &str) -> String {
    handle
        .chars()
        .take(64)
        .map(|c| if c.is_ascii_graphic() { c } else { '?' })
        .collect()
}

/// The `read_more` tool as listed to every agent.
pub(crate) fn read_more_tool() -> Tool {
    let schema = json!({
        "type": "object",
        "properties": {
            "handle": {
                "type": "string",
                "description": "the handle of an oversized result"
            },
            "offset": {
                "type": "integer",
                "minimum": 0,
                "description": "optional: the byte where the chunk starts, to read a chunk again; without it, the chunk after the last one served"
            }
        },
        "required": ["handle"],
        "additionalProperties": false
    });
    let schema: JsonObject = match schema {
        Value::Object(map) => map,
        _ => JsonObject::new(),
    };
    Tool::new(
        READ_MORE_TOOL,
        "Returns the next chunk of a device result that was too large to return at once. \
         Such a result comes as {truncated, handle, totalBytes, offset, nextOffset, chunk}: \
         call read_more with its handle until truncated is false, and join the chunks in \
         order to get the result's JSON. An offset (a nextOffset seen before) reads the \
         chunk from that byte again. Handles expire and belong to the session that got them.",
        Arc::new(schema),
    )
    .with_annotations(
        ToolAnnotations::new()
            .read_only(true)
            .destructive(false)
            // Without an offset, each call moves on to the next chunk: a
            // retried call would skip one.
            .idempotent(false)
            .open_world(false),
    )
}
