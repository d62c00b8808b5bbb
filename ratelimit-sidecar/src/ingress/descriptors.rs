//! The process's open-file limit against the connection caps.
//!
//! Every connection takes a descriptor, and when they run out every listener stops
//! accepting, health and statistics included. At start-up the soft limit is raised to
//! the hard one (as Go's runtime does for envoyproxy/ratelimit), and a limit still below
//! what the caps allow is a loud warning.

/// Descriptors kept for what is not a client connection: listeners, backend
/// connections, files, the runtime.
const RESERVE: u64 = 256;

/// Raises the open-file limit as far as it goes and warns when it is below
/// `connections` (the sum of the listeners' connection caps) plus a reserve.
pub fn fit(connections: u64) {
    let needed = connections.saturating_add(RESERVE);
    let limit = match raise() {
        Ok(limit) => limit,
        Err(error) => {
            return tracing::warn!(%error, "cannot read the open-file limit (RLIMIT_NOFILE)");
        }
    };
    if limit < needed {
        tracing::warn!(
            limit,
            needed,
            "the open-file limit is below what the connection caps allow \
             (GRPC_MAX_CONNECTIONS, HTTP_MAX_CONNECTIONS): past it every listener, \
             health included, stops accepting; raise `ulimit -n` or lower the caps"
        );
    }
}

/// Sets the soft open-file limit to the hard one and returns it.
fn raise() -> std::io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit for getrlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: `raised` is a valid rlimit; failure leaves the limit as it was.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit = raised;
        }
    }
    Ok(limit.rlim_cur)
}
