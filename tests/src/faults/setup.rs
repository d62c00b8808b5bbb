//! What the sidecar's fault tests share: the load's limit, deadline and profile, a
//! sidecar that falls back to a failure mode while its store is away, and the run of a
//! store fault under load, checked and reported.

use std::future::Future;
use std::time::Duration;

use super::Schedule;
use super::check::Fault;
use super::load::{Profile, Target, rules};
use super::run::{Breakers, Timed, around, checked, healed_and_reported};
use crate::sidecar::{Options, Redis, Server, redis_addresses, redis_env};

/// The load's limit, a second, per key.
pub const LIMIT: u32 = 20;
/// Each call's `grpc-timeout`.
pub const DEADLINE: Duration = Duration::from_millis(500);
/// Beyond the deadline a call may take: the machine is shared with other tests.
pub const MARGIN: Duration = Duration::from_millis(400);
/// BACKEND_BREAKER_OPEN_DURATION, and the time to use the store again after it.
pub const OPEN: Duration = Duration::from_secs(1);
/// The checker's bounds: limit, deadline and margin.
pub const BOUNDS: (u32, Duration, Duration) = (LIMIT, DEADLINE, MARGIN);

/// The load of `schedule`: 4 callers times its scale, on 2 hot keys and 100 cold ones.
pub fn profile(schedule: &Schedule) -> Profile {
    Profile {
        callers: 4 * schedule.scale as usize,
        pause: Duration::from_millis(4),
        hot_keys: 2,
        cold_keys: 100,
        deadline: DEADLINE,
    }
}

/// The settings of a sidecar that falls back to `mode` while its store is away.
pub fn failing(mut env: Vec<(&'static str, String)>, mode: &str) -> Vec<(&'static str, String)> {
    env.extend([
        ("BACKEND_FAILURE_MODE", mode.to_owned()),
        ("BACKEND_FALLBACK_REPLICAS", "2".to_owned()),
        ("BACKEND_BREAKER_FAILURES", "3".to_owned()),
        ("BACKEND_BREAKER_OPEN_DURATION", "1s".to_owned()),
        ("REDIS_TIMEOUT", "300ms".to_owned()),
        ("MEMCACHE_TIMEOUT", "300ms".to_owned()),
        ("GRPC_WORKERS", "2".to_owned()),
    ]);
    env
}

/// A sidecar on `backend` deciding the load's rules, in failure mode `mode`.
pub fn sidecar(env: Vec<(&'static str, String)>, mode: &str) -> Server {
    Server::start_with(Options {
        env: failing(env, mode),
        ..Options::rules(&rules(LIMIT))
    })
}

/// A sidecar on the cluster of `nodes`, in failure mode `error`.
pub fn on_cluster(nodes: &[Redis]) -> Server {
    let mut env = redis_env(nodes[0].port);
    env.extend([
        ("REDIS_TYPE", "cluster".to_owned()),
        ("REDIS_URL", redis_addresses(nodes).join(",")),
    ]);
    sidecar(env, "error")
}

/// The load on `server`'s gRPC port around the fault made by `make` and healed by
/// `heal`, its memory watched.
pub async fn on_grpc<M, MF, H, HF>(server: &Server, schedule: Schedule, make: M, heal: H) -> Timed
where
    M: FnOnce() -> MF,
    MF: Future<Output = ()>,
    H: FnOnce() -> HF,
    HF: Future<Output = u64>,
{
    let target = Target::Grpc(server.grpc);
    let pid = Some(server.pid());
    around(target, profile(&schedule), schedule, pid, make, heal).await
}

/// Runs the load on `server` around the store fault made by `make` and healed by
/// `heal`, checks it against `fault` (given the run's times) and reports.
pub async fn store_under_load<M, MF, H, HF>(
    server: &Server,
    schedule: Schedule,
    make: M,
    heal: H,
    fault: impl FnOnce(&Timed) -> Fault,
    breakers: Breakers<'_>,
) where
    M: FnOnce() -> MF,
    MF: Future<Output = ()>,
    H: FnOnce() -> HF,
    HF: Future<Output = u64>,
{
    let timed = on_grpc(server, schedule, make, heal).await;
    let fault = fault(&timed);
    let measured = checked(&timed, &fault, BOUNDS, server);
    healed_and_reported(server, &timed, &fault, &measured, breakers).await;
}
