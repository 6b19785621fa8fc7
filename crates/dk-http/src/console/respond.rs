//! What the console's handlers share ([`Shared`]) and how they answer: an
//! HTML page, a refusal, a redirect, and the headers every answer carries.

use std::sync::Arc;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::pages;
use super::session::Console;
use crate::origins::LocalOrigins;
use crate::vessel::Vessel;

/// What the console's handlers share.
#[derive(Clone)]
pub(super) struct Shared {
    pub(super) vessel: Arc<Vessel>,
    pub(super) console: Arc<Console>,
    pub(super) local: Arc<LocalOrigins>,
}

/// The headers every console answer carries.
pub(super) fn harden(headers: &mut HeaderMap) {
    let fixed = [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        // Same-origin requests keep their Origin (a POST's is checked);
        // nothing leaves for another site.
        (header::REFERRER_POLICY, "same-origin"),
        (header::CACHE_CONTROL, "no-store"),
        (
            header::HeaderName::from_static("cross-origin-opener-policy"),
            "same-origin",
        ),
        (
            header::HeaderName::from_static("cross-origin-resource-policy"),
            "same-origin",
        ),
    ];
    for (name, value) in fixed {
        headers.insert(name, HeaderValue::from_static(value));
    }
}

/// A full HTML page with a status.
pub(super) fn html(status: StatusCode, body: String) -> Response {
    let mut response = (status, body).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    response
}

/// A page saying why a request was refused, with no session's details.
pub(super) fn refusal_page(status: StatusCode, message: &str) -> Response {
    html(status, pages::message_page("Refused", message))
}

/// `303 See Other` to `location` (a path on this listener).
pub(super) fn see_other(location: &str) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    if let Ok(value) = HeaderValue::from_str(location) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    response
}
