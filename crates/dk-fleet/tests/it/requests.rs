//! Routed requests: answered once, sealed both ways, bound to the
//! incarnation of the member asked, and each failure a clear error at the
//! right time: a member not present, NATS down, or a member that leaves
//! while asked at once (whoever else listens on the server); a silent
//! member at the deadline; a reply larger than one message whole; a
//! request captured before its member restarted refused after.

use std::time::{Duration, Instant};

use dk_fleet::{MemberId, RequestError};
use futures::StreamExt as _;

use crate::harness::{Nats, all_present, eventually, member, nats_or_skip};

/// How long the tests let a request wait: a request that fails "at once"
/// fails with its own error, never `DeadlinePassed`.
const DEADLINE: Duration = Duration::from_secs(30);

fn deadline() -> Instant {
    Instant::now() + DEADLINE
}

/// Answers every request `fleet` is sent with "echo <payload> from <sender>",
/// checking that each carries a deadline later than the server's start.
async fn echo(fleet: &dk_fleet::Fleet) -> tokio::task::JoinHandle<()> {
    let started = Instant::now();
    let mut served = fleet.serve().await.unwrap();
    tokio::spawn(async move {
        while let Some(request) = served.next().await {
            let mut answer = b"echo ".to_vec();
            answer.extend_from_slice(request.payload());
            answer.extend_from_slice(format!(" from {}", request.from()).as_bytes());
            assert!(request.deadline() > started);
            request.respond(&answer).await.unwrap();
        }
    })
}

#[tokio::test]
async fn requests_reach_the_member_and_fail_clearly() {
    let Some(binary) = nats_or_skip("requests_reach_the_member_and_fail_clearly") else {
        return;
    };
    let mut nats = Nats::start(binary, "");
    // Someone subscribed to everything: NATS then never says "no
    // responders", and requests must still fail at once.
    let listener = async_nats::connect(nats.url()).await.unwrap();
    let _everything = listener.subscribe(">").await.unwrap();
    listener.flush().await.unwrap();
    let a = member(&nats, "a").await;
    let b = member(&nats, "b").await;
    let silent = member(&nats, "silent").await;
    let server = echo(&b).await;
    let mut unanswered = silent.serve().await.unwrap();
    let (got, mut reached) = tokio::sync::mpsc::unbounded_channel();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Some(request) = unanswered.next().await {
            held.push(request);
            let _ = got.send(());
        }
    });
    all_present(&[&a, &b, &silent]).await;

    let reply = a.request(b.member(), b"hello", deadline()).await.unwrap();
    assert_eq!(reply, b"echo hello from a");

    // Not present: at once, not at the deadline (which would be
    // `DeadlinePassed`).
    let nobody = MemberId::new("nobody").unwrap();
    assert_eq!(
        a.request(&nobody, b"hello", deadline()).await,
        Err(RequestError::NoSuchMember(nobody))
    );

    // A silent member: the deadline, and not before it.
    let short = Instant::now() + Duration::from_millis(300);
    let asked = a.request(silent.member(), b"hello", short).await;
    let answered = Instant::now();
    assert_eq!(asked, Err(RequestError::DeadlinePassed));
    assert!(answered >= short);
    reached.recv().await.unwrap();

    // A member that leaves while asked: at once, not at the deadline.
    let asking = a.request(silent.member(), b"hello", deadline());
    let leaving = async {
        // Left once the request reached it.
        reached.recv().await.unwrap();
        silent.leave().await.unwrap();
    };
    let (asked, ()) = tokio::join!(asking, leaving);
    assert_eq!(
        asked,
        Err(RequestError::MemberGone(silent.member().clone()))
    );

    // NATS down: a request fails at once, not at its deadline.
    nats.stop();
    eventually("a sees NATS gone", || !a.is_connected()).await;
    assert_eq!(
        a.request(b.member(), b"hello", deadline()).await,
        Err(RequestError::NatsDown)
    );

    // Back on the same port: the clients reconnect and requests work again.
    nats.resume();
    eventually("a and b back", || a.is_connected() && b.is_connected()).await;
    let again = dk_testkit::eventually_async("a request answered again", || async {
        a.request(b.member(), b"again", deadline()).await.ok()
    })
    .await;
    assert_eq!(again, b"echo again from a");
    server.abort();
    hold.abort();
}

#[tokio::test]
async fn a_reply_larger_than_one_message_arrives_whole() {
    let Some(binary) = nats_or_skip("a_reply_larger_than_one_message_arrives_whole") else {
        return;
    };
    let nats = Nats::start(binary, "");
    let a = member(&nats, "a").await;
    let b = member(&nats, "b").await;
    all_present(&[&a, &b]).await;
    let mut served = b.serve().await.unwrap();
    // 3 MiB: three times the server's 1 MiB message limit.
    let big: Vec<u8> = (0..3 * 1024 * 1024).map(|i| (i % 253) as u8).collect();
    let sent = big.clone();
    let server = tokio::spawn(async move {
        while let Some(request) = served.next().await {
            let reply: &[u8] = if request.payload() == b"big" {
                &sent
            } else {
                &sent[..300 * 1024]
            };
            request.respond(reply).await.unwrap();
        }
    });
    assert_eq!(a.max_message(), 1024 * 1024);
    let reply = a.request(b.member(), b"300k", deadline()).await.unwrap();
    assert_eq!(reply, big[..300 * 1024]);
    let reply = a.request(b.member(), b"big", deadline()).await.unwrap();
    assert_eq!(reply, big);
    // A request itself is one message: larger is refused at once.
    assert_eq!(
        a.request(b.member(), &vec![0; 2 * 1024 * 1024], deadline())
            .await,
        Err(RequestError::TooLarge)
    );
    server.abort();
}

#[tokio::test]
async fn a_request_sent_again_after_its_member_restarted_is_refused() {
    let Some(binary) = nats_or_skip("a_request_sent_again_after_its_member_restarted_is_refused")
    else {
        return;
    };
    let nats = Nats::start(binary, "");
    let outsider = async_nats::connect(nats.url()).await.unwrap();
    let mut recorded = outsider.subscribe("dk.fleet.request.b").await.unwrap();
    outsider.flush().await.unwrap();
    let a = member(&nats, "a").await;
    let b = member(&nats, "b").await;
    all_present(&[&a, &b]).await;
    let (serving, mut served) = serve_into(&b).await;
    let reply = a.request(b.member(), b"unlock the door", deadline()).await;
    assert_eq!(reply.unwrap(), b"done");
    assert_eq!(served.recv().await.unwrap(), b"unlock the door");
    let captured = tokio::time::timeout(DEADLINE, recorded.next())
        .await
        .unwrap()
        .unwrap();

    // Within the same run, the copy is a replay: not served.
    let replay = || {
        outsider.publish_with_reply(
            "dk.fleet.request.b",
            captured.reply.clone().unwrap(),
            captured.payload.clone(),
        )
    };
    replay().await.unwrap();
    eventually("the replay counted", || b.dropped().replayed >= 1).await;

    // b restarts (its replay memory gone with it); the copy, sent again,
    // was meant for its earlier incarnation: refused, and counted.
    b.leave().await.unwrap();
    serving.abort();
    let b = member(&nats, "b").await;
    let (_serving, mut served) = serve_into(&b).await;
    all_present(&[&a, &b]).await;
    let mut inbox = outsider
        .subscribe(captured.reply.clone().unwrap())
        .await
        .unwrap();
    replay().await.unwrap();
    eventually("the copy counted as stale", || b.dropped().stale >= 1).await;
    // b said at once that it refuses it (a sealed answer on the inbox).
    assert!(
        tokio::time::timeout(DEADLINE, inbox.next())
            .await
            .unwrap()
            .is_some()
    );
    // Nothing was served: the next request b serves is a's new one.
    let reply = a.request(b.member(), b"after", deadline()).await;
    assert_eq!(reply.unwrap(), b"done");
    assert_eq!(served.recv().await.unwrap(), b"after");
}

/// Serves `fleet`'s requests in a task, answering each "done" and passing
/// its payload on.
async fn serve_into(
    fleet: &dk_fleet::Fleet,
) -> (
    tokio::task::JoinHandle<()>,
    tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>,
) {
    let mut requests = fleet.serve().await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        while let Some(request) = requests.next().await {
            let _ = tx.send(request.payload().to_vec());
            request.respond(b"done").await.unwrap();
        }
    });
    (task, rx)
}
