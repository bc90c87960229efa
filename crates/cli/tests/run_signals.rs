//! A program stopped by a signal keeps its memory: a terminal's Ctrl-C (SIGINT to the whole
//! process group), `timeout` (SIGTERM to the group) and a SIGTERM to the host tier's node
//! itself. tests/c/sig_check.c fills 192 MiB at a 64 MiB budget, rewrites it in passes until
//! the signal and then checks every word. Before, the signal also stopped the private node (or
//! the embedded donor), which punched the program's slabs on its way out: the program read
//! zeros (or got SIGBUS) in its own signal handler's wake.

use std::process::Command;
use std::time::{Duration, Instant};

use farmem_testkit::run::*;

/// Starts sig_check under `farmem run ARGS` and waits until its memory is filled.
fn started(dir: &Scratch, args: &[&str]) -> Running {
    started_env(dir, args, &[])
}

/// [`started`] with environment variables for `farmem run`.
fn started_env(dir: &Scratch, args: &[&str], env: &[(&str, &std::path::Path)]) -> Running {
    let prog = dir.path("sig_check");
    compile_c(&c_source("sig_check.c"), &prog, &[]);
    let mut all = vec!["--local-mem", "64MiB"];
    all.extend_from_slice(args);
    let mut run = farmem_spawn_env(
        &all,
        &[prog.to_str().unwrap(), "192", dir.0.to_str().unwrap()],
        &dir.path("run.log"),
        env,
    );
    let start = Instant::now();
    while !dir.path("filled").exists() {
        assert!(
            run.child.try_wait().unwrap().is_none(),
            "ended before filling: {}",
            run.log_text()
        );
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "not filled within 2 minutes: {}",
            run.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // A few passes in and out of far memory.
    std::thread::sleep(Duration::from_secs(2));
    run
}

/// Sends `sig` to every process of `farmem run`'s process group (it leads its own).
fn signal_group(run: &Running, sig: &str) {
    let st = Command::new("kill")
        .args([&format!("-{sig}"), "--", &format!("-{}", run.child.id())])
        .status()
        .unwrap();
    assert!(st.success());
}

/// The program checked every word after the signal and ended with its own status (4).
fn checked_all(run: &mut Running) {
    let status = run.wait(Duration::from_secs(120));
    let log = run.log_text();
    assert!(log.contains("ok passes="), "{log}");
    assert_eq!(status.code(), Some(4), "the program's status: {log}");
    assert!(!log.contains("BAD"), "{log}");
}

#[test]
fn sigterm_to_the_process_group_leaves_the_program_its_pages() {
    let dir = Scratch::new("sig-term-group");
    let mut run = started(&dir, &[]);
    signal_group(&run, "TERM");
    checked_all(&mut run);
}

#[test]
fn ctrl_c_leaves_the_program_its_pages() {
    let dir = Scratch::new("sig-int-group");
    let mut run = started(&dir, &[]);
    signal_group(&run, "INT");
    checked_all(&mut run);
}

#[test]
fn sigterm_to_the_process_group_leaves_the_embedded_donor_serving() {
    let dir = Scratch::new("sig-term-tcp");
    let mut run = started(&dir, &["--local-donor", "tcp"]);
    signal_group(&run, "TERM");
    checked_all(&mut run);
}

#[test]
fn a_node_stopped_under_a_running_program_leaves_it_its_pages() {
    let dir = Scratch::new("sig-node");
    let mut run = started(&dir, &[]);
    // The private node: a descendant of `farmem run` (its child, or the program's) whose command
    // line says `node`.
    let node = descendants(run.child.id())
        .into_iter()
        .find(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == b"node"))
        })
        .unwrap_or_else(|| panic!("no node under farmem run: {}", run.log_text()))
        .to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &node])
        .status()
        .unwrap()
        .success());
    // The program goes on paging with the slabs it has, then is stopped.
    std::thread::sleep(Duration::from_secs(2));
    run.signal("TERM");
    checked_all(&mut run);
}

/// The processes under `pid`.
fn descendants(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        // Children are listed per thread: the node is spawned from a keeper thread.
        let tasks = std::fs::read_dir(format!("/proc/{p}/task"))
            .into_iter()
            .flatten();
        for t in tasks.flatten() {
            let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            for c in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                out.push(c);
                todo.push(c);
            }
        }
    }
    out
}

/// Signals sent to the process reach only the program's threads: a timer's handler that reads
/// paged memory (it hung when the signal ran on the fault thread, which then waited for a page
/// only it could bring in), and a signal the program blocks stays pending (it ran on a farmem
/// thread). tests/c/handler_pages.c: 128 MiB at a 32 MiB budget.
#[test]
fn signal_handlers_run_on_the_program_s_threads_only() {
    let dir = Scratch::new("sig-handler-pages");
    let prog = dir.path("handler_pages");
    compile_c(&c_source("handler_pages.c"), &prog, &[]);
    let stats = dir.path("stats.json");
    let mut run = farmem_spawn(
        &["--local-mem", "32MiB", "--stats", stats.to_str().unwrap()],
        &[prog.to_str().unwrap(), "128"],
        &dir.path("run.log"),
    );
    let status = run.wait(Duration::from_secs(180));
    let log = run.log_text();
    assert!(status.success(), "{log}");
    assert!(log.contains("ok alarms="), "{log}");
    assert_went_far_and_came_back(&read_stats(&stats), 64 << 20);
}

/// `farmem run` killed with SIGKILL (it cannot pass anything on) while the program is still
/// filling its memory: the program goes on without its node, keeping in memory what it can
/// no longer write back, and checks every word when stopped later; its stderr says why
/// write-back fails, once and rightly (the node is gone: it used to say, every second, that
/// the node lent no more slabs and to give it more --capacity); the next `farmem run` removes
/// the directories the killed one left in the temporary directory.
#[test]
fn a_killed_farmem_run_leaves_the_program_its_pages_and_its_directories_are_swept() {
    let dir = Scratch::new("sig-kill-run");
    let tmp = dir.path("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let prog = dir.path("sig_check");
    compile_c(&c_source("sig_check.c"), &prog, &[]);
    let mut run = farmem_spawn_env(
        &["--local-mem", "64MiB"],
        &[prog.to_str().unwrap(), "192", dir.0.to_str().unwrap()],
        &dir.path("run.log"),
        &[("TMPDIR", &tmp)],
    );
    let alive = |pid: u32| std::path::Path::new(&format!("/proc/{pid}")).exists();
    let start = Instant::now();
    // The program, once its runtime runs (its fault thread exists: it has connected to the
    // node). Killed before that, the program cannot start its runtime and says so.
    let runtime_started = |p: &u32| {
        std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "sig_check")
            && std::fs::read_dir(format!("/proc/{p}/task"))
                .into_iter()
                .flatten()
                .flatten()
                .any(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim() == "farmem-fault")
                })
    };
    let program = loop {
        let found = descendants(run.child.id())
            .into_iter()
            .find(runtime_started);
        if let Some(p) = found {
            break p;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{}",
            run.log_text()
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let farmem_dirs = || -> Vec<String> {
        std::fs::read_dir(&tmp)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("farmem-"))
            .collect()
    };
    assert!(!farmem_dirs().is_empty(), "the run's directories");
    run.signal("KILL");
    run.wait(Duration::from_secs(30));
    while !dir.path("filled").exists() {
        assert!(alive(program), "ended before filling: {}", run.log_text());
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "{}",
            run.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(2));
    assert!(Command::new("kill")
        .args(["-TERM", &program.to_string()])
        .status()
        .unwrap()
        .success());
    while alive(program) {
        assert!(
            start.elapsed() < Duration::from_secs(180),
            "{}",
            run.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = run.log_text();
    assert!(log.contains("ok passes="), "{log}");
    assert!(!log.contains("BAD"), "{log}");
    let errors: Vec<&str> = log.lines().filter(|l| l.contains("ERROR")).collect();
    assert!(
        errors.iter().any(|l| l.contains("is gone")),
        "write-back failed for want of the node: {log}"
    );
    assert!(
        !log.contains("more --capacity"),
        "a dead node is not a full one: {log}"
    );
    assert!(errors.len() <= 2, "{} error lines: {log}", errors.len());
    // The next run sweeps what the killed one left.
    let o = Command::new(farmem_testkit::bins::farmem())
        .args(["run", "--local-mem", "32MiB", "--", "true"])
        .env("TMPDIR", &tmp)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(farmem_dirs(), Vec::<String>::new());
}
