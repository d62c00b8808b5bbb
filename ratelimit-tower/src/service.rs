//! The service the layer wraps around another, and its response future.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::request::Parts;
use http::{HeaderMap, Request, Response};
use pin_project_lite::pin_project;
use ratelimit_core::{CounterStore, Descriptor};
use tower_layer::Layer;
use tower_service::Service;

use crate::answer::Verdict;
use crate::layer::RateLimitLayer;

/// A service that rate-limits the requests of `Inner` (made by [`RateLimitLayer`]).
#[derive(Debug)]
pub struct RateLimitService<Inner, F, S> {
    pub(crate) inner: Inner,
    pub(crate) layer: RateLimitLayer<F, S>,
}

impl<F, S, Inner> Layer<Inner> for RateLimitLayer<F, S> {
    type Service = RateLimitService<Inner, F, S>;

    fn layer(&self, inner: Inner) -> Self::Service {
        RateLimitService {
            inner,
            layer: self.clone(),
        }
    }
}

impl<Inner: Clone, F, S> Clone for RateLimitService<Inner, F, S> {
    fn clone(&self) -> Self {
        RateLimitService {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<Inner, F, S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimitService<Inner, F, S>
where
    Inner: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    F: Fn(&Parts) -> Vec<Descriptor>,
    S: CounterStore,
    ResBody: Default,
{
    type Response = Response<ResBody>;
    type Error = Inner::Error;
    type Future = ResponseFuture<Inner::Future, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let (parts, body) = request.into_parts();
        match self.layer.judge(&parts) {
            Verdict::Pass(headers) => {
                // The service made ready is the one called; a fresh clone waits for the
                // next poll_ready.
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                let state = State::Passed {
                    inner: inner.call(Request::from_parts(parts, body)),
                    headers,
                };
                ResponseFuture { state }
            }
            Verdict::Refuse(status, headers) => {
                let mut response = Response::new(ResBody::default());
                *response.status_mut() = status;
                *response.headers_mut() = headers;
                let state = State::Refused {
                    response: Some(response),
                };
                ResponseFuture { state }
            }
        }
    }
}

pin_project! {
    /// The response of a [`RateLimitService`]: the inner service's, with the rate-limit
    /// headers added, or the layer's own refusal.
    pub struct ResponseFuture<Fut, ResBody> {
        #[pin]
        state: State<Fut, ResBody>,
    }
}

pin_project! {
    #[project = Projected]
    enum State<Fut, ResBody> {
        // Within the limits: the inner service answers, and gets the headers.
        Passed {
            #[pin]
            inner: Fut,
            headers: HeaderMap,
        },
        // Refused here.
        Refused {
            response: Option<Response<ResBody>>,
        },
    }
}

impl<Fut, ResBody, E> Future for ResponseFuture<Fut, ResBody>
where
    Fut: Future<Output = Result<Response<ResBody>, E>>,
{
    type Output = Result<Response<ResBody>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            Projected::Passed { inner, headers } => {
                let mut response = std::task::ready!(inner.poll(cx))?;
                response.headers_mut().extend(std::mem::take(headers));
                Poll::Ready(Ok(response))
            }
            Projected::Refused { response } => {
                Poll::Ready(Ok(response.take().expect("polled after completion")))
            }
        }
    }
}
