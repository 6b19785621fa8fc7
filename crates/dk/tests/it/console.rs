//! The console's links from the real `dk vessel` and `dk console`: the
//! link printed at start signs in once; `dk console` prints a fresh one
//! that works, also once; `--notify-url` tells a real endpoint of a
//! pairing with nothing but that it waits and where the console is.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;

use crate::process::{PATIENCE, Running, Scratch, hello, lamp_manifest, succeeded};

/// `GET path` on `addr`: the status and the `set-cookie` header, if any.
fn get(addr: SocketAddr, path: &str) -> (u16, Option<String>) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nhost: 127.0.0.1:{}\r\nconnection: close\r\n\r\n",
        addr.port()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer[9..12].parse().unwrap();
    let cookie = answer
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .map(str::to_owned);
    (status, cookie)
}

fn path_of(link: &str) -> String {
    link[link.find("/console/").unwrap()..].trim().to_owned()
}

#[test]
fn dk_console_prints_a_link_that_signs_in_once_and_no_link_goes_to_a_log() {
    let scratch = Scratch::new("console-links");
    let running = Running::start(&scratch);
    // Its standard output is a file here: the start text names the
    // console, not a link (it would sign in whoever reads the log).
    let said = running.said("paired devices");
    assert!(!said.contains("key="), "{said}");
    assert!(
        said.contains(&format!(
            "console              http://{}/console/ (sign in with the link `dk console` prints)",
            running.admin
        )),
        "{said}"
    );
    let mut links = Vec::new();
    for _ in 0..2 {
        let out = scratch.run(&["console"]);
        let link = succeeded(&out);
        // Under the console's secret path: `/console/<32 hex>/login`.
        let path = path_of(&link);
        assert!(
            link.trim()
                .starts_with(&format!("http://{}/console/", running.admin))
        );
        let (secret, rest) = path["/console/".len()..].split_once('/').unwrap();
        assert_eq!(secret.len(), 32, "{path}");
        assert!(rest.starts_with("login?key="), "{path}");
        // The printed start text does not hold the secret.
        assert!(!said.contains(secret), "{said}");
        links.push(path);
    }
    assert_ne!(links[0], links[1]);
    for link in &links {
        let (status, cookie) = get(running.admin, link);
        assert_eq!(status, 303);
        let cookie = cookie.unwrap();
        assert!(cookie.contains("HttpOnly; SameSite=Strict"), "{cookie}");
        let prefix = &link[..link.find("/login").unwrap()];
        assert!(cookie.contains(&format!("Path={prefix};")), "{cookie}");
        assert_eq!(get(running.admin, link).0, 403, "used once");
    }
    // The old address of the console's pages is no console.
    assert_eq!(get(running.admin, "/console/devices"), (404, None));
    running.interrupt();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_url_tells_a_real_endpoint_that_a_pairing_waits() {
    let endpoint = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/topic", endpoint.local_addr().unwrap());
    let (got, received) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        if let Ok((mut socket, _)) = endpoint.accept() {
            socket.set_read_timeout(Some(PATIENCE)).unwrap();
            let mut request = Vec::new();
            let mut buffer = [0u8; 4096];
            while let Ok(n) = socket.read(&mut buffer) {
                request.extend_from_slice(&buffer[..n]);
                let text = String::from_utf8_lossy(&request).to_string();
                if n == 0 || text.contains("waiting). Answer it") {
                    let _ = socket.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n");
                    let _ = got.send(text);
                    break;
                }
            }
        }
    });
    let scratch = Scratch::new("console-notify");
    let running = Running::start_with(&scratch, &["--notify-url", &url]);
    let said = running.said("notifications");
    // Only the scheme and host: the path (an ntfy topic) is a secret.
    let host = url.trim_end_matches("/topic");
    assert!(
        said.contains(&format!("notifications        {host}/…")),
        "{said}"
    );
    assert!(!said.contains("/topic"), "{said}");
    let _socket = hello(&running.url(), &lamp_manifest("notify-lamp"))
        .await
        .unwrap();
    let request = received.recv_timeout(PATIENCE).unwrap();
    assert!(request.starts_with("POST /topic HTTP/1.1"), "{request}");
    assert!(request.contains("title: dk: pairing waiting"), "{request}");
    assert!(request.contains(&format!("click: http://{}/console/", running.admin)));
    assert!(
        !request.contains("notify-lamp") && !request.contains("key="),
        "{request}"
    );
    running.interrupt();
}
