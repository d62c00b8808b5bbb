//! Runs one engine on one workload a given number of times, for instruction counts under
//! callgrind (`bench/peers/callgrind.sh` takes the difference of two lengths).
//!   per-call <workload> <prepared|full|governor> <calls>

use std::hint::black_box;
use std::process::ExitCode;

use ratelimit_peer_bench::{WORKLOADS, Workload};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [workload, engine, calls] = args.as_slice() else {
        eprintln!("usage: per-call <workload> <prepared|full|governor> <calls>");
        return ExitCode::FAILURE;
    };
    let Some(workload) = Workload::named(workload) else {
        let names: Vec<&str> = WORKLOADS.iter().map(|w| w.name).collect();
        eprintln!("unknown workload {workload}; one of {names:?}");
        return ExitCode::FAILURE;
    };
    let Ok(calls) = calls.parse::<u64>() else {
        eprintln!("calls must be a number, not {calls}");
        return ExitCode::FAILURE;
    };
    let mut call: Box<dyn FnMut() -> bool> = match engine.as_str() {
        "prepared" => Box::new(workload.prepared()),
        "full" => Box::new(workload.full()),
        "governor" => Box::new(workload.governor()),
        other => {
            eprintln!("unknown engine {other}");
            return ExitCode::FAILURE;
        }
    };
    let mut allowed = 0u64;
    for _ in 0..calls {
        allowed += u64::from(black_box(call()));
    }
    if allowed != calls {
        eprintln!("{allowed} of {calls} calls allowed: the workload must stay within its limit");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
