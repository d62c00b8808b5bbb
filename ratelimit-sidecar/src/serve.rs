//! An HTTP/1.1 server loop for warp filters that writes header names in canonical case
//! (`Content-Type`), as Go's net/http does: some clients of envoyproxy/ratelimit compare
//! header names case-sensitively.

use std::convert::Infallible;
use std::future::Future;

use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use warp::Filter;
use warp::reply::Response;

/// Serves `filter` on `listener` until `stop` completes, then waits for the open
/// connections to finish their requests.
pub async fn serve<F>(listener: TcpListener, filter: F, stop: impl Future<Output = ()>)
where
    F: Filter<Extract = (Response,), Error = Infallible> + Clone + Send + Sync + 'static,
    F::Future: Send,
{
    let graceful = GracefulShutdown::new();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let service = TowerToHyperService::new(warp::service(filter.clone()));
                let connection = http1::Builder::new()
                    .title_case_headers(true)
                    .serve_connection(TokioIo::new(stream), service);
                let connection = graceful.watch(connection);
                tokio::spawn(async move {
                    if let Err(error) = connection.await {
                        tracing::debug!(%error, "HTTP connection ended with an error");
                    }
                });
            }
            () = &mut stop => break,
        }
    }
    drop(listener);
    graceful.shutdown().await;
}
