//! A Redis cluster's faults under load, with the checker of `ratelimit_tests::faults`
//! (see `faults.rs`): a master failing over to its replica (only its slots' keys fail,
//! and the slot map follows), slots resharded between masters (`MOVED` followed, no
//! call fails), and slots held migrating while keys move part-way (`ASK` and `MOVED`
//! followed, no call fails). The short form runs here; `bench/faults/run.sh` runs it
//! longer.

use std::sync::Mutex;
use std::time::Duration;

use ratelimit_tests::faults::Schedule;
use ratelimit_tests::faults::check::{Fault, Promise};
use ratelimit_tests::faults::load::now_us;
use ratelimit_tests::faults::run::{Breakers, Timed, last_seen, store_fault};
use ratelimit_tests::faults::setup::{OPEN, on_cluster, store_under_load};
use ratelimit_tests::redis_failover::{
    FAILOVER_CLUSTER, cluster_replica, finish_migration, is_master, keys_in, migrate,
    open_migration, slots_of,
};
use ratelimit_tests::sidecar::{Redis, eventually, redis_cluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_master_fails_over_to_its_replica() {
    let nodes = redis_cluster(3, &FAILOVER_CLUSTER);
    let replica = cluster_replica(&nodes[0]);
    let server = on_cluster(&nodes);
    let nodes = Mutex::new(nodes);
    let make = async || nodes.lock().unwrap()[0].kill();
    let heal = async || {
        last_seen(Duration::from_secs(30), "the replica promoted", || async {
            is_master(&nodes.lock().unwrap()[1], &replica)
        })
        .await
    };
    let schedule = Schedule {
        fault: Duration::ZERO,
        ..Schedule::from_env()
    };
    let name = "cluster master killed, its replica promoted, mode error";
    let fault = |t: &Timed| Fault {
        partial: true,
        ..store_fault(name, Promise::Error, t, OPEN, true)
    };
    let breakers = Breakers::NodeLeft("redis");
    store_under_load(&server, schedule, make, heal, fault, breakers).await;
}

/// Moves `slots` slots from `from` to `to` with `redis-cli --cluster reshard`, a slot at
/// a time: marked migrating and importing, its keys moved, the slot given to `to`. A
/// client then meets `MOVED` for every moved slot it still maps to `from` (and `ASK`
/// for a key asked in the few milliseconds a slot migrates).
async fn reshard(from: &Redis, to: &Redis, slots: u32) {
    let id = |node: &Redis| node.cli(&["CLUSTER", "MYID"]);
    let output = tokio::process::Command::new("redis-cli")
        .args(["--cluster", "reshard", &format!("127.0.0.1:{}", from.port)])
        .args(["--cluster-from", &id(from), "--cluster-to", &id(to)])
        .args(["--cluster-slots", &slots.to_string(), "--cluster-yes"])
        .output()
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_slots_moved_under_load() {
    let nodes = redis_cluster(3, &[]);
    let server = on_cluster(&nodes);
    let slots = 2_000;
    let (from, to) = (&nodes[0], &nodes[1]);
    let make = async || reshard(from, to, slots).await;
    // The fault lasts as long as the resharding.
    let heal = async || now_us();
    let schedule = Schedule {
        fault: Duration::ZERO,
        ..Schedule::from_env()
    };
    let name = "cluster: 2 000 slots moved between masters (MOVED)";
    let fault = |t: &Timed| Fault::new(name, Promise::Exact, t.times(), 0);
    store_under_load(&server, schedule, make, heal, fault, Breakers::None).await;
    let held = slots_of(&nodes[2], to);
    assert!(held >= 16_384 / 3 + slots, "{held} slots on the target");
}

/// The window (epoch seconds) a counter's key names: `faults_k_<value>_<window>`.
fn window_of(key: &str) -> u64 {
    let window = key.rsplit('_').next().and_then(|w| w.parse().ok());
    window.unwrap_or_else(|| panic!("a counter's key: {key}"))
}

/// The slots held migrating: 3 000 of the first master's (`redis-cli --cluster create`
/// gives it 0 to 5460), about one key in five.
const MIGRATING: std::ops::Range<u16> = 0..3_000;

/// Slots held migrating from the first master to the second under load. Once the
/// source holds a few counters of those slots, the migration is opened and every other
/// one of them moved (`MIGRATE`), the rest left on the source: those moved, and every
/// counter of a later window, are asked of the target (`ASK`). Two thirds of the fault
/// later the first half of the slots is given to the target (`MOVED` for those, `ASK`
/// still for the rest), and at the heal the rest. No call may fail and no key go over
/// its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_slots_held_migrating_under_load() {
    let nodes = redis_cluster(3, &[]);
    let server = on_cluster(&nodes);
    let (from, to, other) = (&nodes[0], &nodes[1], &nodes[2]);
    let slots: Vec<u16> = MIGRATING.collect();
    let (first, rest) = slots.split_at(slots.len() / 2);
    let schedule = Schedule::from_env();
    let step = schedule.fault / 3;
    // The counters moved part-way, and those on the target a step later.
    let counted = Mutex::new((0, 0));
    let make = async || {
        // Until the source holds a few counters of those slots (the load's, of this
        // window).
        let held = eventually(Duration::from_secs(5), || async {
            keys_in(from, &slots).len() >= 4
        });
        assert!(held.await, "no counter in the slots to migrate");
        open_migration(from, to, &slots);
        let opened = now_us() / 1_000_000;
        // Part-way: every other counter moved now, the rest left on the source, which
        // answers them until they expire or their slot is handed over.
        let held = keys_in(from, &slots);
        let moving: Vec<String> = held.iter().step_by(2).cloned().collect();
        assert!(held.len() > moving.len(), "too few counters: {held:?}");
        migrate(from, to, &moving);
        tokio::time::sleep(step).await;
        // Only `ASK` can have put a counter of a later window on the target.
        let later = || {
            let on_target = keys_in(to, &slots);
            on_target
                .iter()
                .filter(|key| window_of(key) > opened)
                .count()
        };
        let asked = eventually(Duration::from_secs(2), || async { later() > 0 });
        assert!(asked.await, "no counter was asked of the importing master");
        *counted.lock().unwrap() = (moving.len(), later());
        tokio::time::sleep(step).await;
        finish_migration(from, to, &[other], first);
    };
    let heal = async || {
        let began = now_us();
        finish_migration(from, to, &[other], rest);
        began
    };
    let schedule = Schedule {
        fault: step,
        ..schedule
    };
    let name = "cluster: 3 000 slots held migrating, keys moved part-way (ASK, then MOVED)";
    let fault = |t: &Timed| Fault::new(name, Promise::Exact, t.times(), 0);
    store_under_load(&server, schedule, make, heal, fault, Breakers::None).await;
    let (moved, asked) = counted.into_inner().unwrap();
    println!("{moved} counters moved part-way; {asked} of later windows asked of the target");
    assert_eq!(keys_in(from, &slots), Vec::<String>::new());
    let held = slots_of(other, to);
    assert!(held >= 16_384 / 3 + 3_000, "{held} slots on the target");
}
