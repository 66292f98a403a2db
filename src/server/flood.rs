//! A per-connection allowance of HTTP/2 control frames (PING, SETTINGS, PRIORITY, and
//! WINDOW_UPDATE apart).
//!
//! Why: the HTTP/2 library answers every PING and SETTINGS frame itself, and a client that sends
//! them as fast as it can, reading the answers, keeps the worker that serves its connection busy
//! doing nothing else (measured: 55 million PINGs answered in 4.5 s, and a normal client on the
//! same worker 100 times slower). The library offers no limit, so the bytes a connection reads
//! pass through [`Metered`], which reads the 9-byte frame headers as they go by and fails the
//! connection's reads once the client has used its allowance.
//!
//! The allowance: [`BURST`] frames at once, refilled at [`PER_SECOND`], and one more for every
//! request (HEADERS frame), so that a client which pings once per call (gRPC's bandwidth
//! probing does) never runs out, while a flood is cut off within a fraction of a second.
//! Connections that do not start with the HTTP/2 preface (HTTP/1.1 on the HTTP port) pass through
//! unmetered.
//!
//! WINDOW_UPDATE frames have an allowance of their own, of the same size: a client sends them as
//! it reads what the server sends, so each request earns one, and so does every
//! [`WINDOW_BYTES`] the server writes to the connection: a client that returns window for the
//! stream and the connection every 1 KiB it reads stays within it. A flood of them, with
//! nothing sent to earn them, ends the connection like a PING flood.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// Control frames a connection may send at once.
pub const BURST: u32 = 1000;
/// Control frames a connection may send per second, beyond its requests.
pub const PER_SECOND: u32 = 100;

/// The client connection preface (RFC 9113, section 3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const HEADERS: u8 = 0x1;
const PRIORITY: u8 = 0x2;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const WINDOW_UPDATE: u8 = 0x8;

/// Bytes the server writes for each WINDOW_UPDATE a client earns: two per KiB.
pub const WINDOW_BYTES: usize = 512;
const ACK: u8 = 0x1;

/// A connection's I/O whose reads are metered (see the module documentation).
pub struct Metered<IO> {
    io: IO,
    frames: Frames,
    allowance: Allowance,
    /// WINDOW_UPDATE frames (see the module documentation).
    window_updates: Allowance,
    /// Bytes written since the last WINDOW_UPDATE they earned.
    written: usize,
}

impl<IO> Metered<IO> {
    pub fn new(io: IO) -> Self {
        Metered {
            io,
            frames: Frames::Preface(0),
            allowance: Allowance::new(),
            window_updates: Allowance::new(),
            written: 0,
        }
    }

    /// `n` more bytes written: a WINDOW_UPDATE earned for every [`WINDOW_BYTES`].
    fn wrote(&mut self, n: usize) {
        if matches!(self.frames, Frames::Other) {
            return;
        }
        self.written += n;
        while self.written >= WINDOW_BYTES {
            self.written -= WINDOW_BYTES;
            self.window_updates.earn();
        }
    }

    /// Reads the frame headers in `bytes`; an error once the allowance is used up.
    fn scan(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            let (used, frame) = self.frames.advance(bytes);
            bytes = &bytes[used..];
            let Some((kind, flags)) = frame else { continue };
            let control = matches!(kind, PING | SETTINGS) && flags & ACK == 0 || kind == PRIORITY;
            if kind == HEADERS {
                self.allowance.earn();
                self.window_updates.earn();
            } else if kind == WINDOW_UPDATE && !self.window_updates.take() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "too many HTTP/2 WINDOW_UPDATE frames for what was sent",
                ));
            } else if control && !self.allowance.take() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "too many HTTP/2 control frames (PING, SETTINGS, PRIORITY)",
                ));
            }
        }
        Ok(())
    }
}

/// Where the reader is in the byte stream.
#[derive(Debug)]
enum Frames {
    /// This many bytes of the preface matched so far.
    Preface(usize),
    /// Not HTTP/2: nothing to meter.
    Other,
    /// Inside a frame header, this many of its 9 bytes read.
    Header([u8; 9], usize),
    /// Inside a frame's payload, this many bytes left.
    Payload(usize),
}

impl Frames {
    /// Consumes some of `bytes`: how many, and the (type, flags) of a frame header completed.
    fn advance(&mut self, bytes: &[u8]) -> (usize, Option<(u8, u8)>) {
        match self {
            Frames::Other => (bytes.len(), None),
            Frames::Preface(matched) => {
                let want = &PREFACE[*matched..];
                let n = want.len().min(bytes.len());
                *self = if bytes[..n] != want[..n] {
                    Frames::Other
                } else if *matched + n == PREFACE.len() {
                    Frames::Header([0; 9], 0)
                } else {
                    Frames::Preface(*matched + n)
                };
                (n, None)
            }
            Frames::Header(header, have) => {
                let n = (9 - *have).min(bytes.len());
                header[*have..*have + n].copy_from_slice(&bytes[..n]);
                *have += n;
                if *have < 9 {
                    return (n, None);
                }
                let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
                let frame = (header[3], header[4]);
                *self = if length == 0 {
                    Frames::Header([0; 9], 0)
                } else {
                    Frames::Payload(length)
                };
                (n, Some(frame))
            }
            Frames::Payload(left) => {
                let n = (*left).min(bytes.len());
                *left -= n;
                if *left == 0 {
                    *self = Frames::Header([0; 9], 0);
                }
                (n, None)
            }
        }
    }
}

/// A token bucket of control frames.
#[derive(Debug)]
struct Allowance {
    tokens: u32,
    refilled: Instant,
}

impl Allowance {
    fn new() -> Self {
        Allowance {
            tokens: BURST,
            refilled: Instant::now(),
        }
    }

    fn take(&mut self) -> bool {
        if self.tokens == 0 {
            let now = Instant::now();
            let earned =
                now.duration_since(self.refilled).as_millis() * u128::from(PER_SECOND) / 1000;
            if earned == 0 {
                return false;
            }
            self.tokens = u32::try_from(earned).unwrap_or(BURST).min(BURST);
            self.refilled = now;
        }
        self.tokens -= 1;
        true
    }

    fn earn(&mut self) {
        self.tokens = (self.tokens + 1).min(BURST);
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Metered<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.io).poll_read(cx, buf))?;
        let this = &mut *self;
        this.scan(&buf.filled()[before..])?;
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Metered<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = ready!(Pin::new(&mut self.io).poll_write(cx, buf))?;
        self.wrote(written);
        Poll::Ready(Ok(written))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = ready!(Pin::new(&mut self.io).poll_write_vectored(cx, bufs))?;
        self.wrote(written);
        Poll::Ready(Ok(written))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, payload: usize) -> Vec<u8> {
        let length = u32::try_from(payload).expect("small").to_be_bytes();
        let mut frame = vec![length[1], length[2], length[3], kind, flags, 0, 0, 0, 0];
        frame.resize(9 + payload, 0);
        frame
    }

    #[tokio::test]
    async fn a_ping_flood_is_cut_off_and_acks_and_requests_are_not_counted() {
        let mut metered = Metered::new(());
        let mut stream = PREFACE.to_vec();
        stream.extend(frame(SETTINGS, 0, 6));
        stream.extend(frame(SETTINGS, ACK, 0));
        // Fed byte by byte: headers split across reads are still read.
        for byte in &stream {
            metered
                .scan(std::slice::from_ref(byte))
                .expect("within the allowance");
        }
        for _ in 0..BURST * 2 {
            metered.scan(&frame(HEADERS, 0, 30)).expect("requests");
            metered
                .scan(&frame(PING, 0, 8))
                .expect("one PING per request");
            metered.scan(&frame(PING, ACK, 8)).expect("acks are free");
        }
        let mut flood = Ok(());
        for _ in 0..BURST * 2 {
            flood = flood.and_then(|()| metered.scan(&frame(PING, 0, 8)));
        }
        assert!(flood.is_err(), "a PING flood ends the connection");
    }

    #[tokio::test]
    async fn window_updates_are_earned_by_requests_and_bytes_sent() {
        let mut metered = Metered::new(());
        metered.scan(PREFACE).expect("preface");
        for _ in 0..BURST * 2 {
            metered.scan(&frame(HEADERS, 0, 30)).expect("requests");
            metered
                .scan(&frame(WINDOW_UPDATE, 0, 4))
                .expect("one per answer");
        }
        // A large answer read in small steps: one per WINDOW_BYTES sent.
        for _ in 0..3000 {
            metered.wrote(WINDOW_BYTES);
            metered
                .scan(&frame(WINDOW_UPDATE, 0, 4))
                .expect("earned by the bytes sent");
        }
        let mut flood = Ok(());
        for _ in 0..BURST * 2 {
            flood = flood.and_then(|()| metered.scan(&frame(WINDOW_UPDATE, 0, 4)));
        }
        assert!(flood.is_err(), "a WINDOW_UPDATE flood ends the connection");
    }

    #[tokio::test]
    async fn http1_passes_unmetered() {
        let mut metered = Metered::new(());
        metered.scan(b"GET / HTTP/1.1\r\n").expect("HTTP/1.1");
        for _ in 0..BURST * 2 {
            metered
                .scan(&frame(PING, 0, 8))
                .expect("not HTTP/2: not read");
        }
    }
}
