//! The HTTP response body: either one buffer or a stream of chunks (watch events).

use std::{
    convert::Infallible,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::mpsc;

/// A response body the server sends.
#[derive(Debug)]
pub enum ReplyBody {
    /// A complete body, sent at once.
    Full(Option<Bytes>),
    /// Chunks sent as they arrive (one watch event per chunk, flushed individually); ends when the
    /// sender is dropped.
    Stream(mpsc::Receiver<Bytes>),
}

impl Body for ReplyBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            ReplyBody::Full(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            ReplyBody::Stream(rx) => rx
                .poll_recv(cx)
                .map(|chunk| chunk.map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, ReplyBody::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ReplyBody::Full(Some(d)) => SizeHint::with_exact(d.len() as u64),
            ReplyBody::Full(None) => SizeHint::with_exact(0),
            ReplyBody::Stream(_) => SizeHint::default(),
        }
    }
}
