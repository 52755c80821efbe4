//! `PermitBody`: a response body that keeps its request's permit until the
//! body has been read to the end or dropped.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http_body::{Body, Frame, SizeHint};

use crate::Permit;

pin_project_lite::pin_project! {
    /// Wraps a response body and holds the request's [`Permit`] until the
    /// body ends, fails or is dropped: a slow download still counts as a
    /// request in flight, and the next request to the host is paced from
    /// the moment the body is complete.
    #[derive(Debug)]
    pub struct PermitBody<B> {
        #[pin]
        inner: B,
        permit: Option<Permit>,
    }
}

impl<B: Body> PermitBody<B> {
    /// `inner`, holding `permit` until it is done. A body that is already
    /// at its end (an empty body) releases the permit at once.
    pub fn new(inner: B, permit: Permit) -> Self {
        let permit = (!inner.is_end_stream()).then_some(permit);
        Self { inner, permit }
    }

    /// True while the permit is held.
    pub fn holds_permit(&self) -> bool {
        self.permit.is_some()
    }

    /// The wrapped body.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }
}

impl<B: Body> Body for PermitBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let mut this = self.project();
        let frame = ready!(this.inner.as_mut().poll_frame(cx));
        let done = match &frame {
            None | Some(Err(_)) => true,
            Some(Ok(_)) => this.inner.is_end_stream(),
        };
        if done {
            this.permit.take(); // released: the response is complete
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HostKey;
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use std::collections::VecDeque;
    use std::convert::Infallible;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    fn counting_permit() -> (Permit, Arc<AtomicUsize>) {
        let released = Arc::new(AtomicUsize::new(0));
        let r = Arc::clone(&released);
        let permit = Permit::new(
            HostKey::parse("http://a.test/").unwrap(),
            Duration::ZERO,
            move || {
                r.fetch_add(1, Ordering::SeqCst);
            },
        );
        (permit, released)
    }

    /// A body of several frames that does not know its end in advance.
    struct Frames(VecDeque<&'static str>);

    impl Body for Frames {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            Poll::Ready(
                self.0
                    .pop_front()
                    .map(|s| Ok(Frame::data(Bytes::from_static(s.as_bytes())))),
            )
        }
    }

    #[tokio::test]
    async fn the_permit_is_released_when_the_body_ends() {
        let (permit, released) = counting_permit();
        let mut body = PermitBody::new(Frames(VecDeque::from(["a", "b"])), permit);
        assert!(body.frame().await.is_some());
        assert!(body.frame().await.is_some());
        assert_eq!(
            released.load(Ordering::SeqCst),
            0,
            "released before the end"
        );
        assert!(body.frame().await.is_none());
        assert_eq!(released.load(Ordering::SeqCst), 1);
        drop(body);
        assert_eq!(released.load(Ordering::SeqCst), 1, "released twice");
    }

    #[tokio::test]
    async fn a_dropped_body_releases_and_an_empty_one_never_holds() {
        let (permit, released) = counting_permit();
        let body = PermitBody::new(Full::new(Bytes::from_static(b"unread")), permit);
        assert!(body.holds_permit());
        drop(body);
        assert_eq!(released.load(Ordering::SeqCst), 1);

        let (permit, released) = counting_permit();
        let empty = PermitBody::new(Full::new(Bytes::new()), permit);
        assert!(!empty.holds_permit());
        assert_eq!(released.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_body_that_knows_its_end_releases_on_its_last_frame() {
        let (permit, released) = counting_permit();
        let mut body = PermitBody::new(Full::new(Bytes::from_static(b"all")), permit);
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "all");
        assert_eq!(released.load(Ordering::SeqCst), 1);
    }
}
