//! The API-key check in front of every route but `/health`: a bearer token
//! or Anthropic's `x-api-key` equal to one of `--api-key`'s keys (compared
//! in constant time), the handler then run as that key's tenant.

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::anthropic;
use super::app::App;
use super::error::ApiError;
use super::metrics as m;
use super::tenant;

/// Anthropic's header for the API key.
const X_API_KEY: &str = "x-api-key";

/// `--api-key`: a bearer token or an `x-api-key` header (Anthropic's) equal
/// to one of the keys (each compared in constant time); the handler runs as
/// that key's tenant (`tenant.rs`).
pub(super) async fn check_key(State(app): State<App>, req: Request, next: Next) -> Response {
    if app.api_keys.is_empty() {
        return next.run(req).await;
    }
    let Some(tenant) = tenant_asking(&app.api_keys, &req) else {
        m::request("auth", 401);
        let e = ApiError::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "missing or wrong API key: send Authorization: Bearer <one of the server's --api-key> (or x-api-key: <it>)",
        );
        if req.uri().path().starts_with(anthropic::MESSAGES) {
            return anthropic::error_response(e);
        }
        return e.into_response();
    };
    tenant::serve_as(tenant, next.run(req)).await
}

/// The tenant of the key `req` gives (None: none of `keys`).
fn tenant_asking(keys: &[String], req: &Request) -> Option<u64> {
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    let bearer = header(header::AUTHORIZATION.as_str()).and_then(bearer_token);
    let given = [bearer, header(X_API_KEY)];
    let mut tenant = None;
    for key in keys {
        let matches =
            |g: &Option<&str>| bool::from(g.unwrap_or("").as_bytes().ct_eq(key.as_bytes()));
        if given.iter().any(matches) {
            tenant = Some(tenant::tenant_of(key));
        }
    }
    tenant
}

/// The token of an `Authorization: Bearer TOKEN` value (the scheme's case
/// does not matter: RFC 9110).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}
