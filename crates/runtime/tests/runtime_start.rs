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
