//! A call served inline, before and after the service's own work: the gRPC spec's checks of a
//! request (method, content-type, encoding), then a unary call: its one message read within the
//! connection's budgets and the body timeout, its `grpc-timeout`, its answer, and `UNAVAILABLE`
//! when the drain ends first.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use h2::RecvStream;
use h2::server::SendResponse;
use http::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use prost::Message;
use tonic::Status;

use super::CallLimits;
use super::framing::{
    GRPC_ENCODING, GRPC_TIMEOUT, Received, message_length, send_message, send_status,
    send_status_with,
};
use crate::server::budget::{ConnectionBudget, Held};

/// Why a request is answered before any service sees it.
pub(super) enum Refusal {
    /// Not gRPC at all: an HTTP status.
    Http(http::StatusCode),
    /// gRPC, but not what slidegate speaks: a status, perhaps with `grpc-accept-encoding`.
    Grpc(Status, bool),
}

impl Refusal {
    pub(super) fn send(self, respond: &mut SendResponse<Bytes>) -> Result<(), h2::Error> {
        match self {
            Refusal::Http(code) => {
                let mut head = http::Response::new(());
                *head.status_mut() = code;
                if code == http::StatusCode::METHOD_NOT_ALLOWED {
                    head.headers_mut()
                        .insert(http::header::ALLOW, HeaderValue::from_static("POST"));
                }
                respond.send_response(head, true).map(drop)
            }
            Refusal::Grpc(status, accept_encoding) => {
                send_status_with(respond, &status, accept_encoding)
            }
        }
    }
}

/// The gRPC spec's checks of a request's method, content-type and encoding.
pub(super) fn refuse(request: &http::Request<RecvStream>) -> Option<Refusal> {
    if request.method() != http::Method::POST {
        return Some(Refusal::Http(http::StatusCode::METHOD_NOT_ALLOWED));
    }
    let content_type = request
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let Some(subtype) = content_type.strip_prefix("application/grpc") else {
        return Some(Refusal::Http(http::StatusCode::UNSUPPORTED_MEDIA_TYPE));
    };
    let subtype = subtype.split(';').next().unwrap_or("");
    if !matches!(subtype, "" | "+proto") {
        return Some(Refusal::Grpc(
            Status::unimplemented(format!(
                "content-type {content_type} is not supported; send application/grpc (protobuf)"
            )),
            false,
        ));
    }
    match request.headers().get(&GRPC_ENCODING) {
        Some(encoding) if encoding.as_bytes() != b"identity" => Some(Refusal::Grpc(
            Status::unimplemented(format!(
                "grpc-encoding {} is not supported; send identity",
                String::from_utf8_lossy(encoding.as_bytes())
            )),
            true,
        )),
        _ => None,
    }
}

/// A unary call served inline: read one message, run `handler`, answer its message or status.
/// A call still open when the drain ends answers UNAVAILABLE.
///
/// Not async itself: the request's head (its headers, some 200 bytes) is read here and dropped,
/// so that the call's future, moved into its box when the call starts, holds only the body.
pub(super) fn unary<Req, Resp, F, Fut>(
    request: http::Request<RecvStream>,
    respond: SendResponse<Bytes>,
    limits: CallLimits,
    handler: F,
) -> impl Future<Output = ()>
where
    Req: Message + Default,
    Resp: Message,
    F: FnOnce(Req) -> Fut,
    Fut: Future<Output = Result<Resp, Status>>,
{
    let timeout = grpc_timeout(request.headers());
    unary_body(request.into_body(), timeout, respond, limits, handler)
}

async fn unary_body<Req, Resp, F, Fut>(
    body: RecvStream,
    timeout: Option<Duration>,
    mut respond: SendResponse<Bytes>,
    limits: CallLimits,
    handler: F,
) where
    Req: Message + Default,
    Resp: Message,
    F: FnOnce(Req) -> Fut,
    Fut: Future<Output = Result<Resp, Status>>,
{
    let outcome = async {
        let body = read_message::<Req>(body, &limits.budget);
        let message = within(limits.body_timeout, body, || {
            Status::deadline_exceeded(
                "the request's message did not arrive within the body timeout",
            )
        })
        .await?;
        handler(message).await
    };
    let outcome = async {
        match timeout {
            None => outcome.await,
            Some(timeout) => {
                within(timeout, outcome, || {
                    Status::deadline_exceeded("the call's grpc-timeout passed")
                })
                .await
            }
        }
    };
    let outcome = tokio::select! {
        biased;
        outcome = outcome => outcome,
        () = crate::server::stopped(limits.drain_over) => Err(shutting_down()),
    };
    // An error here means the client reset the stream or left: nobody is waiting any more.
    let _ = match outcome {
        Ok(message) => send_message(&mut respond, &message),
        Err(status) => send_status(&mut respond, &status),
    };
}

pin_project_lite::pin_project! {
    /// A future given up after `limit` with `expired`'s status: `tokio::time::timeout`, except
    /// that its timer (a clock read, a handle on the runtime's timer, an entry in its wheel) is
    /// made only if the future does not finish on its first poll. Most calls do: a memory-store
    /// call whose message came with its headers is answered in that poll. So the limit counts
    /// from that poll's end, a few microseconds after the call began.
    struct Within<F> {
        #[pin]
        future: F,
        limit: Duration,
        expired: fn() -> Status,
        #[pin]
        timer: Option<tokio::time::Sleep>,
    }
}

fn within<F>(limit: Duration, future: F, expired: fn() -> Status) -> Within<F> {
    Within {
        future,
        limit,
        expired,
        timer: None,
    }
}

impl<F: Future<Output = Result<T, Status>>, T> Future for Within<F> {
    type Output = Result<T, Status>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let Poll::Ready(outcome) = this.future.poll(cx) {
            return Poll::Ready(outcome);
        }
        if this.timer.is_none() {
            this.timer.set(Some(tokio::time::sleep(*this.limit)));
        }
        match this.timer.as_pin_mut().map(|timer| timer.poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(Err((this.expired)())),
            _ => Poll::Pending,
        }
    }
}

pub(super) fn shutting_down() -> Status {
    Status::unavailable("the server is shutting down")
}

/// Reads a request body that holds exactly one gRPC message and decodes it.
///
/// Flow-control window goes back to the client only for a message still incomplete, and only
/// once the bytes held fit the connection's and the process's budgets ([`crate::server::budget`]); a
/// complete message's window goes back once it is decoded.
async fn read_message<M: Message + Default>(
    mut body: RecvStream,
    budget: &ConnectionBudget,
) -> Result<M, Status> {
    let mut received = Received::default();
    let mut held = Held::default();
    let mut unreleased = 0;
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|error| Status::cancelled(error.to_string()))?;
        unreleased += chunk.len();
        received.push(chunk);
        let complete = match message_length(received.bytes())? {
            Some(length) if received.bytes().len() > 5 + length => {
                return Err(Status::invalid_argument("a unary call takes one message"));
            }
            Some(length) => received.bytes().len() == 5 + length,
            None => false,
        };
        if !complete {
            if !budget.reserve(&mut held, unreleased).await {
                return Err(Status::resource_exhausted(
                    "the request's message does not fit the connection's buffer budget",
                ));
            }
            let _ = body.flow_control().release_capacity(unreleased);
            unreleased = 0;
        }
    }
    let _ = body.flow_control().release_capacity(unreleased);
    let bytes = received.bytes();
    let Some(length) = message_length(bytes)? else {
        return Err(Status::invalid_argument("the request has no message"));
    };
    let message = bytes
        .get(5..5 + length)
        .ok_or_else(|| Status::invalid_argument("the request ends inside its message"))?;
    M::decode(message)
        .map_err(|error| Status::invalid_argument(format!("cannot decode the request: {error}")))
}

/// `grpc-timeout`: up to 8 digits and a unit (`H`, `M`, `S`, `m`, `u`, `n`). Anything else is
/// ignored, as if the client had set no deadline.
fn grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(&GRPC_TIMEOUT)?.as_bytes();
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let amount: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(amount * 3600),
        b'M' => Duration::from_secs(amount * 60),
        b'S' => Duration::from_secs(amount),
        b'm' => Duration::from_millis(amount),
        b'u' => Duration::from_micros(amount),
        b'n' => Duration::from_nanos(amount),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeout(value: &'static str) -> Option<Duration> {
        let mut headers = HeaderMap::new();
        headers.insert(&GRPC_TIMEOUT, HeaderValue::from_static(value));
        grpc_timeout(&headers)
    }

    #[test]
    fn grpc_timeouts_parse_as_the_spec_writes_them() {
        assert_eq!(timeout("20m"), Some(Duration::from_millis(20)));
        assert_eq!(timeout("1S"), Some(Duration::from_secs(1)));
        assert_eq!(timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(timeout("99999999n"), Some(Duration::from_nanos(99_999_999)));
        for bad in ["", "m", "20", "20x", "+20m", "123456789m", "2 m"] {
            assert_eq!(timeout(bad), None, "{bad:?}");
        }
    }

    fn expired() -> Status {
        Status::deadline_exceeded("expired")
    }

    /// A future that finishes in its first poll needs no timer: even a limit of zero keeps it.
    #[tokio::test]
    async fn a_future_ready_at_once_is_kept_whatever_the_limit() {
        let outcome = within(Duration::ZERO, async { Ok(7) }, expired).await;
        assert_eq!(outcome.ok(), Some(7));
    }

    /// One that waits gets the limit (real time: 20 ms against a second), and one that waits less
    /// than the limit keeps its answer.
    #[tokio::test]
    async fn a_waiting_future_is_given_up_at_the_limit() {
        let started = std::time::Instant::now();
        let slow = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok(1)
        };
        let status = within(Duration::from_millis(20), slow, expired)
            .await
            .expect_err("given up");
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
        assert!(
            started.elapsed() < Duration::from_millis(900),
            "given up at the limit"
        );
        let quick = async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            Ok(2)
        };
        let outcome = within(Duration::from_secs(5), quick, expired).await;
        assert_eq!(outcome.ok(), Some(2));
    }
}
