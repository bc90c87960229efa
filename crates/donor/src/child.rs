//! A `farmem donor` child process, and the one line it prints once it listens.
//!
//! `farmem donor` prints exactly one line to stdout once its socket is bound: the
//! [`DonorBanner`], `farmem donor listening on ADDR`. Whoever starts a donor as a child (the
//! runtime's embedded donor, `farmem run`'s embedded donor, the tests) uses
//! [`ChildDonorCommand`]: it spawns `BIN donor --listen 127.0.0.1:0 --exit-with-parent PID
//! ARGS…`, reads the banner within a deadline and returns a [`ChildDonor`] that kills and reaps
//! the child when dropped.
//!
//! # Design
//!
//! - The child is started with std's `Command::spawn` and no `pre_exec` hook: a hook makes std
//!   fork the whole process instead of using `posix_spawn`, and a fork leaves every page of the
//!   parent's far-memory regions shared copy-on-write, which UFFDIO_MOVE then refuses to evict.
//!   The donor arranges to die with its parent itself (`--exit-with-parent`, which sets
//!   `PR_SET_PDEATHSIG`). The kernel sends that signal when the *thread* that spawned the child
//!   ends, so a caller whose donor must outlive the current thread spawns it from a thread that
//!   lives as long as it needs the donor (the runtime does, from a keeper thread).
//! - The banner is read by polling the stdout pipe until the deadline, on the calling thread.
//!   With the child's stderr inherited ([`DonorStderr::Inherit`]) no thread is started: that
//!   matters inside a program under farmem, where every thread must be marked by the runtime's
//!   thread hook. [`DonorStderr::Capture`] starts one thread that collects stderr, so error
//!   messages and tests can quote it.
//! - After the banner the donor writes nothing more to stdout; the pipe is kept open (the donor
//!   never gets EPIPE) and what it held after the banner can be read once the child has exited.
//!
//! # Limitations
//!
//! The child always listens on 127.0.0.1 with a port the kernel picks: a child donor serves its
//! parent on this host only.

use std::ffi::OsString;
use std::fmt;
use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};

/// What `farmem donor` prints before the address.
const BANNER_PREFIX: &str = "farmem donor listening on ";

/// Default time a child donor has to print its banner (far beyond a normal start, which takes
/// milliseconds, on a loaded 2-core machine).
pub const DEFAULT_BANNER_TIMEOUT: Duration = Duration::from_secs(15);

/// The line `farmem donor` prints to stdout once it listens: `farmem donor listening on ADDR`.
/// `Display` writes it (without the newline), `FromStr` reads it back (a trailing newline is
/// accepted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DonorBanner {
    /// The address the donor listens on (with the real port when it was asked for port 0).
    pub addr: SocketAddr,
}

impl fmt::Display for DonorBanner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{BANNER_PREFIX}{}", self.addr)
    }
}

/// A line that is not a [`DonorBanner`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{line:?} is not a donor banner (`{BANNER_PREFIX}HOST:PORT`)")]
pub struct NotABanner {
    /// The line as read.
    pub line: String,
}

impl FromStr for DonorBanner {
    type Err = NotABanner;

    fn from_str(line: &str) -> Result<DonorBanner, NotABanner> {
        let bare = line.strip_suffix('\n').unwrap_or(line);
        let bare = bare.strip_suffix('\r').unwrap_or(bare);
        bare.strip_prefix(BANNER_PREFIX)
            .and_then(|a| a.parse::<SocketAddr>().ok())
            .map(|addr| DonorBanner { addr })
            .ok_or_else(|| NotABanner {
                line: line.to_string(),
            })
    }
}

/// Where a child donor's stderr (its logs and error messages) goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DonorStderr {
    /// To this process's stderr (the user sees the donor's warnings and errors directly).
    Inherit,
    /// Collected by a thread; quoted in errors and available through
    /// [`ChildDonor::stderr_text`].
    Capture,
}

/// Starting a child donor failed.
#[derive(Debug, thiserror::Error)]
pub enum ChildDonorError {
    /// The binary could not be executed.
    #[error("could not start `{} donor`: {source}", bin.display())]
    Spawn {
        bin: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Reading the child's stdout failed.
    #[error("reading the banner of `{} donor`: {source}", bin.display())]
    ReadBanner {
        bin: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The child ended (or closed its stdout) before printing its banner.
    #[error("`{} donor` exited before listening ({status}){}", bin.display(), stderr_note(.stderr))]
    ExitedEarly {
        bin: PathBuf,
        status: String,
        stderr: Option<String>,
    },
    /// The child printed something else than its banner first.
    #[error("`{} donor` printed an unexpected first line: {source}{}", bin.display(), stderr_note(.stderr))]
    BadBanner {
        bin: PathBuf,
        #[source]
        source: NotABanner,
        stderr: Option<String>,
    },
    /// The child printed no banner within the deadline (it was killed).
    #[error("`{} donor` did not report its address within {} s{}", bin.display(), timeout.as_secs(), stderr_note(.stderr))]
    Timeout {
        bin: PathBuf,
        timeout: Duration,
        stderr: Option<String>,
    },
}

impl ChildDonorError {
    /// The child's captured stderr, when it was captured and the child got far enough to run.
    pub fn stderr(&self) -> Option<&str> {
        match self {
            ChildDonorError::ExitedEarly { stderr, .. }
            | ChildDonorError::BadBanner { stderr, .. }
            | ChildDonorError::Timeout { stderr, .. } => stderr.as_deref(),
            ChildDonorError::Spawn { .. } | ChildDonorError::ReadBanner { .. } => None,
        }
    }
}

fn stderr_note(stderr: &Option<String>) -> String {
    match stderr {
        None => "; see its messages above".to_string(),
        Some(s) if s.trim().is_empty() => "; it wrote nothing to stderr".to_string(),
        Some(s) => format!("; its stderr:\n{}", s.trim_end()),
    }
}

/// How to start a child donor: `BIN donor --listen 127.0.0.1:0 --exit-with-parent PID ARGS…`.
#[derive(Debug, Clone)]
pub struct ChildDonorCommand {
    bin: PathBuf,
    args: Vec<OsString>,
    envs: Vec<(OsString, OsString)>,
    stderr: DonorStderr,
    banner_timeout: Duration,
}

impl ChildDonorCommand {
    /// A donor run by the `farmem` binary `bin`, its stderr inherited, with
    /// [`DEFAULT_BANNER_TIMEOUT`].
    pub fn new(bin: impl Into<PathBuf>) -> ChildDonorCommand {
        ChildDonorCommand {
            bin: bin.into(),
            args: Vec::new(),
            envs: Vec::new(),
            stderr: DonorStderr::Inherit,
            banner_timeout: DEFAULT_BANNER_TIMEOUT,
        }
    }

    /// Adds an argument of `farmem donor` (after the listen address and the parent's pid).
    pub fn arg(mut self, arg: impl Into<OsString>) -> ChildDonorCommand {
        self.args.push(arg.into());
        self
    }

    /// Adds arguments of `farmem donor`.
    pub fn args<I, S>(mut self, args: I) -> ChildDonorCommand
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets an environment variable of the child.
    pub fn env(
        mut self,
        key: impl Into<OsString>,
        value: impl Into<OsString>,
    ) -> ChildDonorCommand {
        self.envs.push((key.into(), value.into()));
        self
    }

    /// Where the child's stderr goes.
    pub fn stderr(mut self, stderr: DonorStderr) -> ChildDonorCommand {
        self.stderr = stderr;
        self
    }

    /// How long the child has to print its banner before it is killed.
    pub fn banner_timeout(mut self, timeout: Duration) -> ChildDonorCommand {
        self.banner_timeout = timeout;
        self
    }

    /// The `farmem` binary this command runs.
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// Spawns the donor and waits for its banner. The child dies with the calling thread (see
    /// the module docs) and when the returned [`ChildDonor`] is dropped.
    pub fn spawn(self) -> Result<ChildDonor, ChildDonorError> {
        let mut cmd = Command::new(&self.bin);
        cmd.arg("donor")
            .args(["--listen", "127.0.0.1:0", "--exit-with-parent"])
            .arg(std::process::id().to_string())
            .args(&self.args)
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(match self.stderr {
                DonorStderr::Inherit => Stdio::inherit(),
                DonorStderr::Capture => Stdio::piped(),
            });
        let mut child = cmd.spawn().map_err(|source| ChildDonorError::Spawn {
            bin: self.bin.clone(),
            source,
        })?;
        let stderr = child.stderr.take().map(StderrCollector::start);
        let mut stdout = child.stdout.take().expect("stdout is piped");
        let mut pending = Vec::new();
        let deadline = Instant::now() + self.banner_timeout;
        let line = read_line_until(&mut stdout, &mut pending, deadline);
        let mut donor = ChildDonor {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            stdout: Some(stdout),
            after_banner: pending,
            stderr,
        };
        let failure = match line {
            Ok(Line::Read(line)) => match line.parse::<DonorBanner>() {
                Ok(banner) => {
                    donor.addr = banner.addr;
                    return Ok(donor);
                }
                Err(source) => ChildDonorFailure::BadBanner(source),
            },
            Ok(Line::Eof) => ChildDonorFailure::ExitedEarly,
            Ok(Line::TimedOut) => ChildDonorFailure::Timeout,
            Err(source) => {
                return Err(ChildDonorError::ReadBanner {
                    bin: self.bin,
                    source,
                })
            }
        };
        let (status, stderr) = donor.stop_and_collect();
        let bin = self.bin;
        Err(match failure {
            ChildDonorFailure::BadBanner(source) => ChildDonorError::BadBanner {
                bin,
                source,
                stderr,
            },
            ChildDonorFailure::ExitedEarly => ChildDonorError::ExitedEarly {
                bin,
                status: status.map_or_else(|| "status unknown".into(), |s| s.to_string()),
                stderr,
            },
            ChildDonorFailure::Timeout => ChildDonorError::Timeout {
                bin,
                timeout: self.banner_timeout,
                stderr,
            },
        })
    }
}

enum ChildDonorFailure {
    BadBanner(NotABanner),
    ExitedEarly,
    Timeout,
}

enum Line {
    Read(String),
    Eof,
    TimedOut,
}

/// Reads one line from `out` (bytes beyond it stay in `pending`), waiting until `deadline`.
fn read_line_until(
    out: &mut ChildStdout,
    pending: &mut Vec<u8>,
    deadline: Instant,
) -> std::io::Result<Line> {
    let mut chunk = [0u8; 512];
    loop {
        if let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            return Ok(Line::Read(String::from_utf8_lossy(&line).into_owned()));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(Line::TimedOut);
        }
        let timeout = Timespec::try_from(left).unwrap_or(Timespec {
            tv_sec: i64::MAX,
            tv_nsec: 0,
        });
        let mut fds = [PollFd::new(&*out, PollFlags::IN)];
        match poll(&mut fds, Some(&timeout)) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
        match out.read(&mut chunk) {
            Ok(0) => return Ok(Line::Eof),
            Ok(n) => pending.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// A thread collecting a child's stderr.
struct StderrCollector {
    text: Arc<Mutex<Vec<u8>>>,
    thread: Option<JoinHandle<()>>,
}

impl StderrCollector {
    fn start(mut pipe: std::process::ChildStderr) -> StderrCollector {
        let text = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&text);
        let thread = std::thread::Builder::new()
            .name("farmem-donor-stderr".into())
            .spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = pipe.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    sink.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .extend_from_slice(&buf[..n]);
                }
            })
            .ok();
        StderrCollector { text, thread }
    }

    /// Everything collected so far; with `finish`, waits for the pipe's end first.
    fn text(&mut self, finish: bool) -> String {
        if finish {
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
        String::from_utf8_lossy(&self.text.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }
}

/// A running child donor. Dropping it kills and reaps the child.
pub struct ChildDonor {
    child: Child,
    addr: SocketAddr,
    stdout: Option<ChildStdout>,
    after_banner: Vec<u8>,
    stderr: Option<StderrCollector>,
}

impl ChildDonor {
    /// The address from the donor's banner.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The child's exit status, if it has exited (reaps it then).
    pub fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        self.child.try_wait()
    }

    /// Waits for the child to exit, at most `limit`; `None` if it is still running.
    pub fn wait_timeout(&mut self, limit: Duration) -> std::io::Result<Option<ExitStatus>> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(st) = self.child.try_wait()? {
                return Ok(Some(st));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What the child wrote to stderr so far (`None` unless started with
    /// [`DonorStderr::Capture`]). Once the child has exited, waits for the pipe's end so no late
    /// line is missed.
    pub fn stderr_text(&mut self) -> Option<String> {
        let exited = matches!(self.child.try_wait(), Ok(Some(_)));
        self.stderr.as_mut().map(|c| c.text(exited))
    }

    /// After the child exited: what it wrote to stdout after its banner (the banner is its only
    /// line, so anything here is a bug). `None` while it is still running.
    pub fn stdout_after_banner(&mut self) -> Option<String> {
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            return None;
        }
        let mut rest = std::mem::take(&mut self.after_banner);
        if let Some(mut out) = self.stdout.take() {
            let _ = out.read_to_end(&mut rest);
        }
        Some(String::from_utf8_lossy(&rest).into_owned())
    }

    /// Kills and reaps the child; returns its status and (when captured) its whole stderr.
    fn stop_and_collect(&mut self) -> (Option<ExitStatus>, Option<String>) {
        let _ = self.child.kill();
        let status = self.child.wait().ok();
        let stderr = self.stderr.as_mut().map(|c| c.text(true));
        (status, stderr)
    }
}

impl fmt::Debug for ChildDonor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChildDonor")
            .field("pid", &self.child.id())
            .field("addr", &self.addr)
            .finish()
    }
}

impl Drop for ChildDonor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_banner_prints_and_parses_back() {
        let b = DonorBanner {
            addr: "127.0.0.1:40123".parse().unwrap(),
        };
        let line = b.to_string();
        assert_eq!(line, "farmem donor listening on 127.0.0.1:40123");
        assert_eq!(line.parse::<DonorBanner>().unwrap(), b);
        assert_eq!(format!("{line}\n").parse::<DonorBanner>().unwrap(), b);
        let v6 = DonorBanner {
            addr: "[::1]:7070".parse().unwrap(),
        };
        assert_eq!(v6.to_string().parse::<DonorBanner>().unwrap(), v6);
    }

    #[test]
    fn other_lines_are_not_banners() {
        for line in [
            "something else",
            "farmem donor listening on",
            "farmem donor listening on localhost:7070",
            "farmem donor listening on 127.0.0.1:7070 (capacity 1 GiB)",
        ] {
            let e = line.parse::<DonorBanner>().unwrap_err();
            assert_eq!(e.line, line);
            assert!(e.to_string().contains("not a donor banner"), "{e}");
        }
    }

    #[test]
    fn a_binary_that_is_missing_is_a_spawn_error_naming_it() {
        let e = ChildDonorCommand::new("/nonexistent/farmem")
            .spawn()
            .unwrap_err();
        assert!(matches!(e, ChildDonorError::Spawn { .. }), "{e}");
        assert!(e.to_string().contains("/nonexistent/farmem donor"), "{e}");
    }

    #[test]
    fn a_child_that_prints_no_banner_is_reported_with_its_stderr() {
        // `sh donor --listen …` fails: sh cannot open a script named `donor`.
        let e = ChildDonorCommand::new("/bin/sh")
            .stderr(DonorStderr::Capture)
            .spawn()
            .unwrap_err();
        assert!(matches!(e, ChildDonorError::ExitedEarly { .. }), "{e}");
        assert!(e.stderr().is_some_and(|s| s.contains("donor")), "{e}");
        assert!(e.to_string().contains("exited before listening"), "{e}");
    }

    /// A stand-in for the `farmem` binary: a shell script with this body (its arguments are
    /// `donor --listen …`, ignored).
    fn fake_farmem(tag: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p =
            std::env::temp_dir().join(format!("farmem-child-test-{tag}-{}", std::process::id()));
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn the_banner_gives_the_address_and_drop_kills_the_child() {
        let bin = fake_farmem(
            "ok",
            "echo 'farmem donor listening on 127.0.0.1:5555'; exec sleep 60",
        );
        let mut d = ChildDonorCommand::new(&bin).spawn().unwrap();
        std::fs::remove_file(&bin).unwrap();
        assert_eq!(d.addr(), "127.0.0.1:5555".parse().unwrap());
        assert_eq!(d.stdout_after_banner(), None, "still running");
        let pid = rustix::process::Pid::from_raw(d.pid() as i32).unwrap();
        drop(d);
        // reaped: the pid no longer names a process of ours
        assert!(rustix::process::test_kill_process(pid).is_err());
    }

    #[test]
    fn no_banner_within_the_deadline_is_a_timeout_and_the_child_is_killed() {
        let bin = fake_farmem("slow", "echo starting >&2; exec sleep 60");
        let start = Instant::now();
        let e = ChildDonorCommand::new(&bin)
            .stderr(DonorStderr::Capture)
            .banner_timeout(Duration::from_millis(300))
            .spawn()
            .unwrap_err();
        std::fs::remove_file(&bin).unwrap();
        assert!(matches!(e, ChildDonorError::Timeout { .. }), "{e}");
        assert!(start.elapsed() < Duration::from_secs(10), "{e}");
        assert_eq!(e.stderr().map(str::trim), Some("starting"), "{e}");
    }
}
