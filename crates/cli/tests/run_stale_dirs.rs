//! The sweep of directories killed runs left in `$TMPDIR` (crates/cli/src/cmd/stale_dirs.rs),
//! steered by another local user (nobody, through `setpriv`): directories named like farmem's
//! that nobody made (links to root's files inside, a link in place of a directory, a socket
//! that answers) are kept and nothing outside is followed; in a `$TMPDIR` others may rename
//! entries in (no sticky bit), nothing is removed and `farmem run` refuses to make its own
//! directories there.

use farmem_testkit::bins::*;
use farmem_testkit::run::*;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PRECIOUS: &[u8] = b"root's own bytes\n";

/// A pid that existed and is gone.
fn dead_pid() -> u32 {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

/// `farmem run --local-mem 64MiB -- true` with `TMPDIR=base`.
fn run_in(base: &Path) -> std::process::Output {
    require_preload_lib();
    output_within(
        Command::new(farmem())
            .env("TMPDIR", base)
            .args(["run", "--local-mem", "64MiB", "--", "true"])
            .stdin(Stdio::null()),
        Duration::from_secs(60),
    )
}

/// Runs `script` with `sh -c` as nobody.
fn as_nobody(script: &str) {
    let setpriv = require_program("setpriv", "util-linux");
    let o = Command::new(setpriv)
        .args([
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            "sh",
            "-c",
            script,
        ])
        .output()
        .expect("setpriv (util-linux) runs a shell as nobody");
    assert!(o.status.success(), "as nobody: {script}: {}", text(&o));
}

/// A root-owned directory holding a root-owned file: what must stay untouched.
fn victim(scratch: &Scratch) -> (PathBuf, PathBuf) {
    let dir = scratch.path("victim-dir");
    std::fs::create_dir(&dir).unwrap();
    let file = dir.join("precious");
    std::fs::write(&file, PRECIOUS).unwrap();
    (dir, file)
}

#[test]
fn directories_another_user_made_to_look_like_farmems_are_kept_and_not_followed() {
    let base = Scratch::new("stale-hostile");
    std::fs::set_permissions(&base.0, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let outside = Scratch::new("stale-hostile-victim");
    let (vdir, vfile) = victim(&outside);
    let dead = dead_pid();
    let b = base.0.display();
    let (vd, vf) = (vdir.display(), vfile.display());
    // nobody's: a directory with links to root's file and directory, a link in place of a
    // directory, and a directory whose socket answers (a node run as nobody).
    as_nobody(&format!(
        "mkdir {b}/farmem-run-{dead}-0000abcd && ln -s {vf} {b}/farmem-run-{dead}-0000abcd/budget.sock \
         && ln -s {vd} {b}/farmem-run-{dead}-0000abcd/stats && ln -s {vd} {b}/farmem-node-{dead}-0000beef \
         && mkdir {b}/farmem-node-{dead}-0000cccc"
    ));
    let sock = base
        .0
        .join(format!("farmem-node-{dead}-0000cccc/node.sock"));
    let setpriv = require_program("setpriv", "util-linux");
    let mut listener = Command::new(setpriv)
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .arg(farmem())
        .args(["node", "--capacity", "4MiB", "--socket"])
        .arg(&sock)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while !sock.exists() {
        assert!(
            Instant::now() < until,
            "nobody's listener did not bind {}",
            sock.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // root's own stale directory (a killed run's), with links out of it: removed, the links
    // with it, their targets untouched.
    let mine = base.0.join(format!("farmem-run-{dead}-00001111"));
    std::fs::create_dir(&mine).unwrap();
    std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(&vfile, mine.join("link")).unwrap();
    std::fs::create_dir(mine.join("stats")).unwrap();
    std::os::unix::fs::symlink(&vdir, mine.join("stats/dir")).unwrap();

    let o = run_in(&base.0);
    let _ = listener.kill();
    let _ = listener.wait();
    assert!(o.status.success(), "{}", text(&o));
    assert!(!mine.exists(), "the killed run's directory was not removed");
    for kept in [
        format!("farmem-run-{dead}-0000abcd/budget.sock"),
        format!("farmem-run-{dead}-0000abcd/stats"),
        format!("farmem-node-{dead}-0000beef"),
        format!("farmem-node-{dead}-0000cccc/node.sock"),
    ] {
        assert!(
            std::fs::symlink_metadata(base.0.join(&kept)).is_ok(),
            "nobody's {kept} was removed"
        );
    }
    assert_eq!(std::fs::read(&vfile).unwrap(), PRECIOUS);
    assert_eq!(std::fs::read_dir(&vdir).unwrap().count(), 1);
}

#[test]
fn a_tmpdir_others_may_rename_entries_in_is_not_swept_and_refused() {
    // Others could rename a live run's directory to a dead run's name there, between the
    // sweep's look and its removal.
    let base = Scratch::new("stale-open");
    std::fs::set_permissions(&base.0, std::fs::Permissions::from_mode(0o777)).unwrap();
    let stale = base.0.join(format!("farmem-run-{}-00002222", dead_pid()));
    std::fs::create_dir(&stale).unwrap();
    std::fs::set_permissions(&stale, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(stale.join("keep"), PRECIOUS).unwrap();
    let o = run_in(&base.0);
    assert!(!o.status.success(), "accepted: {}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    for n in [
        base.0.to_str().unwrap(),
        "lacks the sticky bit",
        "use another directory (TMPDIR",
    ] {
        assert!(err.contains(n), "{n:?} missing from: {}", text(&o));
    }
    assert!(
        stale.join("keep").exists(),
        "the sweep removed a directory there"
    );
}
