//! The console's own guard, run before every handler: Host and Origin,
//! the secret path, the session cookie, and for a `POST` the console's
//! Origin, `Sec-Fetch-Site` and the session's CSRF token, read from the
//! form.

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use subtle::ConstantTimeEq;

use crate::origins::single;

use super::pages;
use super::respond::{Shared, harden, html, refusal_page};
use super::session::{cookies_of, hash_of};

/// Largest form body the console reads (64 KiB).
const MAX_FORM_BYTES: usize = 64 * 1024;

/// A form's fields, read and checked (CSRF) before the handler runs.
#[derive(Clone, Default)]
pub(super) struct Form(Vec<(String, String)>);

impl Form {
    pub(super) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub(super) fn all(&self, name: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .collect()
    }
}

/// Host and Origin for every request; under `/console/`, the secret path
/// or a plain 404; a session for all but the login, the assets and the
/// ways in; for a `POST`, this listener's own Origin, a same-origin fetch
/// and the session's CSRF token in the form.
pub(super) async fn guard(State(shared): State<Shared>, request: Request, next: Next) -> Response {
    let mut response = checked(shared, request, next).await;
    harden(response.headers_mut());
    response
}

async fn checked(shared: Shared, request: Request, next: Next) -> Response {
    let headers = request.headers();
    if let Some(why) = shared.local.refusal(headers) {
        return refusal_page(StatusCode::FORBIDDEN, why);
    }
    // The ways in (`/`, `/console`, `/console/`) and the assets hold no
    // secret and need no session. Under `/console/`, anything but the
    // secret path is not found, whoever asks: no cookie is read or set.
    let path = request.uri().path();
    let Some(rest) = path.strip_prefix("/console/") else {
        return next.run(request).await;
    };
    let (segment, tail) = rest.split_once('/').unwrap_or((rest, ""));
    if rest.is_empty() || segment == "assets" {
        return next.run(request).await;
    }
    if !shared.console.is_secret(segment) {
        // An old bookmark or a forwarded address from before a restart
        // lands here too: say so, and where a fresh link comes from.
        return html(
            StatusCode::NOT_FOUND,
            pages::message_page(
                "No such page",
                "The console's address changes each time the vessel starts. \
                 Run `dk console` for a fresh login link.",
            ),
        );
    }
    if !rest.contains('/') || tail == "login" {
        return next.run(request).await;
    }
    let session = cookies_of(headers)
        .into_iter()
        .find_map(|cookie| shared.console.session(cookie));
    let Some(signed) = session else {
        return html(StatusCode::UNAUTHORIZED, pages::signed_out_page());
    };
    if request.method() == Method::GET || request.method() == Method::HEAD {
        let mut request = request;
        request.extensions_mut().insert(signed);
        return next.run(request).await;
    }
    if request.method() != Method::POST {
        return refusal_page(
            StatusCode::METHOD_NOT_ALLOWED,
            "the console takes GET and POST",
        );
    }
    // A POST must say where it comes from, and that must be this console.
    match single(headers, header::ORIGIN) {
        Ok(Some(_)) => {}
        _ => {
            return refusal_page(
                StatusCode::FORBIDDEN,
                "a change needs the console's own Origin header",
            );
        }
    }
    if let Some(site) = headers.get("sec-fetch-site")
        && site.as_bytes() != b"same-origin"
    {
        return refusal_page(
            StatusCode::FORBIDDEN,
            "a change must come from the console's own pages",
        );
    }
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_FORM_BYTES).await else {
        return refusal_page(StatusCode::PAYLOAD_TOO_LARGE, "the form is too large");
    };
    let form = Form(
        form_urlencoded::parse(&bytes)
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect(),
    );
    let presented = form.get("csrf").unwrap_or("");
    if !bool::from(hash_of(presented).ct_eq(&hash_of(&signed.csrf))) {
        return refusal_page(
            StatusCode::FORBIDDEN,
            "the form's CSRF token is missing or not this session's: reload the page",
        );
    }
    let mut request = Request::from_parts(parts, Body::from(Bytes::new()));
    request.extensions_mut().insert(signed);
    request.extensions_mut().insert(form);
    next.run(request).await
}
