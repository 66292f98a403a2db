//! Every method but `ShouldRateLimit` (health, reflection, unknown ones, which answer
//! `UNIMPLEMENTED`) goes to tonic's [`Routes`]: the h2 request body becomes an `http_body::Body`
//! for tonic, and tonic's answer is copied back within the client's flow-control window. Those
//! services stay tonic's; only the call Envoy makes on every request skips it.

use std::future::poll_fn;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use http_body::{Body as _, Frame};
use tokio::sync::watch;
use tonic::codegen::Service;
use tonic::service::Routes;

use super::call::shutting_down;
use super::framing::{send_status, status_trailers};
use crate::service::PeerKey;

/// Any other method: hand the stream to tonic's routes and copy their answer back. A stream still
/// open when the drain ends gets `UNAVAILABLE` (in trailers, if its answer had begun).
pub(super) async fn bridge(
    routes: Routes,
    mut request: http::Request<RecvStream>,
    peer: PeerKey,
    mut respond: SendResponse<Bytes>,
    drain_over: watch::Receiver<bool>,
) {
    // The peer, for a service that bounds what one peer holds (RLQS streams and buckets).
    request.extensions_mut().insert(peer);
    let mut stream = None;
    let drained = {
        let work = bridge_answer(routes, request, &mut respond, &mut stream);
        tokio::select! {
            () = work => false,
            () = crate::server::stopped(drain_over) => true,
        }
    };
    if drained {
        let _ = match stream.as_mut() {
            Some(stream) => stream.send_trailers(status_trailers(&shutting_down())),
            None => send_status(&mut respond, &shutting_down()),
        };
    }
}

async fn bridge_answer(
    mut routes: Routes,
    request: http::Request<RecvStream>,
    respond: &mut SendResponse<Bytes>,
    stream: &mut Option<SendStream<Bytes>>,
) {
    let request = request.map(|body| tonic::body::Body::new(Incoming::new(body)));
    let ready =
        poll_fn(|cx| Service::<http::Request<tonic::body::Body>>::poll_ready(&mut routes, cx));
    let Ok(()) = ready.await;
    let Ok(response) = routes.call(request).await;
    let (head, body) = response.into_parts();
    let end = body.is_end_stream();
    let Ok(sending) = respond.send_response(http::Response::from_parts(head, ()), end) else {
        return;
    };
    let sending = stream.insert(sending);
    if !end {
        let _ = copy_body(body, sending).await;
    }
}

/// Copies a response body (a health `Watch` stream among them) until it ends or the client
/// resets the stream.
async fn copy_body(
    mut body: tonic::body::Body,
    stream: &mut SendStream<Bytes>,
) -> Result<(), h2::Error> {
    loop {
        let next = tokio::select! {
            frame = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)) => frame,
            _ = poll_fn(|cx| stream.poll_reset(cx)) => return Ok(()),
        };
        let frame = match next {
            None => return stream.send_data(Bytes::new(), true),
            Some(Ok(frame)) => frame,
            Some(Err(_)) => {
                stream.send_reset(h2::Reason::INTERNAL_ERROR);
                return Ok(());
            }
        };
        match frame.into_data() {
            Ok(data) => {
                if !send_within_window(stream, data).await? {
                    return Ok(());
                }
            }
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    return stream.send_trailers(trailers);
                }
            }
        }
    }
}

/// Sends `data` as the client's flow-control window allows: h2 queues only what the window (and
/// [`MAX_QUEUED_REPLY`](super::MAX_QUEUED_REPLY)) grants, and the body is not read further until
/// this returns. `false` when the client reset the stream meanwhile.
async fn send_within_window(
    stream: &mut SendStream<Bytes>,
    mut data: Bytes,
) -> Result<bool, h2::Error> {
    while !data.is_empty() {
        stream.reserve_capacity(data.len());
        let granted = poll_fn(|cx| {
            if stream.poll_reset(cx).is_ready() {
                return Poll::Ready(None);
            }
            stream.poll_capacity(cx)
        })
        .await;
        let granted = match granted {
            Some(granted) => granted?,
            None => return Ok(false),
        };
        if granted > 0 {
            stream.send_data(data.split_to(granted.min(data.len())), false)?;
        }
    }
    Ok(true)
}

/// A request body as an `http_body::Body`, for tonic's routes.
struct Incoming {
    stream: RecvStream,
    data_done: bool,
}

impl Incoming {
    fn new(stream: RecvStream) -> Self {
        Incoming {
            stream,
            data_done: false,
        }
    }
}

impl http_body::Body for Incoming {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        if !self.data_done {
            match ready!(self.stream.poll_data(cx)) {
                Some(Ok(data)) => {
                    let _ = self.stream.flow_control().release_capacity(data.len());
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(error)) => return Poll::Ready(Some(Err(error))),
                None => self.data_done = true,
            }
        }
        self.stream
            .poll_trailers(cx)
            .map(|trailers| trailers.transpose().map(|t| t.map(Frame::trailers)))
    }

    fn is_end_stream(&self) -> bool {
        self.stream.is_end_stream()
    }
}
