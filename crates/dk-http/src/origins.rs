//! Which `Host` and `Origin` a loopback listener accepts: the rule the
//! admin API and the MCP route share, so a web page open in the person's
//! browser (DNS rebinding, a cross-origin `fetch`) can reach neither.

use std::net::SocketAddr;

use axum::http::{HeaderMap, header};

/// The `Host` values and `Origin`s a listener bound to `local` accepts.
#[derive(Debug, Clone)]
pub struct LocalOrigins {
    /// The `Host` values accepted.
    pub hosts: Vec<String>,
    /// The `Origin`s accepted.
    pub origins: Vec<String>,
}

impl LocalOrigins {
    /// Loopback names with the listener's port, and its own address when it
    /// is bound to one that is neither loopback nor unspecified.
    pub fn for_listener(local: SocketAddr) -> LocalOrigins {
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
    pub fn for_unix_socket() -> LocalOrigins {
        LocalOrigins {
            hosts: vec!["localhost".to_owned()],
            origins: Vec::new(),
        }
    }

    /// Why `headers` are refused, if they are.
    pub fn refusal(&self, headers: &HeaderMap) -> Option<&'static str> {
        let host = match single(headers, header::HOST) {
            Ok(host) => host,
            Err(why) => return Some(why),
        };
        if !host.is_some_and(|h| self.hosts.iter().any(|a| a.eq_ignore_ascii_case(h))) {
            return Some("the Host header must name this loopback listener");
        }
        let origin = match single(headers, header::ORIGIN) {
            Ok(origin) => origin,
            Err(why) => return Some(why),
        };
        if origin.is_some_and(|o| !self.origins.iter().any(|a| a.eq_ignore_ascii_case(o))) {
            return Some("requests from other origins are refused");
        }
        None
    }
}

/// The one value of header `name`, if there is one; refused when it is
/// given twice (a check of the first alone could be passed by the second)
/// or is not visible ASCII (it cannot be compared, and must not count as
/// absent).
pub(crate) fn single(
    headers: &HeaderMap,
    name: header::HeaderName,
) -> Result<Option<&str>, &'static str> {
    let mut values = headers.get_all(&name).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(if name == header::HOST {
            "a request carries one Host header"
        } else {
            "a request carries at most one Origin header"
        });
    }
    first.to_str().map(Some).map_err(|_| {
        if name == header::HOST {
            "the Host header must be plain ASCII"
        } else {
            "the Origin header must be plain ASCII"
        }
    })
}

/// A header's value, when it is text.
pub fn header_text(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, HeaderValue, header};

    use super::LocalOrigins;

    #[track_caller]
    fn check(headers: &[(header::HeaderName, &[u8])], expected: Option<&str>) {
        let local = LocalOrigins::for_listener("127.0.0.1:7778".parse().unwrap());
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(name.clone(), HeaderValue::from_bytes(value).unwrap());
        }
        assert_eq!(local.refusal(&map), expected, "{headers:?}");
    }

    #[test]
    fn one_plain_host_and_at_most_one_plain_origin() {
        let host = (header::HOST, &b"127.0.0.1:7778"[..]);
        let own = (header::ORIGIN, &b"http://127.0.0.1:7778"[..]);
        check(std::slice::from_ref(&host), None);
        check(&[host.clone(), own.clone()], None);
        // A second Host or Origin could pass where the first is checked.
        check(
            &[host.clone(), (header::HOST, b"evil.example")],
            Some("a request carries one Host header"),
        );
        check(
            &[
                host.clone(),
                own.clone(),
                (header::ORIGIN, b"https://evil.example"),
            ],
            Some("a request carries at most one Origin header"),
        );
        // An Origin that is not plain ASCII is not taken for no Origin.
        check(
            &[
                host.clone(),
                (header::ORIGIN, "https://évil.example".as_bytes()),
            ],
            Some("the Origin header must be plain ASCII"),
        );
        check(
            &[(header::HOST, "127.0.0.1:7778\u{e9}".as_bytes())],
            Some("the Host header must be plain ASCII"),
        );
        check(
            &[],
            Some("the Host header must name this loopback listener"),
        );
        check(
            &[host, (header::ORIGIN, b"https://evil.example")],
            Some("requests from other origins are refused"),
        );
    }
}
