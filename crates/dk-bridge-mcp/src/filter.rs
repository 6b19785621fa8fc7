//! What the server writes, read before the MCP client reads it: one
//! JSON-RPC message a line, each line judged on its own and in bounded
//! memory.
//!
//! - A line over [`MAX_MESSAGE_BYTES`] is never held: its head and tail are
//!   kept to find its `id`, and the client is given an error answer for
//!   that id in its place (`the server's answer was more than 2 MiB`), so
//!   the call ends at once with the reason instead of waiting for its
//!   timeout. A line whose id cannot be found is dropped.
//! - A line nested deeper than [`MAX_MESSAGE_DEPTH`] is answered the same
//!   way.
//! - A request for what the bridge never offers (sampling, elicitation,
//!   roots) is answered here, `method not found`, and counted: it never
//!   reaches the client (rmcp, which may not read the request at all).
//! - Other notifications and requests from the server (logging, progress,
//!   ping) pass at most [`BURST`] at once and [`PER_SECOND`] a second
//!   after that; the rest are dropped and counted.
//!   `notifications/tools/list_changed` always passes (the bridge lists
//!   the tools once for any number of them).
//!
//! Everything else passes as it is.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use rmcp::model::{ErrorCode, ErrorData, JsonRpcError, NumberOrString, RequestId};
use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

/// Longest line read from the server (2 MiB): longer than any result a
/// device may send.
pub const MAX_MESSAGE_BYTES: usize = 2 * 1024 * 1024;

/// Deepest message read from the server: a result nested deeper could not
/// be sent on as a device frame.
pub const MAX_MESSAGE_DEPTH: usize = dk_proto::MAX_FRAME_DEPTH - 4;

/// Notifications and requests from the server passed at once.
pub const BURST: f64 = 200.0;

/// Notifications and requests from the server passed a second, after the
/// burst.
pub const PER_SECOND: f64 = 50.0;

/// Bytes kept of each end of an oversized line, to find its id.
const ENDS: usize = 4096;

/// What the filter saw, for the bridge's log and `server_info`.
#[derive(Debug, Default)]
pub struct Seen {
    /// Lines over [`MAX_MESSAGE_BYTES`].
    pub oversized: AtomicU64,
    /// Lines nested deeper than [`MAX_MESSAGE_DEPTH`].
    pub too_deep: AtomicU64,
    /// Notifications and requests dropped over the rate.
    pub dropped: AtomicU64,
    /// Requests from the server.
    pub requests: AtomicU64,
    /// Of those, the requests for sampling, elicitation or roots, refused.
    pub refused: AtomicU64,
}

/// What the server may ask that the bridge never offers, and its name in
/// the refusal.
const NEVER_OFFERED: [(&str, &str); 3] = [
    ("sampling/createMessage", "sampling"),
    ("elicitation/create", "elicitation"),
    ("roots/list", "roots"),
];

impl Seen {
    fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The head and tail of a line too long to keep.
struct Oversized {
    head: Vec<u8>,
    tail: Vec<u8>,
    total: usize,
}

impl Oversized {
    fn start(line: &[u8]) -> Oversized {
        let mut over = Oversized {
            head: Vec::with_capacity(ENDS),
            tail: Vec::with_capacity(2 * ENDS),
            total: 0,
        };
        over.push(line);
        over
    }

    fn push(&mut self, bytes: &[u8]) {
        self.total = self.total.saturating_add(bytes.len());
        let room = ENDS.saturating_sub(self.head.len());
        self.head
            .extend_from_slice(bytes.get(..room.min(bytes.len())).unwrap_or_default());
        self.tail.extend_from_slice(bytes);
        if self.tail.len() > 2 * ENDS {
            let cut = self.tail.len() - ENDS;
            self.tail.drain(..cut);
        }
    }
}

/// A token bucket for the server's notifications and requests.
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new() -> Bucket {
        Bucket {
            tokens: BURST,
            at: Instant::now(),
        }
    }

    fn take(&mut self) -> bool {
        let now = Instant::now();
        let elapsed = now.duration_since(self.at).as_secs_f64();
        self.at = now;
        self.tokens = (self.tokens + elapsed * PER_SECOND).min(BURST);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The members of a message the filter looks at.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
    #[serde(default)]
    id: Option<RequestId>,
}

/// Copies the server's messages from `from` to `to`, judged as the module
/// says, until either ends; the answers to what the bridge refuses itself
/// go to `answers`, each a line for the server.
pub async fn run(
    from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    answers: mpsc::Sender<Vec<u8>>,
    seen: Arc<Seen>,
) {
    let mut reader = BufReader::with_capacity(64 * 1024, from);
    let mut line: Vec<u8> = Vec::new();
    let mut over: Option<Oversized> = None;
    let mut bucket = Bucket::new();
    loop {
        let (taken, ended) = {
            let Ok(available) = reader.fill_buf().await else {
                break;
            };
            if available.is_empty() {
                break;
            }
            let newline = available.iter().position(|b| *b == b'\n');
            let take = newline.map_or(available.len(), |i| i + 1);
            let chunk = available.get(..take).unwrap_or_default();
            match &mut over {
                Some(over) => over.push(chunk),
                None if line.len().saturating_add(take) > MAX_MESSAGE_BYTES => {
                    let mut started = Oversized::start(&line);
                    started.push(chunk);
                    over = Some(started);
                    line = Vec::new();
                }
                None => line.extend_from_slice(chunk),
            }
            (take, newline.is_some())
        };
        reader.consume(taken);
        if ended {
            let out = match over.take() {
                Some(over) => {
                    Seen::count(&seen.oversized);
                    tracing::warn!(
                        bytes = over.total,
                        "the server sent a message over {} bytes: refused",
                        MAX_MESSAGE_BYTES
                    );
                    refusal(
                        &over.head,
                        &over.tail,
                        &format!(
                            "the server's answer was more than {} MiB: refused whole, nothing was cut",
                            MAX_MESSAGE_BYTES / (1024 * 1024)
                        ),
                    )
                }
                None => judge(&line, &mut bucket, &seen, &answers),
            };
            if let Some(out) = out
                && (to.write_all(&out).await.is_err() || to.flush().await.is_err())
            {
                break;
            }
            line.clear();
            if line.capacity() > 256 * 1024 {
                line.shrink_to(64 * 1024);
            }
        }
    }
    if over.is_none() && !line.is_empty() {
        line.push(b'\n');
        if let Some(out) = judge(&line, &mut bucket, &seen, &answers) {
            let _ = to.write_all(&out).await;
        }
    }
    let _ = to.shutdown().await;
}

/// What goes on for one whole line: itself, an error answer in its place,
/// or nothing.
fn judge<'l>(
    line: &'l [u8],
    bucket: &mut Bucket,
    seen: &Seen,
    answers: &mpsc::Sender<Vec<u8>>,
) -> Option<Cow<'l, [u8]>> {
    if dk_proto::nests_deeper_than(line, MAX_MESSAGE_DEPTH) {
        Seen::count(&seen.too_deep);
        tracing::warn!(
            "the server sent a message nested deeper than {MAX_MESSAGE_DEPTH} levels: refused"
        );
        let tail = line.get(line.len().saturating_sub(ENDS)..).unwrap_or(line);
        let head = line.get(..ENDS.min(line.len())).unwrap_or(line);
        return refusal(
            head,
            tail,
            &format!(
                "the server's answer is nested deeper than {MAX_MESSAGE_DEPTH} levels: refused"
            ),
        );
    }
    let Ok(envelope) = serde_json::from_slice::<Envelope<'_>>(line) else {
        return Some(Cow::Borrowed(line));
    };
    let Some(method) = envelope.method else {
        return Some(Cow::Borrowed(line));
    };
    match envelope.id {
        Some(id) => {
            Seen::count(&seen.requests);
            if let Some((_, what)) = NEVER_OFFERED.iter().find(|(m, _)| *m == method) {
                Seen::count(&seen.refused);
                tracing::warn!(
                    "the MCP server asked for {what}, which the bridge does not offer: refused"
                );
                let error = JsonRpcError::new(
                    Some(id),
                    ErrorData::new(
                        ErrorCode::METHOD_NOT_FOUND,
                        format!("the client offers no {what}"),
                        None,
                    ),
                );
                if let Ok(mut answer) = serde_json::to_vec(&error) {
                    answer.push(b'\n');
                    let _ = answers.try_send(answer);
                }
                return None;
            }
        }
        None if method == "notifications/tools/list_changed" => {
            return Some(Cow::Borrowed(line));
        }
        None => {}
    }
    if bucket.take() {
        Some(Cow::Borrowed(line))
    } else {
        let dropped = seen.dropped.fetch_add(1, Ordering::Relaxed);
        if dropped.is_power_of_two() {
            tracing::warn!(
                dropped = dropped + 1,
                "the server sends notifications and requests faster than {PER_SECOND} a second: dropping them"
            );
        }
        None
    }
}

/// An error answer saying `why` to the request whose id `head` or `tail`
/// (the ends of a line) holds as a member of the top-level object.
fn refusal(head: &[u8], tail: &[u8], why: &str) -> Option<Cow<'static, [u8]>> {
    let id = id_in_head(head).or_else(|| id_in_tail(tail))?;
    let error = JsonRpcError::new(
        Some(NumberOrString::Number(id)),
        ErrorData::internal_error(why.to_owned(), None),
    );
    let mut out = serde_json::to_vec(&error).ok()?;
    out.push(b'\n');
    Some(Cow::Owned(out))
}

/// The numeric `id` member of the top-level object, read from the start
/// of its text.
fn id_in_head(head: &[u8]) -> Option<i64> {
    let mut depth = 0usize;
    let mut i = 0usize;
    let mut expecting_key = false;
    while let Some(&b) = head.get(i) {
        match b {
            b'{' | b'[' => {
                depth += 1;
                expecting_key = b == b'{' && depth == 1;
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            b',' if depth == 1 => expecting_key = true,
            b'"' => {
                let end = string_end(head, i)?;
                let key = head.get(i + 1..end)?;
                i = end;
                if depth == 1 && expecting_key {
                    expecting_key = false;
                    if key == b"id" {
                        let rest = head.get(end + 1..)?;
                        let rest = skip_space(rest);
                        let rest = skip_space(rest.strip_prefix(b":")?);
                        return number_at_start(rest);
                    }
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// The index of the quote that ends the string starting at `start`.
fn string_end(text: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    while let Some(&b) = text.get(i) {
        match b {
            b'\\' => i += 2,
            b'"' => return Some(i),
            _ => i += 1,
        }
    }
    None
}

/// The numeric `id` when it is the last member of the top-level object:
/// the text ends `"id": N }`, read backwards.
fn id_in_tail(tail: &[u8]) -> Option<i64> {
    let text = trim_end(tail);
    let text = trim_end(text.strip_suffix(b"}")?);
    let digits = text
        .iter()
        .rev()
        .take_while(|b| b.is_ascii_digit() || **b == b'-')
        .count();
    let (rest, number) = text.split_at(text.len().checked_sub(digits)?);
    let id = std::str::from_utf8(number).ok()?.parse().ok()?;
    let rest = trim_end(trim_end(rest).strip_suffix(b":")?);
    let rest = trim_end(rest.strip_suffix(b"\"id\"")?);
    (rest.ends_with(b",") || rest.ends_with(b"{")).then_some(id)
}

fn skip_space(text: &[u8]) -> &[u8] {
    let n = text.iter().take_while(|b| b.is_ascii_whitespace()).count();
    text.get(n..).unwrap_or_default()
}

fn trim_end(text: &[u8]) -> &[u8] {
    let n = text
        .iter()
        .rev()
        .take_while(|b| b.is_ascii_whitespace())
        .count();
    text.get(..text.len() - n).unwrap_or_default()
}

fn number_at_start(text: &[u8]) -> Option<i64> {
    let n = text
        .iter()
        .enumerate()
        .take_while(|(i, b)| b.is_ascii_digit() || (*i == 0 && **b == b'-'))
        .count();
    std::str::from_utf8(text.get(..n)?).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_found_at_the_top_level_only() {
        assert_eq!(
            id_in_head(br#"{"jsonrpc":"2.0","id":7,"result":{"#),
            Some(7)
        );
        assert_eq!(
            id_in_head(br#"{"result":{"id":3,"x":"\"id\":4"},"id": 9}"#),
            Some(9)
        );
        assert_eq!(id_in_head(br#"{"result":{"id":3,"content":[1,2"#), None);
        assert_eq!(id_in_tail(br#"...]},"jsonrpc":"2.0","id":12}"#), Some(12));
        assert_eq!(id_in_tail(b"...\"}, \"id\" : 5 }\n"), Some(5));
        assert_eq!(id_in_tail(br#"...{"id":12}}"#), None);
        assert_eq!(id_in_tail(br#"..."x\"id\":12"}"#), None);
    }

    async fn filtered(input: Vec<u8>) -> (Vec<u8>, Arc<Seen>, Vec<Vec<u8>>) {
        let seen = Arc::new(Seen::default());
        let mut out = Vec::new();
        let (answers, mut told) = mpsc::channel(8);
        run(input.as_slice(), &mut out, answers, Arc::clone(&seen)).await;
        let mut refusals = Vec::new();
        while let Ok(answer) = told.try_recv() {
            refusals.push(answer);
        }
        (out, seen, refusals)
    }

    #[tokio::test]
    async fn oversized_and_deep_answers_become_errors_and_floods_are_cut() {
        let big = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":4,\"result\":{{\"content\":[{{\"type\":\"text\",\"text\":\"{}\"}}]}}}}\n",
            "x".repeat(3 * MAX_MESSAGE_BYTES)
        );
        let deep = format!(
            "{{\"result\":{}1{},\"jsonrpc\":\"2.0\",\"id\":5}}\n",
            "[".repeat(100),
            "]".repeat(100)
        );
        let ok = "{\"jsonrpc\":\"2.0\",\"id\":6,\"result\":{}}\n";
        let mut input = Vec::new();
        input.extend_from_slice(big.as_bytes());
        input.extend_from_slice(deep.as_bytes());
        for _ in 0..1000 {
            input.extend_from_slice(
                b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{}}\n",
            );
        }
        input.extend_from_slice(
            b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n",
        );
        input.extend_from_slice(
            b"{\"jsonrpc\":\"2.0\",\"id\":\"s1\",\"method\":\"sampling/createMessage\",\"params\":{}}\n",
        );
        input.extend_from_slice(ok.as_bytes());
        let (out, seen, refusals) = filtered(input).await;
        assert_eq!(refusals.len(), 1);
        let refusal: serde_json::Value = serde_json::from_slice(&refusals[0]).unwrap();
        assert_eq!(refusal["id"], "s1");
        assert_eq!(refusal["error"]["code"], -32601);
        assert_eq!(seen.refused.load(Ordering::Relaxed), 1);
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let first: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(first["id"], 4);
        assert!(
            first["error"]["message"]
                .as_str()
                .unwrap()
                .contains("more than 2 MiB"),
            "{first}"
        );
        let second: serde_json::Value = serde_json::from_str(lines[1]).unwrap();
        assert_eq!(second["id"], 5);
        assert!(
            second["error"]["message"]
                .as_str()
                .unwrap()
                .contains("deeper")
        );
        assert!(text.contains("list_changed"));
        assert!(!text.contains("sampling"));
        assert!(text.ends_with(ok));
        assert_eq!(seen.oversized.load(Ordering::Relaxed), 1);
        assert_eq!(seen.too_deep.load(Ordering::Relaxed), 1);
        let dropped = seen.dropped.load(Ordering::Relaxed);
        assert!(dropped >= 700, "{dropped}");
        assert!(text.len() < 100_000);
    }
}
