//! The preload library in a set-user-ID program (secure execution): the environment is the
//! user's, the rights are root's, so the library must take no settings from it.
//!
//! `farmem run` cannot put the library into such a program (the dynamic loader ignores the
//! `LD_PRELOAD` path there), so the test loads it the other way it can arrive: a set-user-ID
//! root program linked against it (as `/etc/ld.so.preload` would load it), started by user
//! nobody with settings of its choosing in `FARMEM_RUN_SETTINGS`. And `farmem run` refuses a
//! set-user-ID program another user starts, rather than running it unpaged.

use farmem_contract::run_settings::{RunSettings, RUN_SETTINGS_VAR, RUN_SETTINGS_VERSION};
use farmem_testkit::bins::*;
use farmem_testkit::run::*;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// What a hostile user would ask of the library: a stats file written where it likes and a
/// `farmem` binary of its own for the embedded donor.
fn hostile_settings(stats: &Path, fake_farmem: &Path) -> String {
    RunSettings {
        version: RUN_SETTINGS_VERSION,
        local_mem_bytes: 256 << 20,
        donors: vec![],
        token_file: None,
        evict: None,
        prefetch: None,
        prefetch_install: None,
        seal: farmem_contract::SealMode::Auto,
        tier: farmem_contract::TierMode::Off,
        replicas: None,
        backup_file: None,
        heal_rate_bytes: None,
        over_budget: farmem_contract::OverBudget::Allow,
        stats_file: Some(stats.to_path_buf()),
        tree_dir: None,
        record_trace: None,
        mmap_threshold_bytes: 256 << 10,
        heap_reserve_bytes: 256 << 30,
        allocator_only: false,
        farmem_bin: Some(fake_farmem.to_path_buf()),
        orig_ld_preload: None,
    }
    .encode()
    .unwrap()
}

#[test]
fn a_set_user_id_program_ignores_the_users_farmem_settings() {
    let setpriv = require_program("setpriv", "util-linux");
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test makes a set-user-ID root program: run it as root"
    );
    let dir = Scratch::new("secure-exec");
    // User nobody must reach the program and the library in it.
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    let lib = dir.path("libfarmem_preload.so");
    std::fs::copy(preload_lib(), &lib).unwrap();
    let prog = dir.path("print_ids");
    compile_c(
        &c_source("print_ids.c"),
        &prog,
        &["-Wl,--no-as-needed", lib.to_str().unwrap()],
    );
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let marker = dir.path("fake-farmem-ran");
    let fake = dir.path("fake_farmem");
    compile_c(
        &c_source("fake_farmem.c"),
        &fake,
        &[&format!("-DMARKER=\"{}\"", marker.display())],
    );
    let stats = dir.path("stats.json");

    let o = output_within(
        Command::new(setpriv)
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&prog)
            .env(RUN_SETTINGS_VAR, hostile_settings(&stats, &fake))
            .env("FARMEM_LOG", "debug"),
        Duration::from_secs(60),
    );
    assert!(
        !marker.exists(),
        "the user's `farmem` binary ran with root's rights ({:?}): {}",
        std::fs::read_to_string(&marker),
        text(&o)
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "ruid=65534 euid=0",
        "the program must run set-user-ID root (is {} mounted nosuid?): {}",
        dir.0.display(),
        text(&o)
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        err.matches("secure execution").count(),
        1,
        "one warning saying the library stays inactive: {}",
        text(&o)
    );
    assert!(
        !stats.exists(),
        "root wrote the stats file where the user asked: {}",
        text(&o)
    );
}

#[test]
fn farmem_run_refuses_a_set_user_id_program_it_cannot_page() {
    let setpriv = require_program("setpriv", "util-linux");
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test makes a set-user-ID root program: run it as root"
    );
    require_preload_lib();
    let dir = Scratch::new("secure-exec-run");
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    let prog = dir.path("print_ids");
    compile_c(&c_source("print_ids.c"), &prog, &[]);
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o4755)).unwrap();
    // Before it was refused, it ran without farmem and `farmem run` only said it wrote no
    // statistics. CAP_SYS_PTRACE gives nobody userfaultfd, as a user farmem runs for has it.
    let o = output_within(
        Command::new(setpriv)
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .args(["--inh-caps=+sys_ptrace", "--ambient-caps=+sys_ptrace"])
            .arg(farmem())
            .args(["run", "--local-mem", "64MiB", "--"])
            .arg(&prog),
        Duration::from_secs(60),
    );
    assert!(!o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("is set-user-ID") && err.contains("without farmem"),
        "{}",
        text(&o)
    );
    assert!(
        o.stdout.is_empty(),
        "the program must not run: {}",
        text(&o)
    );
    // Its owner runs it under farmem as any other program.
    let o = farmem_run(&["--local-mem", "64MiB"], &[prog.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "ruid=0 euid=0");
}
