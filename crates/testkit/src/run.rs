//! `farmem run` for tests: in the foreground or in the background (killed with its whole
//! process group when dropped), programs the tests need, scratch directories, C programs, and
//! the stats file the preload library writes.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::bins::{farmem, require_preload_lib};

/// The path of `program`, or a test failure naming the Debian package that provides it.
pub fn require_program(program: &str, package: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in
        std::env::split_paths(&path).chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")])
    {
        let p = dir.join(program);
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "{program} is not installed: install the Debian package {package} (scripts/setup.sh does)"
    );
}

/// A scratch directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let p =
            std::env::temp_dir().join(format!("farmem-test-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A C test program of crates/cli/tests/c/ (compile it with [`compile_c`]).
pub fn c_source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../cli/tests/c")
        .join(name)
}

/// Compiles the C file `src` into `out` with the system C compiler.
pub fn compile_c(src: &Path, out: &Path, extra: &[&str]) {
    let cc = require_program("cc", "build-essential");
    let o = Command::new(cc)
        .args(["-O2", "-pthread", "-Wall", "-o"])
        .arg(out)
        .arg(src)
        .args(extra)
        .output()
        .expect("running cc");
    assert!(
        o.status.success(),
        "compiling {}: {}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `farmem run ARGS -- COMMAND`, waiting for it.
pub fn farmem_run(args: &[&str], command: &[&str]) -> Output {
    require_preload_lib();
    Command::new(farmem())
        .arg("run")
        .args(args)
        .arg("--")
        .args(command)
        .stdin(Stdio::null())
        .output()
        .expect("starting farmem run")
}

/// A `farmem run` started in the background, in its own process group, its output in a log
/// file. Dropping it kills the whole group (farmem run, the program, the embedded donor), so a
/// failing test leaves nothing behind.
pub struct Running {
    pub child: Child,
    pub log: PathBuf,
}

impl Running {
    /// The log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits up to `timeout` for `farmem run` to end; a test failure (with the log) otherwise.
    pub fn wait(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(
                start.elapsed() < timeout,
                "farmem run did not end within {timeout:?}; log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until `path` exists (a program's step announced there); a test failure with the
    /// log if `farmem run` ends first or 120 s pass.
    pub fn wait_for_file(&mut self, path: &Path) {
        let start = Instant::now();
        while !path.exists() {
            if let Some(st) = self.child.try_wait().unwrap() {
                panic!("farmem run ended ({st}) early; log:\n{}", self.log_text());
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "{} never appeared; log:\n{}",
                path.display(),
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends `sig` to `farmem run` (which passes SIGTERM/SIGHUP on to the program).
    pub fn signal(&self, sig: &str) {
        let st = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success());
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // the group's id is farmem run's pid (process_group(0) below)
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", self.child.id())])
                .status();
            let _ = self.child.wait();
        }
    }
}

/// Starts `farmem run ARGS -- COMMAND` in the background, output to `log`.
pub fn farmem_spawn(args: &[&str], command: &[&str], log: &Path) -> Running {
    farmem_spawn_env(args, command, log, &[])
}

/// [`farmem_spawn`] with environment variables `env` set for `farmem run` (and so the program).
pub fn farmem_spawn_env(
    args: &[&str],
    command: &[&str],
    log: &Path,
    env: &[(&str, &Path)],
) -> Running {
    use std::os::unix::process::CommandExt;
    require_preload_lib();
    let out = std::fs::File::create(log).unwrap();
    let err = out.try_clone().unwrap();
    let child = Command::new(farmem())
        .envs(env.iter().copied())
        .arg("run")
        .args(args)
        .arg("--")
        .args(command)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .expect("starting farmem run");
    Running {
        child,
        log: log.to_path_buf(),
    }
}

/// Runs `cmd` to completion within `timeout` (killed and a test failure otherwise).
pub fn output_within(cmd: &mut Command, timeout: Duration) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > timeout {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!("{cmd:?} did not finish within {timeout:?}: {}", text(&o));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    child.wait_with_output().unwrap()
}

/// Waits for a spawned child with piped output, up to `timeout` (killed and a test failure
/// otherwise).
pub fn wait_output(child: Child, timeout: Duration) -> Output {
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(o) => o.expect("waiting for the child"),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("pid {pid} did not finish within {timeout:?}");
        }
    }
}

/// Text of an output, for messages.
pub fn text(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Compiles tests/c/NAME.c into `dir` and runs it once without farmem with `arg`: its path and
/// what it printed, which the run under farmem must print too.
pub fn c_program_with_plain_output(dir: &Scratch, name: &str, arg: &str) -> (PathBuf, String) {
    let prog = dir.path(name);
    compile_c(&c_source(&format!("{name}.c")), &prog, &[]);
    let plain = output_within(Command::new(&prog).arg(arg), Duration::from_secs(120));
    assert!(
        plain.status.success(),
        "{name} without farmem: {}",
        text(&plain)
    );
    (prog, String::from_utf8(plain.stdout).expect("UTF-8 output"))
}

/// Runs tests/c/NAME.c with `arg` without farmem, then under `farmem run --local-mem LOCAL`;
/// checks that both succeed and print the same, and returns farmem's run and its stats.
pub fn c_program_same_both_ways(name: &str, arg: &str, local: &str) -> (Output, serde_json::Value) {
    let dir = Scratch::new(&format!("c-{name}"));
    let (prog, want) = c_program_with_plain_output(&dir, name, arg);
    let stats = dir.path("stats.json");
    let o = farmem_run(
        &["--local-mem", local, "--stats", stats.to_str().unwrap()],
        &[prog.to_str().unwrap(), arg],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), want, "{}", text(&o));
    let s = read_stats(&stats);
    (o, s)
}

/// The stats file written by the library, as JSON.
pub fn read_stats(path: &Path) -> serde_json::Value {
    let s = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading the stats file {}: {e}", path.display()));
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("stats file is not JSON ({e}): {s}"))
}

/// A figure of the stats file's `summary` object.
pub fn counter(stats: &serde_json::Value, key: &str) -> u64 {
    stats["summary"][key]
        .as_u64()
        .unwrap_or_else(|| panic!("stats have no summary figure {key}: {stats}"))
}

/// Page bytes that left the program's memory: to donors and into the host tier.
pub fn far_bytes_out(stats: &serde_json::Value) -> u64 {
    counter(stats, "remote_bytes_out") + counter(stats, "tier_bytes_out")
}

/// Checks that more than `min_out` page bytes went far and that some came back (by a fault or
/// installed ahead of one).
pub fn assert_went_far_and_came_back(stats: &serde_json::Value, min_out: u64) {
    assert!(
        far_bytes_out(stats) > min_out,
        "more than {min_out} bytes should have gone far: {stats}"
    );
    assert!(
        far_bytes_in(stats) > 0,
        "pages should have come back from far memory: {stats}"
    );
}

/// Page bytes brought back into the program's memory: from donors and from the host tier.
pub fn far_bytes_in(stats: &serde_json::Value) -> u64 {
    counter(stats, "remote_bytes_in") + counter(stats, "tier_bytes_in")
}
