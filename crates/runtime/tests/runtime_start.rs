//! `Runtime::start` returns only once each thread it started is running its own code: a
//! thread library reads program data while it starts a thread (glibc reads the locale), and
//! a forked child registers its inherited regions, evicted pages and all, right after `start`
//! returns. A runtime thread still starting then faulted there before the fault thread could
//! serve it (a forked pool worker hung so).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use farmem_runtime::RuntimeConfig;
use farmem_testkit::donor::in_process;
use farmem_testkit::pages::MIB;
use farmem_testkit::runtime::{config, start};

#[test]
fn start_returns_once_every_runtime_thread_has_started() {
    let donor = in_process(64 << 20, 1 << 20);
    for _ in 0..20 {
        let seen: Arc<Mutex<BTreeSet<String>>> = Arc::default();
        let hook = {
            let seen = seen.clone();
            Arc::new(move || {
                let name = std::thread::current().name().unwrap_or("?").to_string();
                seen.lock().unwrap().insert(name);
            })
        };
        let rt = start(RuntimeConfig {
            prefetch: "leap".into(),
            thread_hook: Some(hook),
            ..config(4 * MIB, vec![donor.local_addr().to_string()])
        });
        let started = seen.lock().unwrap().clone();
        for name in [
            "farmem-fault",
            "farmem-evict",
            "farmem-send",
            "farmem-heal",
            "farmem-prefetch",
        ] {
            assert!(
                started.contains(name),
                "{name} had not started when Runtime::start returned (started: {started:?})"
            );
        }
        drop(rt);
    }
}

/// The CPUs the calling thread may run on, from /proc (`Cpus_allowed_list`, e.g. "0-1").
fn cpus_allowed() -> String {
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list in /proc/thread-self/status")
        .trim()
        .to_string()
}

/// Starts a runtime (`share_cpu` as given) whose threads record, as they start, their name
/// and the CPUs they may run on. Returns those records.
fn started_threads_cpus(donor: &str, share_cpu: bool) -> Vec<(String, String)> {
    let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let hook = {
        let seen = seen.clone();
        Arc::new(move || {
            let name = std::thread::current().name().unwrap_or("?").to_string();
            seen.lock().unwrap().push((name, cpus_allowed()));
        })
    };
    let rt = start(RuntimeConfig {
        thread_hook: Some(hook),
        share_cpu,
        ..config(4 * MIB, vec![donor.to_string()])
    });
    drop(rt);
    let seen = seen.lock().unwrap().clone();
    seen
}

/// The fault thread and the evictor run on one CPU, the same one (each MOVE of the evictor
/// would otherwise interrupt the fault thread's CPU); the other runtime threads and the
/// program's are left to the scheduler.
#[test]
fn the_fault_thread_and_the_evictor_share_one_cpu() {
    let donor = in_process(64 << 20, 1 << 20);
    let donor = donor.local_addr().to_string();
    let process = cpus_allowed();
    let seen = started_threads_cpus(&donor, true);
    let of = |name: &str| {
        seen.iter()
            .find(|(n, _)| n == name)
            .map(|(_, c)| c.clone())
            .unwrap_or_else(|| panic!("{name} not seen: {seen:?}"))
    };
    let (fault, evict, send) = (of("farmem-fault"), of("farmem-evict"), of("farmem-send"));
    let several = process.contains('-') || process.contains(',');
    if several {
        assert_eq!(fault, evict, "{seen:?}");
        assert!(
            fault.parse::<usize>().is_ok(),
            "one CPU, not {fault:?} (process: {process})"
        );
    } else {
        assert_eq!(
            (fault.as_str(), evict.as_str()),
            (process.as_str(), process.as_str())
        );
    }
    assert_eq!(send, process, "the sender is not pinned");
    assert_eq!(
        cpus_allowed(),
        process,
        "the program's thread is not pinned"
    );
    // A forked child's runtime (`share_cpu: false`) leaves them all to the scheduler.
    let seen = started_threads_cpus(&donor, false);
    assert!(seen.len() >= 3, "{seen:?}");
    for (name, cpus) in &seen {
        assert_eq!(cpus, &process, "{name} was pinned");
    }
}
