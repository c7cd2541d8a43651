//! What the fusefs benchmarks share: the environment's settings, medians, the privileged
//! start, and the entries their in-memory workers answer with.

use std::path::Path;

pub(crate) mod memory;

/// The environment variable `name` parsed, or `default` when unset or empty. A value that does
/// not parse ends the run with a message naming the variable and the value.
pub(crate) fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(value) if !value.trim().is_empty() => value
            .trim()
            .parse()
            .unwrap_or_else(|_| bad_setting(name, &value, "a number")),
        _ => default,
    }
}

/// Ends the run: `name` was set to `value`, which is not `expected`. Exit status 2, as for a
/// bad command line; nothing has been mounted or started yet.
#[allow(clippy::exit)]
pub(crate) fn bad_setting(name: &str, value: &str, expected: &str) -> ! {
    eprintln!("{name}={value:?} is not valid: expected {expected}");
    std::process::exit(2)
}

/// A multi-threaded tokio runtime of `threads` worker threads, with I/O and timers.
pub(crate) fn runtime(threads: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .unwrap()
}

/// The load averages over 1, 5 and 15 minutes, as `/proc/loadavg` gives them; empty when
/// unreadable.
pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// How this machine's idle CPUs wait: the cpuidle driver and, under `haltpoll` (a KVM
/// guest's), how long an idle CPU polls before it halts. A wake-up of a halted virtual CPU
/// is a trip through the host, so on this project's benchmark machine this setting moved a
/// worker call's latency 3.9-fold and the FUSE layer's 9-fold (crates/fusefs/README.md,
/// "What a wake-up costs"); each report names it.
pub(crate) fn idle_policy() -> String {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .ok()
            .map(|s| s.trim().to_owned())
    };
    let Some(driver) = read("/sys/devices/system/cpu/cpuidle/current_driver") else {
        return "cpuidle driver unknown".to_owned();
    };
    match read("/sys/module/haltpoll/parameters/guest_halt_poll_ns") {
        Some(ns) if driver == "haltpoll" => format!("cpuidle {driver}, guest_halt_poll_ns {ns}"),
        _ => format!("cpuidle {driver}"),
    }
}

/// The median (the mean of the middle two for an even count); NaN for no values.
pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Enters a private mount namespace of this process's own, on the calling (main) thread, so
/// that every thread and child inherits it and no mount of the run outlives it. `false`, after
/// printing SKIPPED with the reason, without `/dev/fuse` or the privilege.
pub(crate) fn private_namespace(bench: &str) -> bool {
    if !Path::new("/dev/fuse").exists() {
        println!("SKIPPED (needs /dev/fuse): {bench}");
        return false;
    }
    if let Err(why) = test_support::try_private_mount_namespace() {
        println!("SKIPPED (needs root in a private mount namespace): {bench}: {why}");
        return false;
    }
    true
}
