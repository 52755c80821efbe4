//! `PermitBody`: a response body that keeps its request's permit until the
//! body has been read to the end or dropped.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Buf;
use http_body::{Body, Frame, SizeHint};

use crate::{Limiter, Permit};

pin_project_lite::pin_project! {
    /// Wraps a response body and holds the request's [`Permit`] until the
    /// body ends, fails or is dropped: a slow download still counts as a
    /// request in flight, and the next request to the host is paced from
    /// the moment the body is complete.
    ///
    /// Built with [`counting`](Self::counting) for a host whose pacing
    /// counts bytes ([`Limiter::counts_bytes`]), it also counts the bytes
    /// of the body's data frames as they are read, and once the body is
    /// done charges them to the limiter ([`Limiter::charge_bytes`]) before
    /// the permit goes back, so that no other request to the host is
    /// admitted before the charge has landed.
    #[derive(Debug)]
    pub struct PermitBody<B> {
        #[pin]
        inner: B,
        held: Option<Held>,
    }
}

/// A permit, and the bytes counted against it when they are charged.
struct Held {
    permit: Option<Permit>,
    /// The limiter to charge and the bytes read so far.
    meter: Option<(Arc<dyn Limiter>, u64)>,
}

impl Held {
    fn count(&mut self, bytes: usize) {
        if let Some((_, counted)) = &mut self.meter {
            *counted = counted.saturating_add(bytes as u64);
        }
    }
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held")
            .field("permit", &self.permit)
            .field("bytes", &self.meter.as_ref().map(|(_, n)| *n))
            .finish()
    }
}

/// Charges what was counted, then releases the permit: on a task of its
/// own when there is something to charge (and a runtime to run it),
/// otherwise at once.
impl Drop for Held {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        let Some((limiter, bytes)) = self.meter.take().filter(|(_, n)| *n > 0) else {
            return drop(permit);
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(host = %permit.host(), bytes, "no runtime to charge a response's bytes on");
            return drop(permit);
        };
        runtime.spawn(async move {
            let host = permit.host().clone();
            if let Err(err) = limiter.charge_bytes(host.clone(), bytes).await {
                tracing::warn!(host = %host, bytes, error = %err, "a response's bytes were not charged");
            }
            drop(permit);
        });
    }
}

impl<B: Body> PermitBody<B> {
    /// `inner`, holding `permit` until it is done. A body that is already
    /// at its end (an empty body) releases the permit at once.
    pub fn new(inner: B, permit: Permit) -> Self {
        let held = (!inner.is_end_stream()).then_some(Held {
            permit: Some(permit),
            meter: None,
        });
        Self { inner, held }
    }

    /// [`new`](Self::new), counting the body's bytes for `limiter` when
    /// the permit's host counts bytes there ([`Limiter::counts_bytes`]).
    pub fn counting(inner: B, permit: Permit, limiter: &Arc<dyn Limiter>) -> Self {
        let counts = limiter.counts_bytes(permit.host());
        let mut body = Self::new(inner, permit);
        if counts && let Some(held) = &mut body.held {
            held.meter = Some((Arc::clone(limiter), 0));
        }
        body
    }

    /// True while the permit is held.
    pub fn holds_permit(&self) -> bool {
        self.held.as_ref().is_some_and(|h| h.permit.is_some())
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
        if let (Some(held), Some(Ok(frame))) = (this.held.as_mut(), &frame)
            && let Some(data) = frame.data_ref()
        {
            held.count(data.remaining());
        }
        let done = match &frame {
            None | Some(Err(_)) => true,
            Some(Ok(_)) => this.inner.is_end_stream(),
        };
        if done {
            this.held.take(); // released: the response is complete
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

    #[tokio::test(start_paused = true)]
    async fn counted_bytes_are_charged_before_the_permit_goes_back() {
        use crate::{DomainLimiter, Limiter, Pacing};
        let pacing = Pacing::builder().max_bytes_per_sec(1000).build().unwrap();
        let limiter: Arc<dyn Limiter> = Arc::new(DomainLimiter::new(pacing));
        let host = HostKey::parse("http://a.test/").unwrap();
        assert!(limiter.counts_bytes(&host));
        let t0 = tokio::time::Instant::now();
        let permit = limiter
            .acquire_host("test", host.clone(), None)
            .await
            .unwrap();
        // 250 bytes over three frames, the body then dropped unfinished:
        // what was read is charged, 250 ms at 1000 bytes a second.
        let frames = Frames(VecDeque::from([
            "a".repeat(100).leak() as &str,
            "b".repeat(150).leak(),
            "c",
        ]));
        let mut body = PermitBody::counting(frames, permit, &limiter);
        assert!(body.frame().await.is_some());
        assert!(body.frame().await.is_some());
        drop(body);
        drop(
            limiter
                .acquire_host("test", host.clone(), None)
                .await
                .unwrap(),
        );
        assert_eq!(tokio::time::Instant::now() - t0, Duration::from_millis(250));
        // A limiter that counts no bytes is not charged.
        let plain: Arc<dyn Limiter> = Arc::new(DomainLimiter::new(Pacing::default()));
        assert!(!plain.counts_bytes(&host));
        let permit = plain
            .acquire_host("test", host.clone(), None)
            .await
            .unwrap();
        let t1 = tokio::time::Instant::now();
        drop(PermitBody::counting(
            Full::new(Bytes::from_static(b"whole")),
            permit,
            &plain,
        ));
        drop(plain.acquire_host("test", host, None).await.unwrap());
        assert_eq!(tokio::time::Instant::now(), t1);
    }
}
