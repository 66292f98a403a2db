//! The operator token: what lets a caller change state on the operator listener.
//!
//! The operator listener is plaintext and unauthenticated by default, and often bound to every
//! interface (Prometheus must reach it), so reading is open and writing is not: an endpoint that
//! changes state needs `--admin-token-file`, and then `Authorization: Bearer <the file's token>`.
//! The file is read on every such request (they are rare), so a rotated token applies at once;
//! surrounding whitespace (a trailing newline) is not part of it. The comparison takes the same
//! time wherever the two differ. A client certificate never stands in for the token.

use std::path::{Path, PathBuf};

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

/// Why the token file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("cannot read the admin token file {path}: {source}")]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the admin token file {0} is empty")]
    Empty(PathBuf),
}

/// `--admin-token-file`.
#[derive(Debug, Clone)]
pub struct AdminToken {
    file: PathBuf,
}

impl AdminToken {
    /// The token of `file`, checked once here (a missing or empty file stops the server at
    /// start) and read again at every use.
    pub fn open(file: &Path) -> Result<AdminToken, TokenError> {
        let token = AdminToken {
            file: file.to_owned(),
        };
        token.read()?;
        Ok(token)
    }

    fn read(&self) -> Result<String, TokenError> {
        let text =
            std::fs::read_to_string(&self.file).map_err(|source| TokenError::Unreadable {
                path: self.file.clone(),
                source,
            })?;
        let token = text.trim();
        if token.is_empty() {
            return Err(TokenError::Empty(self.file.clone()));
        }
        Ok(token.to_owned())
    }
}

/// Why a state-changing request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No `--admin-token-file`: such endpoints are off (403).
    Off,
    /// The token file cannot be read now (503; the log says why).
    Unreadable,
    /// No `Authorization: Bearer` header (401).
    Missing,
    /// Another token (401).
    Wrong,
}

/// Whether `headers` may change state.
pub fn authorize(token: Option<&AdminToken>, headers: &HeaderMap) -> Result<(), Refusal> {
    let token = token.ok_or(Refusal::Off)?;
    let expected = token.read().map_err(|error| {
        tracing::error!(%error, "refused a state-changing request: no token to check it against");
        Refusal::Unreadable
    })?;
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .ok_or(Refusal::Missing)?;
    if bool::from(given.as_bytes().ct_eq(expected.as_bytes())) {
        Ok(())
    } else {
        Err(Refusal::Wrong)
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let unauthorized = |message: &'static str| {
            (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                message,
            )
                .into_response()
        };
        match self {
            Refusal::Off => (
                StatusCode::FORBIDDEN,
                "this endpoint changes state and is off: start slidegate with \
                 --admin-token-file FILE (SLIDEGATE_ADMIN_TOKEN_FILE) and send \
                 `Authorization: Bearer <the file's token>`\n",
            )
                .into_response(),
            Refusal::Unreadable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "the admin token file cannot be read; see the server's log\n",
            )
                .into_response(),
            Refusal::Missing => unauthorized(
                "missing `Authorization: Bearer <token>` (the token of --admin-token-file)\n",
            ),
            Refusal::Wrong => unauthorized("wrong token\n"),
        }
    }
}
