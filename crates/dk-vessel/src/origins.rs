//! Which `Host` and `Origin` a loopback listener accepts: the rule the
//! admin API and the MCP route share, so a web page open in the person's
//! browser (DNS rebinding, a cross-origin `fetch`) can reach neither.

use std::net::SocketAddr;

use axum::http::{HeaderMap, header};

/// The `Host` values and `Origin`s a listener bound to `local` accepts.
#[derive(Debug, Clone)]
pub(crate) struct LocalOrigins {
    pub(crate) hosts: Vec<String>,
    pub(crate) origins: Vec<String>,
}

impl LocalOrigins {
    /// Loopback names with the listener's port, and its own address when it
    /// is bound to one that is neither loopback nor unspecified.
    pub(crate) fn for_listener(local: SocketAddr) -> LocalOrigins {
        let port = local.port();
        let mut hosts = vec![
            format!("127.0.0.1:{port}"),
            format!("localhost:{port}"),
            format!("[::1]:{port}"),
        ];
        if !local.ip().is_unspecified() && !local.ip().is_loopback() {
            hosts.push(local.to_string());
        }
        let origins = hosts.iter().map(|h| format!("http://{h}")).collect();
        LocalOrigins { hosts, origins }
    }

    /// A Unix socket's: `Host: localhost`, and no `Origin` at all, since no
    /// web page is served there (a request that names one is refused).
    pub(crate) fn for_unix_socket() -> LocalOrigins {
        LocalOrigins {
            hosts: vec!["localhost".to_owned()],
            origins: Vec::new(),
        }
    }

    /// Why `headers` are refused, if they are.
    pub(crate) fn refusal(&self, headers: &HeaderMap) -> Option<&'static str> {
        let host = header_text(headers, header::HOST);
        if !host.is_some_and(|h| self.hosts.iter().any(|a| a.eq_ignore_ascii_case(h))) {
            return Some("the Host header must name this loopback listener");
        }
        let origin = header_text(headers, header::ORIGIN);
        if origin.is_some_and(|o| !self.origins.iter().any(|a| a.eq_ignore_ascii_case(o))) {
            return Some("requests from other origins are refused");
        }
        None
    }
}

/// A header's value, when it is text.
pub(crate) fn header_text(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}
