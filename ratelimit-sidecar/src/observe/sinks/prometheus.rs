//! The Prometheus endpoint (USE_PROMETHEUS): each scrape renders a snapshot through the
//! mapping, in the text exposition format. Nothing is kept between scrapes.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use ratelimit_core::stats::StatsRegistry;
use ratelimit_service_kit::prometheus::mapper::Mapper;
use ratelimit_service_kit::prometheus::render;

/// The endpoint: the mapping, the extra labels and the path it answers on.
#[derive(Clone, Debug)]
pub struct Prometheus {
    /// The statistics exported.
    pub stats: Arc<StatsRegistry>,
    /// The mapping.
    pub mapper: Arc<Mapper>,
    /// EXTRA_TAGS, as labels on every series.
    pub labels: Arc<Vec<(String, String)>>,
    /// PROMETHEUS_PATH.
    pub path: Arc<str>,
}

impl hyper::service::Service<Request<Incoming>> for Prometheus {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let (status, body) = if request.uri().path() == &*self.path {
            let snapshot = self.stats.snapshot();
            (
                StatusCode::OK,
                render(&snapshot, &self.mapper, &self.labels),
            )
        } else {
            (
                StatusCode::NOT_FOUND,
                format!("metrics are on {}\n", self.path),
            )
        };
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        );
        std::future::ready(Ok(response))
    }
}
