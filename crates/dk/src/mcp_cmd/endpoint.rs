//! Where the bridge sends requests: the vessel's MCP socket, or an
//! `http://` URL the person names (read with the `url` crate).

use std::path::{Path, PathBuf};

use crate::home::MCP_SOCKET;

/// The vessel's MCP endpoint, taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Endpoint {
    /// The URL as given, or the socket's path, for messages.
    pub(super) url: String,
    /// `host[:port]` (the port when it is not 80): the `Host` header;
    /// `localhost` on the socket.
    pub(super) authority: String,
    /// Where to connect.
    pub(super) place: Place,
    /// The request target: path and query.
    pub(super) target: String,
}

/// Where the bridge connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Place {
    /// The URL's host with the port made explicit.
    Tcp(String),
    /// The vessel's MCP socket, used only once it is shown to be this
    /// user's.
    Unix {
        /// The socket.
        socket: PathBuf,
        /// What to say when nothing answers on it.
        absent: String,
    },
}

impl Endpoint {
    /// The MCP socket in the vessel's data directory `data_dir`; `absent`
    /// is what to say when no vessel answers there.
    pub(super) fn socket(data_dir: &Path, absent: &str) -> Endpoint {
        let socket = data_dir.join(MCP_SOCKET);
        Endpoint {
            url: format!("`{}`", socket.display()),
            authority: "localhost".to_owned(),
            place: Place::Unix {
                socket,
                absent: absent.to_owned(),
            },
            target: "/mcp".to_owned(),
        }
    }

    /// Reads an `http://host[:port][/path][?query]` URL; a fragment is
    /// dropped.
    pub(super) fn parse(text: &str) -> Result<Endpoint, String> {
        let url = url::Url::parse(text).map_err(|e| format!("`{text}` is not a URL: {e}"))?;
        match url.scheme() {
            "http" => {}
            "https" => {
                return Err(format!(
                    "`{text}`: https is not supported; the vessel serves MCP over plain HTTP on loopback"
                ));
            }
            _ => return Err(format!("`{text}` is not an http:// URL")),
        }
        let no_user = || format!("`{text}` must name a host and no user");
        // `http:///mcp` would read as the host `mcp`: the host must follow `//`.
        if !url.username().is_empty() || url.password().is_some() || text.contains(":///") {
            return Err(no_user());
        }
        let host = url
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(no_user)?;
        let authority = match url.port() {
            Some(port) => format!("{host}:{port}"),
            None => host.to_owned(),
        };
        let port = url.port_or_known_default().unwrap_or(80);
        let target = match url.query() {
            Some(query) => format!("{}?{query}", url.path()),
            None => url.path().to_owned(),
        };
        Ok(Endpoint {
            url: text.to_owned(),
            authority,
            place: Place::Tcp(format!("{host}:{port}")),
            target,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{Endpoint, Place};

    /// The `Host` header, the address connected to, the request target.
    type Parts = (&'static str, &'static str, &'static str);

    #[test]
    fn endpoints() {
        let cases: [(&str, Option<Parts>); 10] = [
            (
                "http://127.0.0.1:7779/mcp",
                Some(("127.0.0.1:7779", "127.0.0.1:7779", "/mcp")),
            ),
            (
                "http://localhost/mcp?x=1#frag",
                Some(("localhost", "localhost:80", "/mcp?x=1")),
            ),
            ("http://[::1]:9/", Some(("[::1]:9", "[::1]:9", "/"))),
            ("http://[::1]", Some(("[::1]", "[::1]:80", "/"))),
            (
                "http://localhost:80/mcp",
                Some(("localhost", "localhost:80", "/mcp")),
            ),
            ("https://127.0.0.1:7779/mcp", None),
            ("ws://127.0.0.1:7779/mcp", None),
            ("http://user@host/mcp", None),
            ("http:///mcp", None),
            ("127.0.0.1:7779", None),
        ];
        for (url, expected) in cases {
            let got = Endpoint::parse(url).ok();
            let got = got.as_ref().map(|e| {
                let connect = match &e.place {
                    Place::Tcp(address) => address.as_str(),
                    Place::Unix { .. } => "unix",
                };
                (e.authority.as_str(), connect, e.target.as_str())
            });
            assert_eq!(got, expected, "{url}");
        }
        let socket = Endpoint::socket(std::path::Path::new("/h/vessel"), "none");
        assert_eq!(
            (socket.authority.as_str(), socket.target.as_str()),
            ("localhost", "/mcp")
        );
        assert_eq!(
            socket.place,
            Place::Unix {
                socket: "/h/vessel/mcp.sock".into(),
                absent: "none".to_owned()
            }
        );
    }
}
