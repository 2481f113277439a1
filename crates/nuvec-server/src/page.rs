//! The chat page at `/`: static HTML, CSS and JavaScript built into the binary (from
//! `crates/nuvec-server/page/`), open like `/health` so a browser can load it before it has a
//! key; the page's own requests to `/v1` carry the key its user gives it.

use std::sync::Arc;

use axum::extract::Path;
use axum::http::{header, HeaderName, Method, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::error::ApiError;
use crate::AppState;

/// The page's files under `/page/`: name, content type, text.
const ASSETS: &[(&str, &str, &str)] = &[
    ("chat.css", "text/css; charset=utf-8", include_str!("../page/chat.css")),
    ("chat.js", "text/javascript; charset=utf-8", include_str!("../page/chat.js")),
    ("markdown.js", "text/javascript; charset=utf-8", include_str!("../page/markdown.js")),
];

const INDEX: &str = include_str!("../page/index.html");

/// Only the page's own files and its own server: model text that got past the renderer's
/// escaping still could not run a script or send anything elsewhere.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                      img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// `GET /` and `GET /page/{file}`.
pub(crate) fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/", get(index)).route("/page/{file}", get(asset))
}

fn file(content_type: &'static str, text: &'static str) -> Response {
    let headers: [(HeaderName, &str); 4] = [
        (header::CONTENT_TYPE, content_type),
        // A new binary's page is picked up at the next load, not after a cache expires.
        (header::CACHE_CONTROL, "no-cache"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::CONTENT_SECURITY_POLICY, POLICY),
    ];
    (headers, text).into_response()
}

async fn index() -> Response {
    file("text/html; charset=utf-8", INDEX)
}

async fn asset(Path(name): Path<String>, method: Method, uri: Uri) -> Response {
    named(&name).unwrap_or_else(|| ApiError::no_route(method.as_str(), uri.path()).into_response())
}

fn named(name: &str) -> Option<Response> {
    ASSETS.iter().find(|(n, _, _)| *n == name).map(|&(_, content_type, text)| file(content_type, text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_names_only_files_it_has_and_has_none_it_does_not_name() {
        let named_by_index: Vec<&str> = INDEX.split("\"/page/").skip(1).filter_map(|s| s.split('"').next()).collect();
        let mut served: Vec<&str> = ASSETS.iter().map(|(n, _, _)| *n).collect();
        let mut wanted = named_by_index.clone();
        served.sort_unstable();
        wanted.sort_unstable();
        assert_eq!(served, wanted, "index.html names {named_by_index:?}");
        for name in wanted {
            let response = named(name).unwrap();
            assert_eq!(response.headers()[header::CONTENT_SECURITY_POLICY], POLICY);
            assert_eq!(response.headers()[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        }
        assert!(named("../index.html").is_none() && named("").is_none());
    }
}
