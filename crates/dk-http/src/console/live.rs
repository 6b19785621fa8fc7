//! The console's live feed: server-sent events from the person channel,
//! and the microphones open on voice devices for every page's banner.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use tokio::sync::{broadcast, watch};

use crate::person::PersonEvent;

use super::pages;
use super::respond::Shared;
use super::session::Signed;

/// The live feed: a server-sent event for every prompt asked (with its
/// card's HTML) and closed, each with the count still waiting; a
/// `microphones` event (the banner's HTML) whenever a microphone opens or
/// closes; at the start, every prompt open now and the list of their ids,
/// and the microphones open now. Ends with the session.
pub(super) async fn live(
    State(shared): State<Shared>,
    axum::Extension(signed): axum::Extension<Signed>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let receiver = shared.vessel.person().subscribe();
    let mut microphones = shared.vessel.microphones().watch();
    microphones.mark_unchanged();
    let open = shared.vessel.person().pending();
    let mut first: VecDeque<Event> = VecDeque::new();
    let ids: Vec<u64> = open.iter().map(|p| p.id).collect();
    first.push_back(Event::default().event("sync").data(data(&Sync {
        pending: ids.len(),
        ids: &ids,
    })));
    for prompt in open {
        first.push_back(asked_event(&shared, &signed, prompt, ids.len()));
    }
    first.push_back(microphones_event(&shared, &signed));
    struct Feed {
        shared: Shared,
        signed: Signed,
        receiver: broadcast::Receiver<PersonEvent>,
        microphones: watch::Receiver<u64>,
        first: VecDeque<Event>,
    }
    let feed = Feed {
        shared,
        signed,
        receiver,
        microphones,
        first,
    };
    let stream = futures::stream::unfold(feed, |mut feed| async move {
        if let Some(event) = feed.first.pop_front() {
            return Some((Ok(event), feed));
        }
        loop {
            let next = tokio::select! {
                changed = feed.microphones.changed() => {
                    if changed.is_err() {
                        return None;
                    }
                    if !feed.shared.console.alive(&feed.signed.key) {
                        return None;
                    }
                    return Some((Ok(microphones_event(&feed.shared, &feed.signed)), feed));
                }
                next = tokio::time::timeout(Duration::from_secs(30), feed.receiver.recv()) => next,
            };
            if !feed.shared.console.alive(&feed.signed.key) {
                return None;
            }
            let pending = feed.shared.vessel.person().pending().len();
            let event = match next {
                Err(_) => continue,
                Ok(Ok(PersonEvent::Asked(prompt))) => {
                    asked_event(&feed.shared, &feed.signed, prompt, pending)
                }
                Ok(Ok(PersonEvent::Closed { id })) => Event::default()
                    .event("closed")
                    .data(data(&Closed { id, pending })),
                // Missed some: the page reloads to catch up.
                Ok(Err(broadcast::error::RecvError::Lagged(_))) => {
                    Event::default().event("reload").data("{}")
                }
                Ok(Err(broadcast::error::RecvError::Closed)) => return None,
            };
            return Some((Ok(event), feed));
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

fn asked_event(
    shared: &Shared,
    signed: &Signed,
    prompt: crate::person::PendingPrompt,
    pending: usize,
) -> Event {
    let body = crate::bodies::pending_body(prompt);
    let asked = Asked {
        id: body.id,
        pending,
        summary: pages::summary(&body),
        html: pages::prompt_card(&body, &shared.console.prefix(), &signed.csrf),
    };
    Event::default().event("asked").data(data(&asked))
}

/// The `microphones` event: the banner's content now, and how many are
/// open.
fn microphones_event(shared: &Shared, signed: &Signed) -> Event {
    let open = shared.vessel.microphones().list();
    let live = Microphones {
        count: open.len(),
        html: pages::microphones_live(&open, &shared.console.prefix(), &signed.csrf),
    };
    Event::default().event("microphones").data(data(&live))
}

/// The `microphones` event's data.
#[derive(serde::Serialize)]
struct Microphones {
    count: usize,
    html: String,
}

/// The `sync` event's data: the open prompts, by id.
#[derive(serde::Serialize)]
struct Sync<'a> {
    pending: usize,
    ids: &'a [u64],
}

/// The `closed` event's data: a prompt answered or gone.
#[derive(serde::Serialize)]
struct Closed {
    id: u64,
    pending: usize,
}

/// The `asked` event's data: a new prompt, its card ready to show.
#[derive(serde::Serialize)]
struct Asked {
    id: u64,
    pending: usize,
    summary: String,
    html: String,
}

/// An event's data as JSON text.
fn data(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).unwrap_or_default()
}
