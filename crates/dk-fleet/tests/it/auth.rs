//! Joining: NATS credentials from private files (user and password, or a
//! token), the fleet key required and private; no error shows a secret.

use std::fs;
use std::os::unix::fs::PermissionsExt;

use dk_fleet::{Auth, ConnectError, Fleet, FleetOptions, KeyError, MemberId};

use crate::harness::{Nats, nats_or_skip, options};

const PASSWORD: &str = "pw-c0rrect-h0rse";
const TOKEN: &str = "tok-8f1e2d3c";

#[tokio::test]
async fn user_and_password_from_a_file() {
    let Some(binary) = nats_or_skip("user_and_password_from_a_file") else {
        return;
    };
    let nats = Nats::start(
        binary,
        &format!("authorization {{ user: fleet, password: \"{PASSWORD}\" }}"),
    );
    let good = nats.private_file("password", &format!("{PASSWORD}\n"));
    let bad = nats.private_file("wrong", "pw-wrong-one\n");
    let user = |file| Auth::UserPassword {
        user: "fleet".into(),
        password_file: file,
    };
    let a = Fleet::connect(options(&nats, "a").auth(user(good.clone())))
        .await
        .unwrap();
    assert!(a.is_connected());
    let shown = format!("{:?}", options(&nats, "a").auth(user(good.clone())));
    assert!(!shown.contains(PASSWORD), "{shown}");

    for refused in [options(&nats, "b").auth(user(bad)), options(&nats, "b")] {
        let error = Fleet::connect(refused).await.unwrap_err();
        assert!(matches!(error, ConnectError::Nats(_)), "{error:?}");
        assert!(!error.to_string().contains("pw-"), "{error}");
    }

    // A password file others may read is refused before connecting.
    fs::set_permissions(&good, fs::Permissions::from_mode(0o644)).unwrap();
    let error = Fleet::connect(options(&nats, "b").auth(user(good)))
        .await
        .unwrap_err();
    assert!(matches!(error, ConnectError::Credential(_)), "{error:?}");
    a.leave().await.unwrap();
}

#[tokio::test]
async fn a_token_from_a_file() {
    let Some(binary) = nats_or_skip("a_token_from_a_file") else {
        return;
    };
    let nats = Nats::start(binary, &format!("authorization {{ token: \"{TOKEN}\" }}"));
    let token = nats.private_file("token", TOKEN);
    let a = Fleet::connect(options(&nats, "a").auth(Auth::TokenFile(token)))
        .await
        .unwrap();
    let wrong = nats.private_file("wrong", "tok-wrong");
    let error = Fleet::connect(options(&nats, "b").auth(Auth::TokenFile(wrong)))
        .await
        .unwrap_err();
    assert!(matches!(error, ConnectError::Nats(_)), "{error:?}");
    assert!(!error.to_string().contains("tok-"), "{error}");
    a.leave().await.unwrap();
}

#[tokio::test]
async fn no_fleet_key_no_fleet() {
    let Some(binary) = nats_or_skip("no_fleet_key_no_fleet") else {
        return;
    };
    let nats = Nats::start(binary, "");
    let key = nats.key_file();

    let missing = FleetOptions::new(
        [nats.url()],
        MemberId::new("a").unwrap(),
        nats.dir.path().join("none.key"),
    );
    let error = Fleet::connect(missing).await.unwrap_err();
    assert!(
        matches!(error, ConnectError::Key(KeyError::File(_))),
        "{error:?}"
    );

    let not_a_key = nats.private_file("garbage.key", "not hex\n");
    let options = FleetOptions::new([nats.url()], MemberId::new("a").unwrap(), not_a_key);
    let error = Fleet::connect(options).await.unwrap_err();
    assert!(
        matches!(error, ConnectError::Key(KeyError::NotAKey(_))),
        "{error:?}"
    );

    fs::set_permissions(&key, fs::Permissions::from_mode(0o640)).unwrap();
    let error = Fleet::connect(crate::harness::options(&nats, "a"))
        .await
        .unwrap_err();
    assert!(
        matches!(error, ConnectError::Key(KeyError::File(_))),
        "{error:?}"
    );
    assert!(!error.to_string().contains("4b4b"), "{error}");

    // Credentials in an address are refused: they would be shown.
    fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).unwrap();
    let options = FleetOptions::new(
        [format!("nats://fleet:secret@127.0.0.1:{}", nats.port)],
        MemberId::new("a").unwrap(),
        key,
    );
    let error = Fleet::connect(options).await.unwrap_err();
    assert!(
        matches!(error, ConnectError::CredentialsInAddress),
        "{error:?}"
    );
}

#[tokio::test]
async fn tls_checked_against_the_ca_file() {
    let Some(binary) = nats_or_skip("tls_checked_against_the_ca_file") else {
        return;
    };
    let nats = Nats::start_with(binary, |dir| {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        fs::write(dir.join("server.pem"), cert.cert.pem()).unwrap();
        fs::write(dir.join("server.key"), cert.signing_key.serialize_pem()).unwrap();
        let other = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        fs::write(dir.join("other.pem"), other.cert.pem()).unwrap();
        format!(
            "tls {{ cert_file: \"{0}/server.pem\", key_file: \"{0}/server.key\" }}",
            dir.display()
        )
    });
    let url = format!("tls://localhost:{}", nats.port);
    let options = |member: &str, ca: &str| {
        FleetOptions::new(
            [url.clone()],
            MemberId::new(member).unwrap(),
            nats.key_file(),
        )
        .tls_ca_file(nats.dir.path().join(ca))
    };
    let a = Fleet::connect(options("a", "server.pem")).await.unwrap();
    let b = Fleet::connect(options("b", "server.pem")).await.unwrap();
    let mut events = b.events().await.unwrap();
    a.publish(b"over tls").await.unwrap();
    let event = tokio::time::timeout(std::time::Duration::from_secs(2), events.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(event.payload, b"over tls");

    // A server whose certificate the CA file does not vouch for is refused,
    // and so is a member that does not speak TLS.
    let error = Fleet::connect(options("c", "other.pem")).await.unwrap_err();
    assert!(matches!(error, ConnectError::Nats(_)), "{error:?}");
    let plain = FleetOptions::new(
        [format!("nats://localhost:{}", nats.port)],
        MemberId::new("d").unwrap(),
        nats.key_file(),
    );
    let error = Fleet::connect(plain).await.unwrap_err();
    assert!(matches!(error, ConnectError::Nats(_)), "{error:?}");
    a.leave().await.unwrap();
    b.leave().await.unwrap();
}

#[tokio::test]
async fn tls_required_against_a_plain_server_says_so() {
    let Some(binary) = nats_or_skip("tls_required_against_a_plain_server_says_so") else {
        return;
    };
    let nats = Nats::start_with(binary, |dir| {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        fs::write(dir.join("ca.pem"), cert.cert.pem()).unwrap();
        String::new()
    });
    let options = FleetOptions::new(
        [format!("tls://localhost:{}", nats.port)],
        MemberId::new("a").unwrap(),
        nats.key_file(),
    )
    .tls_ca_file(nats.dir.path().join("ca.pem"));
    let error = Fleet::connect(options).await.unwrap_err().to_string();
    // Not a bare "IO error": what was asked, and what to check.
    assert!(error.contains("TLS"), "{error}");
}
