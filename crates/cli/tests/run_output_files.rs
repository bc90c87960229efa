//! The files `farmem run` writes for its user (`--stats`, `--record-trace`), attacked by
//! another local user (nobody, through `setpriv`) in a directory anyone may write to: links
//! planted at every name farmem could be guessed to use redirect nothing (the root-owned
//! victim stays as it was), and a path that is a link, another user's file, a FIFO or a device
//! is refused with a clear error before the program starts.

use farmem_testkit::bins::*;
use farmem_testkit::run::*;

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const NOBODY: u32 = 65534;
const PRECIOUS: &[u8] = b"root's own bytes\n";

/// A directory any user may write to (mode 0777, no sticky bit), as a careless user makes one.
fn open_dir(tag: &str) -> Scratch {
    let d = Scratch::new(tag);
    std::fs::set_permissions(&d.0, std::fs::Permissions::from_mode(0o777)).unwrap();
    d
}

/// A root-owned file outside the open directory.
fn victim(dir: &Scratch) -> PathBuf {
    let p = dir.path("victim");
    std::fs::write(&p, PRECIOUS).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    p
}

fn assert_untouched(victim: &Path) {
    assert_eq!(
        std::fs::read(victim).unwrap(),
        PRECIOUS,
        "root's file {} was written through a planted link",
        victim.display()
    );
}

/// As nobody, for up to `secs` seconds: for every farmem, sh and sleep process in /proc, a
/// link to `target` at each temporary name a writer of `file` could use with that pid
/// (`FILE.tmp.PID`, and `STEM.tmp.PID` as `Path::with_extension` makes it), every 20 ms.
fn planter(file: &Path, target: &Path, secs: u32) -> Child {
    let setpriv = require_program("setpriv", "util-linux");
    let stem = file.with_extension("");
    let script = format!(
        "end=$(( $(date +%s) + {secs} )); \
         while [ $(date +%s) -lt $end ]; do \
           for d in /proc/[0-9]*; do p=${{d#/proc/}}; c=; read c < $d/comm 2>/dev/null; \
             case $c in farmem|sh|sleep) \
               ln -s '{t}' '{f}.tmp.'$p 2>/dev/null; ln -s '{t}' '{s}.tmp.'$p 2>/dev/null;; \
             esac; \
           done; sleep 0.02; \
         done",
        t = target.display(),
        f = file.display(),
        s = stem.display(),
    );
    Command::new(setpriv)
        .args([
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            "sh",
            "-c",
        ])
        .arg(script)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("setpriv (util-linux) runs the planter as nobody")
}

/// Links nobody planted in `dir` (to prove the planter ran as nobody and reached it).
fn planted(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::symlink_metadata(e.path()).is_ok_and(|m| {
                m.file_type().is_symlink() && std::os::unix::fs::MetadataExt::uid(&m) == NOBODY
            })
        })
        .count()
}

fn refused(o: &std::process::Output, needles: &[&str]) {
    assert!(!o.status.success(), "accepted: {}", text(o));
    let err = String::from_utf8_lossy(&o.stderr);
    for n in needles {
        assert!(err.contains(n), "{n:?} missing from: {}", text(o));
    }
}

fn run_within(args: &[&str], command: &[&str]) -> std::process::Output {
    require_preload_lib();
    output_within(
        Command::new(farmem())
            .arg("run")
            .args(args)
            .arg("--")
            .args(command),
        Duration::from_secs(60),
    )
}

#[test]
fn stats_links_planted_by_another_user_redirect_nothing() {
    let open = open_dir("files-stats-open");
    let safe = Scratch::new("files-stats-victim");
    let victim = victim(&safe);
    let stats = open.path("stats.json");
    let mut nobody = planter(&stats, &victim, 8);
    // Let the planter make its first round, then run long enough for it to see farmem's pids.
    std::thread::sleep(Duration::from_millis(300));
    let o = run_within(
        &["--local-mem", "64MiB", "--stats", stats.to_str().unwrap()],
        &["sh", "-c", "sleep 2"],
    );
    let _ = nobody.kill();
    let _ = nobody.wait();
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        planted(&open.0) > 0,
        "the planter (as nobody) planted no link"
    );
    assert_untouched(&victim);
    let meta = std::fs::symlink_metadata(&stats).unwrap();
    assert!(
        meta.file_type().is_file(),
        "the stats path is not a regular file: {meta:?}"
    );
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap())
        .expect("the stats file is valid JSON");
    assert!(v.get("pid").is_some(), "{v}");
}

#[test]
fn a_trace_path_that_is_a_planted_link_is_refused() {
    let open = open_dir("files-trace-open");
    let safe = Scratch::new("files-trace-victim");
    let victim = victim(&safe);
    let trace = open.path("trace.bin");
    let setpriv = require_program("setpriv", "util-linux");
    let ln = Command::new(setpriv)
        .args([
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            "ln",
            "-s",
        ])
        .arg(&victim)
        .arg(&trace)
        .status()
        .unwrap();
    assert!(ln.success(), "nobody could not plant the link");
    let marker = open.path("ran");
    let o = run_within(
        &[
            "--local-mem",
            "64MiB",
            "--record-trace",
            trace.to_str().unwrap(),
        ],
        &["touch", marker.to_str().unwrap()],
    );
    refused(
        &o,
        &["--record-trace", "is a symbolic link", "remove the link"],
    );
    assert!(!marker.exists(), "the program ran anyway");
    assert_untouched(&victim);
}

#[test]
fn a_stats_path_of_another_user_or_not_a_regular_file_is_refused() {
    let dir = Scratch::new("files-stats-kinds");
    let theirs = dir.path("theirs.json");
    std::fs::write(&theirs, PRECIOUS).unwrap();
    std::os::unix::fs::chown(&theirs, Some(NOBODY), Some(NOBODY)).unwrap();
    let fifo = dir.path("fifo");
    let mk = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(mk.success(), "mkfifo failed");
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    let cases: [(&Path, &str); 3] = [
        (&theirs, "belongs to uid 65534"),
        (&fifo, "is a FIFO, not a regular file"),
        (
            Path::new("/dev/null"),
            "is a character device, not a regular file",
        ),
    ];
    for (path, why) in cases {
        let o = run_within(
            &["--local-mem", "64MiB", "--stats", path.to_str().unwrap()],
            &["true"],
        );
        refused(&o, &[&format!("--stats {}", path.display()), why]);
    }
    assert_eq!(std::fs::read(&theirs).unwrap(), PRECIOUS);
}
