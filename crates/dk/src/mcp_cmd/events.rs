//! Reading a `text/event-stream` answer as it arrives (with the
//! `sse-stream` crate): the data of each event, and a bound on what may
//! arrive before an event completes.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::{Stream, StreamExt as _};
use hyper::body::Bytes;
use sse_stream::{Error, SseStream};

/// The data of each complete event read from `chunks` (its data lines
/// joined with `\n`), or why reading stopped: the body broke, the stream is
/// not an event stream, or more than `max` bytes came without completing
/// an event. Comments (keep-alive pings) and events without data are
/// skipped; an event cut off by the stream's end is dropped, as the format
/// says.
pub(super) fn event_data<S, E>(chunks: S, max: usize) -> impl Stream<Item = Result<String, String>>
where
    S: Stream<Item = Result<Bytes, E>>,
    E: std::fmt::Display,
{
    // Bytes read since the last event: more than `max` is refused.
    let since_event = Arc::new(AtomicUsize::new(0));
    let counted = {
        let since_event = Arc::clone(&since_event);
        chunks.map(move |chunk| {
            let chunk = chunk.map_err(|e| io::Error::other(e.to_string()))?;
            let read = since_event.fetch_add(chunk.len(), Ordering::Relaxed) + chunk.len();
            if read > max {
                return Err(io::Error::other(format!("event longer than {max} bytes")));
            }
            Ok(chunk)
        })
    };
    SseStream::from_bytes_stream(counted).filter_map(move |event| {
        let data = match event {
            Ok(event) => {
                since_event.store(0, Ordering::Relaxed);
                event.data.map(Ok)
            }
            Err(Error::Body(error)) => Some(Err(error.to_string())),
            Err(error) => Some(Err(format!("not an event stream: {error}"))),
        };
        std::future::ready(data)
    })
}

#[cfg(test)]
mod tests {
    use futures::StreamExt as _;
    use hyper::body::Bytes;

    use super::event_data;

    async fn events(chunks: &[&str], max: usize) -> Vec<Result<String, String>> {
        let chunks: Vec<Result<Bytes, std::io::Error>> = chunks
            .iter()
            .map(|c| Ok(Bytes::copy_from_slice(c.as_bytes())))
            .collect();
        event_data(futures::stream::iter(chunks), max)
            .collect()
            .await
    }

    #[tokio::test]
    async fn event_streams() {
        let cases: [(&[&str], &[&str]); 7] = [
            (&[], &[]),
            (&["data: {\"a\":1}\n\n"], &["{\"a\":1}"]),
            (&["id: 0\nretry: 3000\ndata:\n\n"], &[""]),
            (&[": ping\n\n", "event: message\r\ndata: x\r\n\r\n"], &["x"]),
            (
                &["data: {\"a\"", ":1}\n", "\n", "data: 2\n"],
                &["{\"a\":1}"],
            ),
            (&["data: a\ndata: b\n\n"], &["a\nb"]),
            (&["data:no-space\n\n"], &["no-space"]),
        ];
        for (chunks, expected) in cases {
            let got = events(chunks, 1 << 20).await;
            let expected: Vec<Result<String, String>> =
                expected.iter().map(|e| Ok((*e).to_owned())).collect();
            assert_eq!(got, expected, "{chunks:?}");
        }
    }

    #[tokio::test]
    async fn an_event_longer_than_the_bound_stops_the_stream() {
        let long = format!("data: {}", "x".repeat(40));
        let got = events(&["data: a\n\n", &long, "\n\n"], 32).await;
        assert_eq!(got.first(), Some(&Ok("a".to_owned())));
        assert_eq!(
            got.get(1),
            Some(&Err("event longer than 32 bytes".to_owned()))
        );
        // Events that each fit pass however long the stream.
        let many: Vec<String> = (0..100).map(|i| format!("data: {i}\n\n")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(events(&many, 32).await.len(), 100);
    }
}
