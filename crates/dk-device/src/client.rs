//! The device side of a vessel's `/device` WebSocket route: connect (dk/2
//! by default: the Noise handshake, the vessel's key checked against the
//! pin), pair (`device:hello`, then the commit/nonce/reveal exchange and the
//! computed code) or authenticate (`device:auth`), serve calls with the
//! serve loop, and reconnect with backoff when the connection drops.
//!
//! The device's key and the vessel's pinned key are kept in a key file (a
//! v1 device keeps its token in a token file; both mode 0600, written whole
//! or not at all) so the device reconnects without the person. Close codes
//! that mean the person must act (pairing refused, credential refused,
//! manifest changed, unpaired) end the client with a [`ClientError`]
//! instead of retrying (on dk/2 only when announced inside the channel);
//! every other end of a connection is retried.

mod backoff;
mod connection;
mod entropy;
mod error;
mod key_file;
mod options;
mod private_file;
mod tls;
mod token_file;

use std::future::Future;

use futures::FutureExt as _;
use tokio::time::Instant;

use backoff::full_jitter;
pub use backoff::{DEFAULT_INITIAL_BACKOFF, DEFAULT_MAX_BACKOFF, STABLE_SESSION};
pub use connection::{CONNECT_TIMEOUT, SessionEnd, connect_once};
use connection::{check_url, printable};
/// How long a dk/2 handshake may take unless
/// [`ClientOptions::handshake_timeout`] says otherwise.
pub use dk_device_core::HANDSHAKE_TIMEOUT;
use dk_device_core::reconnect::{Outside, Verdict, believe};
pub use error::ClientError;
pub use options::{ClientOptions, ConnectionEvent};

use crate::Device;

/// Runs the device against a vessel until `shutdown` resolves: connects,
/// pairs or authenticates, serves calls, and reconnects after every
/// connection that ends for a reason the device can outlast (a close with
/// another code, a dropped connection, a connection that cannot be opened).
///
/// A paired dk/2 device also retries what reaches it outside the channel and
/// would otherwise stop it: an HTTP 403 at the upgrade, an upgrade without
/// `dk.2` (both forgeable by anyone on the path); it stops only on refusals
/// announced inside the channel. A device that is not paired yet stops on
/// them, for the person beside it to see.
///
/// Reconnects wait a random time up to a ceiling that starts at the
/// initial backoff and doubles each time, capped at the maximum; a
/// connection that lasted [`STABLE_SESSION`] starts the ceiling over. Nothing
/// is re-sent after a reconnect: calls in flight when a connection ended are
/// the vessel's to fail, and a call id received before (on this connection
/// or an earlier one, among the last [`ServeOptions::remember_calls`](crate::ServeOptions::remember_calls)) is
/// answered with an error, never run again. Events queued while disconnected wait in the event
/// queue (up to its capacity) and go out on the next connection.
///
/// Returns `Ok(())` once `shutdown` resolves (an open connection is closed
/// with code 1000 after in-flight calls get the grace period), or the first
/// [`ClientError`] that retrying cannot fix.
pub async fn run_client(
    device: &Device,
    mut options: ClientOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ClientError> {
    // Every address is checked before the first connection: one that can
    // never be used is not found only when the others fail.
    for url in &options.others {
        check_url(url)?;
    }
    let shutdown = shutdown.fuse();
    tokio::pin!(shutdown);
    let mut attempts: u32 = 0;
    // Failures that grow the backoff: not a busy vessel's 503.
    let mut doublings: u32 = 0;
    // Addresses that failed in a row since the last wait: the next one is
    // tried at once until every one has.
    let mut failed_in_round: usize = 0;
    loop {
        attempts = attempts.saturating_add(1);
        let started = Instant::now();
        let mut busy = None;
        // A session that opened proves its address: the failures in a row
        // count from there.
        let mut opened = false;
        let last = match connect_once(device, &mut options, shutdown.as_mut()).await {
            Ok(SessionEnd::Shutdown) => return Ok(()),
            Ok(SessionEnd::Closed { code, reason }) => {
                opened = true;
                format!("closed by the vessel: {code} {reason}")
            }
            Ok(SessionEnd::Lost) => {
                opened = true;
                "connection lost".to_owned()
            }
            Err(ClientError::Connect(why)) => why,
            Err(e @ ClientError::Busy { retry_after }) => {
                busy = Some(retry_after);
                e.to_string()
            }
            // A paired dk/2 device's refusals come inside the channel; a
            // 403 or an upgrade without `dk.2` comes before it, where anyone
            // on the path can forge one to stop the device for good (the
            // core's rule, `reconnect::believe`).
            Err(e @ (ClientError::Refused(_) | ClientError::NotDk2))
                if believe(outside(&e), options.is_paired_dk2()) == Verdict::Retry =>
            {
                tracing::warn!(
                    error = %e,
                    "an answer from outside the channel, which anyone on the path can forge: trying again"
                );
                format!("{e} (outside the channel: trying again)")
            }
            Err(e) => return Err(e),
        };
        if started.elapsed() >= STABLE_SESSION {
            attempts = 0;
            doublings = 0;
            failed_in_round = 0;
        }
        if options.max_attempts.is_some_and(|max| attempts >= max) {
            return Err(ClientError::GaveUp { attempts, last });
        }
        if opened {
            failed_in_round = 0;
        }
        if busy.is_none() {
            failed_in_round = failed_in_round.saturating_add(1);
            options.move_on();
            if failed_in_round < options.addresses() {
                // Another address has not failed yet: try it now.
                tracing::info!(url = %printable(&options.url), %last, "moving on to the next address");
                options.tell(&ConnectionEvent::Disconnected {
                    why: last,
                    retry_in: std::time::Duration::ZERO,
                });
                continue;
            }
            failed_in_round = 0;
        }
        let delay = match busy {
            // The vessel is up and asked for a wait: spread over it, so a
            // fleet refused at once does not come back at once, and no
            // longer, so a storm of reconnects ends soon.
            Some(retry_after) => full_jitter(retry_after, retry_after, 0),
            None => {
                let delay = full_jitter(options.initial_backoff, options.max_backoff, doublings);
                doublings = doublings.saturating_add(1);
                delay
            }
        };
        let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        tracing::info!(url = %printable(&options.url), %last, delay_ms, "reconnecting");
        options.tell(&ConnectionEvent::Disconnected {
            why: last,
            retry_in: delay,
        });
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            () = tokio::time::sleep(delay) => {}
        }
    }
}

/// The core's name for a refusal that came before the channel.
fn outside(error: &ClientError) -> Outside {
    match error {
        ClientError::NotDk2 => Outside::NotDk2,
        _ => Outside::Forbidden,
    }
}

#[cfg(test)]
mod tests;
