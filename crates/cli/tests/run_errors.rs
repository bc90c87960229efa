//! `farmem run`'s clear errors and its process semantics: budget below the minimum, COMMAND
//! not found, statically linked program, donor unreachable, donor refusing the token,
//! userfaultfd unavailable to the user; exit status passthrough (signals → 128+n); a program
//! exec'd by the child is under farmem too; --quiet.

use farmem_testkit::bins::*;
use farmem_testkit::clients::*;
use farmem_testkit::run::*;

use std::process::Command;

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn budget_below_minimum_is_refused() {
    let o = farmem_run(&["--local-mem", "4KiB"], &["true"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(stderr(&o).contains("below the minimum"), "{}", text(&o));
}

#[test]
fn budget_below_one_process_least_share_is_refused() {
    // 128 KiB used to run with a 1 MiB budget: the tree's least share per process.
    for small in ["128KiB", "1MiB"] {
        let o = farmem_run(&["--local-mem", small], &["true"]);
        assert!(!o.status.success(), "{}", text(&o));
        assert!(
            stderr(&o).contains("below the minimum") && stderr(&o).contains("2.0 MiB"),
            "{}",
            text(&o)
        );
    }
    let o = farmem_run(&["--local-mem", "2MiB"], &["true"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        stderr(&o).contains("of 2.0 MiB") || stderr(&o).contains("budget"),
        "{}",
        text(&o)
    );
}

#[test]
fn a_command_that_cannot_run_exits_127_or_126_as_shells_do() {
    let o = farmem_run(&["--local-mem", "64MiB"], &["/no/such/program"]);
    assert_eq!(o.status.code(), Some(127), "{}", text(&o));
    let o = farmem_run(&["--local-mem", "64MiB"], &["no-such-program-on-path"]);
    assert_eq!(o.status.code(), Some(127), "{}", text(&o));
    let dir = Scratch::new("not-executable");
    let data = dir.path("data.txt");
    std::fs::write(&data, "not a program\n").unwrap();
    let o = farmem_run(&["--local-mem", "64MiB"], &[data.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(126), "not executable: {}", text(&o));
    // Executable, but neither ELF nor a script: exec would fail with ENOEXEC.
    std::fs::set_permissions(&data, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let o = farmem_run(&["--local-mem", "64MiB"], &[data.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(126), "not a program: {}", text(&o));
}

#[test]
fn bad_size_is_refused() {
    let o = farmem_run(&["--local-mem", "lots"], &["true"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("bad size"), "{}", text(&o));
}

#[test]
fn unknown_prefetch_install_mode_is_refused() {
    let o = farmem_run(
        &["--local-mem", "256MiB", "--prefetch-install", "eager"],
        &["true"],
    );
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("eager") && err.contains("buffer") && err.contains("marker"),
        "{}",
        text(&o)
    );
}

#[test]
fn missing_command_is_named() {
    let o = farmem_run(&["--local-mem", "256MiB"], &["no-such-program-farmem-test"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("COMMAND not found"), "{}", text(&o));
}

#[test]
fn static_program_is_refused_before_it_starts() {
    let dir = Scratch::new("static");
    let prog = dir.path("static_prog");
    let marker = dir.path("ran");
    compile_c(&c_source("static_prog.c"), &prog, &["-static"]);
    let o = farmem_run(
        &["--local-mem", "256MiB"],
        &[prog.to_str().unwrap(), marker.to_str().unwrap()],
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("statically linked"), "{}", text(&o));
    assert!(
        !marker.exists(),
        "the static program must not have been started"
    );
}

#[test]
fn unreachable_donor_is_named() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let o = farmem_run(&["--local-mem", "256MiB", "--donor", &addr], &["true"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains(&addr), "{}", text(&o));
}

#[test]
fn donor_refusing_the_token_is_reported() {
    let dir = Scratch::new("token");
    let good = dir.path("good.token");
    let bad = dir.path("bad.token");
    std::fs::write(&good, "the-right-secret-token-0123456789").unwrap();
    std::fs::write(&bad, "a-wrong-secret-token-9876543210xx").unwrap();
    // Token files must be private (mode 600).
    std::fs::set_permissions(&bad, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    std::fs::set_permissions(&good, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let donor = farmem_testkit::donor::Donor::spawn(&[
        "--capacity",
        "256MiB",
        "--token-file",
        good.to_str().unwrap(),
    ]);
    let addr = donor.addr.to_string();
    let o = farmem_run(
        &[
            "--local-mem",
            "256MiB",
            "--donor",
            &addr,
            "--token-file",
            bad.to_str().unwrap(),
        ],
        &["true"],
    );
    drop(donor);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains(&addr) && e.to_lowercase().contains("token"),
        "{}",
        text(&o)
    );
}

#[test]
fn a_command_this_user_may_not_run_is_not_called_missing() {
    // As nobody: a program behind a folder it may not search was "COMMAND not found: … does
    // not exist"; so was one it may not execute.
    use std::os::unix::fs::PermissionsExt;
    let setpriv = require_program("setpriv", "util-linux");
    let dir = Scratch::new("not-yours");
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    let private = dir.path("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let hidden = private.join("prog.sh");
    std::fs::write(&hidden, "#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(&hidden, std::fs::Permissions::from_mode(0o755)).unwrap();
    let root_only = dir.path("root-only.sh");
    std::fs::write(&root_only, "#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(&root_only, std::fs::Permissions::from_mode(0o700)).unwrap();
    let as_nobody = |args: &[&str]| {
        Command::new(&setpriv)
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(farmem())
            .args(["run", "--local-mem", "64MiB", "--"])
            .args(args)
            .output()
            .unwrap()
    };
    let o = as_nobody(&[hidden.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(126), "{}", text(&o));
    assert!(
        stderr(&o).contains("cannot be reached by this user"),
        "{}",
        text(&o)
    );
    assert!(!stderr(&o).contains("does not exist"), "{}", text(&o));
    let o = as_nobody(&[root_only.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(126), "{}", text(&o));
    assert!(
        stderr(&o).contains("is not executable by this user"),
        "{}",
        text(&o)
    );
    // Found on PATH but not runnable: named, 126.
    let o = Command::new(&setpriv)
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .env("PATH", dir.0.to_str().unwrap())
        .arg(farmem())
        .args(["run", "--local-mem", "64MiB", "--", "root-only.sh"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(126), "{}", text(&o));
    assert!(
        stderr(&o).contains("root-only.sh: is not executable by this user"),
        "{}",
        text(&o)
    );
}

#[test]
fn userfaultfd_unavailable_to_the_user_is_explained() {
    // As user nobody, /dev/userfaultfd (root only) and the syscall (vm.unprivileged_userfaultfd
    // is 0 here) are both refused.
    let setpriv = require_program("setpriv", "util-linux");
    let unpriv =
        std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd").unwrap_or_default();
    assert_eq!(
        unpriv.trim(),
        "0",
        "this test needs vm.unprivileged_userfaultfd=0 (the default)"
    );
    require_preload_lib();
    let o = Command::new(setpriv)
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(farmem())
        .args(["run", "--local-mem", "256MiB", "--", "true"])
        .output()
        .unwrap();
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        stderr(&o).contains("userfaultfd is not available"),
        "{}",
        text(&o)
    );
}

#[test]
fn exit_status_and_signals_pass_through() {
    let o = farmem_run(
        &["--local-mem", "256MiB", "--quiet"],
        &["sh", "-c", "exit 7"],
    );
    assert_eq!(o.status.code(), Some(7), "{}", text(&o));
    assert!(
        !stderr(&o).contains("faults"),
        "--quiet prints no summary: {}",
        text(&o)
    );
    let o = farmem_run(
        &["--local-mem", "256MiB", "--quiet"],
        &["sh", "-c", "kill -TERM $$"],
    );
    assert_eq!(o.status.code(), Some(128 + 15), "{}", text(&o));
}

#[test]
fn exec_keeps_the_program_under_farmem() {
    // The shell runs under farmem, and so does what it execs: it inherits the library and
    // the settings, and writes a stats file of its own in the tree.
    let scratch = farmem_testkit::run::Scratch::new("exec-tree");
    let stats = scratch.path("stats.json");
    let o = farmem_run(
        &["--local-mem", "256MiB", "--stats", stats.to_str().unwrap()],
        &[
            "sh",
            "-c",
            "echo \"preload=[$LD_PRELOAD]\"; env | grep -c FARMEM_RUN_ || true",
        ],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", text(&o));
    assert!(out.contains("libfarmem_preload.so]"), "{}", text(&o));
    assert!(out.lines().any(|l| l.trim() == "1"), "{}", text(&o));
    assert!(
        stderr(&o).contains("peak resident"),
        "summary line expected: {}",
        text(&o)
    );
    let v = farmem_testkit::run::read_stats(&stats);
    let procs = v["tree"]["processes"].as_array().expect("a tree section");
    assert!(procs.len() >= 2, "sh and env each ran a runtime: {v}");
    assert!(procs.iter().all(|p| p["final"] == true), "{v}");
}

#[test]
fn exit_from_a_signal_handler_keeps_its_status_and_writes_the_final_stats() {
    // `_exit` called from a signal handler that interrupts malloc/free in a loop: the process
    // ends with the status it gave (no hang on a lock the interrupted code held), and its
    // statistics are final.
    let dir = Scratch::new("exit-in-handler");
    let prog = dir.path("exit_in_handler");
    compile_c(&c_source("exit_in_handler.c"), &prog, &[]);
    let stats = dir.path("stats.json");
    for _ in 0..3 {
        let o = farmem_run(
            &["--local-mem", "64MiB", "--stats", stats.to_str().unwrap()],
            &[prog.to_str().unwrap()],
        );
        assert_eq!(o.status.code(), Some(7), "{}", text(&o));
        let v = farmem_testkit::run::read_stats(&stats);
        let procs = v["tree"]["processes"].as_array().expect("a tree section");
        assert_eq!(procs.len(), 1, "{v}");
        assert_eq!(procs[0]["final"], true, "{v}");
    }
}

/// The pids of `pid`'s children (started by any of its threads: the private node is spawned
/// from a keeper thread).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .flat_map(|t| {
            std::fs::read_to_string(t.path().join("children"))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// `farmem run` killed outright (no chance to stop its private node) still takes the node with
/// it: the node asked the kernel to kill it when its parent dies (`--exit-with-parent`).
#[test]
fn the_private_node_dies_with_a_killed_farmem_run() {
    child_dies_with_a_killed_farmem_run("node", &[]);
}

/// The same for the embedded TCP donor (`--local-donor tcp`).
#[test]
fn the_embedded_donor_dies_with_a_killed_farmem_run() {
    child_dies_with_a_killed_farmem_run("donor", &["--local-donor", "tcp"]);
}

/// Kills `farmem run ARGS -- sleep 30` once its `farmem SUBCOMMAND` child runs, and checks the
/// child goes too.
fn child_dies_with_a_killed_farmem_run(subcommand: &str, args: &[&str]) {
    let dir = Scratch::new(&format!("{subcommand}-dies"));
    let mut all = vec!["--local-mem", "64MiB"];
    all.extend_from_slice(args);
    let r = farmem_spawn(&all, &["sleep", "30"], &dir.path("log"));
    let run_pid = r.child.id();
    let is_donor = |p: &u32| {
        std::fs::read(format!("/proc/{p}/cmdline"))
            .map(|c| c.split(|b| *b == 0).any(|a| a == subcommand.as_bytes()))
            .unwrap_or(false)
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let donor = loop {
        if let Some(d) = children_of(run_pid).into_iter().find(is_donor) {
            break d;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no {subcommand} under farmem run; log:\n{}",
            r.log_text()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    // Only farmem run itself, not its process group.
    let st = Command::new("kill")
        .args(["-KILL", &run_pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    // Gone, or a zombie waiting for its new parent to reap it.
    let alive = || {
        std::fs::read_to_string(format!("/proc/{donor}/stat"))
            .map(|s| !s.contains(") Z "))
            .unwrap_or(false)
    };
    while alive() {
        assert!(
            std::time::Instant::now() < deadline,
            "the {subcommand} {donor} outlived farmem run"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    drop(r); // kills what is left of the group (the program)
}

/// A library and a binary from different builds: the library refuses settings of another
/// version, saying so, before the program runs.
#[test]
fn settings_of_another_version_are_refused_by_the_library() {
    let o = Command::new("/bin/true")
        .env("LD_PRELOAD", farmem_testkit::bins::preload_lib())
        .env("FARMEM_RUN_SETTINGS", r#"{"version": 999}"#)
        .output()
        .expect("run /bin/true");
    assert_eq!(o.status.code(), Some(125), "{}", text(&o));
    let e = stderr(&o);
    assert!(
        e.contains("version 999") && e.contains("different builds"),
        "{}",
        text(&o)
    );
}

/// Log lines are plain text when stderr is not a terminal: the program's runtime wrote colour
/// codes into log files and pipes (`farmem run` itself already did not).
#[test]
fn log_lines_carry_no_colour_codes_off_a_terminal() {
    require_preload_lib();
    let o = Command::new(farmem())
        .args(["run", "--local-mem", "32MiB", "--", "true"])
        .env("FARMEM_LOG", "trace")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("runtime thread"),
        "the runtime's trace lines: {err}"
    );
    assert!(!err.contains('\u{1b}'), "colour codes in a pipe: {err:?}");
}
