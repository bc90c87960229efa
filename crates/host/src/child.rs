//! A `farmem` server subcommand run as a child process (`farmem donor`, `farmem node`), and the
//! one line it prints once it listens.
//!
//! Such a server prints exactly one line to stdout once its socket is bound, its banner: the
//! [`DonorBanner`] `farmem donor listening on ADDR`, or the node's `farmem node listening on
//! PATH` (`farmem_node::NodeBanner`). Whoever starts one as a child (the runtime's embedded
//! donor or private node, `farmem run`, the tests) uses [`ChildServerCommand`]: it spawns
//! `BIN SUBCOMMAND DEFAULT_ARGS… --exit-with-parent PID ARGS…`, reads the banner within a
//! deadline and returns a [`ChildServer`] that kills and reaps the child when dropped. The
//! banner type says which server it is ([`ServerBanner`]); [`ChildDonorCommand`] and
//! [`ChildDonor`] are the donor's names for the generic types (`--listen 127.0.0.1:0` by
//! default).
//!
//! # Design
//!
//! - The child is started with std's `Command::spawn` and no `pre_exec` hook: a hook makes std
//!   fork the whole process instead of using `posix_spawn`, and a fork leaves every page of the
//!   parent's far-memory regions shared copy-on-write, which UFFDIO_MOVE then refuses to evict.
//!   The server arranges to die with its parent itself (`--exit-with-parent`, which sets
//!   `PR_SET_PDEATHSIG`). The kernel sends that signal when the *thread* that spawned the child
//!   ends, so a caller whose server must outlive the current thread spawns it from a thread that
//!   lives as long as it needs the server (the runtime does, from a keeper thread).
//! - The child is the leader of a process group of its own, so signals sent to the caller's
//!   group (a terminal's Ctrl-C, `timeout`) do not reach it: it serves the pages of processes
//!   that may be handling those very signals.
//! - The banner is read by polling the stdout pipe until the deadline, on the calling thread.
//!   With the child's stderr inherited ([`ServerStderr::Inherit`]) no thread is started: that
//!   matters inside a program under farmem, where every thread must be marked by the runtime's
//!   thread hook. [`ServerStderr::Capture`] starts one thread that collects stderr, so error
//!   messages and tests can quote it.
//! - After the banner the server writes nothing more to stdout; the pipe is kept open (it never
//!   gets EPIPE) and what it held after the banner can be read once the child has exited.
//! - A launcher that execs the server in place (`ip netns exec NS`, for the tests' donors in
//!   network namespaces) may come first: the pid, kills and `--exit-with-parent` then still
//!   reach the server itself.
//!
//! # Limitations
//!
//! A child donor listens on 127.0.0.1 with a port the kernel picks unless told otherwise
//! ([`ChildServerCommand::listen`]): by default it serves its parent on this host only.

use std::ffi::OsString;
use std::fmt;
use std::io::Read;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};

/// What `farmem donor` prints before the address.
const BANNER_PREFIX: &str = "farmem donor listening on ";

/// Default time a child server has to print its banner (far beyond a normal start, which takes
/// milliseconds, on a loaded 2-core machine).
pub const DEFAULT_BANNER_TIMEOUT: Duration = Duration::from_secs(15);

/// The banner of a `farmem` server subcommand: it names the subcommand, the arguments it is
/// always started with as a child, and how its banner line reads back.
pub trait ServerBanner: fmt::Display + fmt::Debug + Sized {
    /// The subcommand of the `farmem` binary (`donor`, `node`).
    const SUBCOMMAND: &'static str;
    /// Arguments every child of this kind gets before the caller's.
    const DEFAULT_ARGS: &'static [&'static str];
    /// Reads a banner line back (a trailing newline is accepted).
    fn parse_line(line: &str) -> Result<Self, NotABanner>;
}

impl ServerBanner for DonorBanner {
    const SUBCOMMAND: &'static str = "donor";
    const DEFAULT_ARGS: &'static [&'static str] = &["--listen", "127.0.0.1:0"];
    fn parse_line(line: &str) -> Result<DonorBanner, NotABanner> {
        line.parse()
    }
}

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

/// A line that is not the banner expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{line:?} is not a {subcommand} banner (`{form}`)")]
pub struct NotABanner {
    /// The line as read.
    pub line: String,
    /// The server whose banner was expected (`donor`, `node`).
    pub subcommand: &'static str,
    /// What the banner looks like.
    pub form: &'static str,
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
                subcommand: "donor",
                form: "farmem donor listening on HOST:PORT",
            })
    }
}

/// Where a child server's stderr (its logs and error messages) goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerStderr {
    /// To this process's stderr (the user sees the server's warnings and errors directly).
    Inherit,
    /// Collected by a thread; quoted in errors and available through
    /// [`ChildServer::stderr_text`].
    Capture,
}

/// The donor's name for [`ServerStderr`].
pub type DonorStderr = ServerStderr;

/// Starting a child server failed. `subcommand` names it (`donor`, `node`).
#[derive(Debug, thiserror::Error)]
pub enum ChildServerError {
    /// The binary could not be executed.
    #[error("could not start `{} {subcommand}`: {source}", bin.display())]
    Spawn {
        bin: PathBuf,
        subcommand: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// Reading the child's stdout failed.
    #[error("reading the banner of `{} {subcommand}`: {source}", bin.display())]
    ReadBanner {
        bin: PathBuf,
        subcommand: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The child ended (or closed its stdout) before printing its banner.
    #[error("`{} {subcommand}` exited before listening ({status}){}", bin.display(), stderr_note(.stderr))]
    ExitedEarly {
        bin: PathBuf,
        subcommand: &'static str,
        status: String,
        stderr: Option<String>,
    },
    /// The child printed something else than its banner first.
    #[error("`{} {subcommand}` printed an unexpected first line: {source}{}", bin.display(), stderr_note(.stderr))]
    BadBanner {
        bin: PathBuf,
        subcommand: &'static str,
        #[source]
        source: NotABanner,
        stderr: Option<String>,
    },
    /// The child printed no banner within the deadline (it was killed).
    #[error("`{} {subcommand}` did not report where it listens within {} s{}", bin.display(), timeout.as_secs(), stderr_note(.stderr))]
    Timeout {
        bin: PathBuf,
        subcommand: &'static str,
        timeout: Duration,
        stderr: Option<String>,
    },
}

/// The donor's name for [`ChildServerError`].
pub type ChildDonorError = ChildServerError;

impl ChildServerError {
    /// The child's captured stderr, when it was captured and the child got far enough to run.
    pub fn stderr(&self) -> Option<&str> {
        match self {
            ChildServerError::ExitedEarly { stderr, .. }
            | ChildServerError::BadBanner { stderr, .. }
            | ChildServerError::Timeout { stderr, .. } => stderr.as_deref(),
            ChildServerError::Spawn { .. } | ChildServerError::ReadBanner { .. } => None,
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

/// How to start a child server whose banner is `B`:
/// `[LAUNCHER…] BIN SUBCOMMAND DEFAULT_ARGS… --exit-with-parent PID ARGS…`.
#[derive(Debug)]
pub struct ChildServerCommand<B> {
    bin: PathBuf,
    launcher: Vec<OsString>,
    default_args: Vec<OsString>,
    args: Vec<OsString>,
    envs: Vec<(OsString, OsString)>,
    stderr: ServerStderr,
    banner_timeout: Duration,
    banner: PhantomData<fn() -> B>,
}

impl<B> Clone for ChildServerCommand<B> {
    fn clone(&self) -> Self {
        ChildServerCommand {
            bin: self.bin.clone(),
            launcher: self.launcher.clone(),
            default_args: self.default_args.clone(),
            args: self.args.clone(),
            envs: self.envs.clone(),
            stderr: self.stderr,
            banner_timeout: self.banner_timeout,
            banner: PhantomData,
        }
    }
}

/// How to start a child donor: `BIN donor --listen 127.0.0.1:0 --exit-with-parent PID ARGS…`.
pub type ChildDonorCommand = ChildServerCommand<DonorBanner>;

impl<B: ServerBanner> ChildServerCommand<B> {
    /// A server run by the `farmem` binary `bin`, its stderr inherited, with
    /// [`DEFAULT_BANNER_TIMEOUT`].
    pub fn new(bin: impl Into<PathBuf>) -> ChildServerCommand<B> {
        ChildServerCommand {
            bin: bin.into(),
            launcher: Vec::new(),
            default_args: B::DEFAULT_ARGS.iter().map(OsString::from).collect(),
            args: Vec::new(),
            envs: Vec::new(),
            stderr: ServerStderr::Inherit,
            banner_timeout: DEFAULT_BANNER_TIMEOUT,
            banner: PhantomData,
        }
    }

    /// Starts the server through `program args…`, which must exec it in place rather than fork
    /// (e.g. `ip netns exec NS`), so the pid, kills and `--exit-with-parent` reach the server.
    pub fn launcher<I, S>(mut self, program: impl Into<OsString>, args: I) -> ChildServerCommand<B>
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.launcher = std::iter::once(program.into())
            .chain(args.into_iter().map(Into::into))
            .collect();
        self
    }

    /// Adds an argument of the subcommand (after its default ones and the parent's pid).
    pub fn arg(mut self, arg: impl Into<OsString>) -> ChildServerCommand<B> {
        self.args.push(arg.into());
        self
    }

    /// Adds arguments of the subcommand.
    pub fn args<I, S>(mut self, args: I) -> ChildServerCommand<B>
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
    ) -> ChildServerCommand<B> {
        self.envs.push((key.into(), value.into()));
        self
    }

    /// Where the child's stderr goes.
    pub fn stderr(mut self, stderr: ServerStderr) -> ChildServerCommand<B> {
        self.stderr = stderr;
        self
    }

    /// How long the child has to print its banner before it is killed.
    pub fn banner_timeout(mut self, timeout: Duration) -> ChildServerCommand<B> {
        self.banner_timeout = timeout;
        self
    }

    /// The `farmem` binary this command runs.
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// Spawns the server and waits for its banner. The child dies with the calling thread (see
    /// the module docs) and when the returned [`ChildServer`] is dropped.
    pub fn spawn(self) -> Result<ChildServer<B>, ChildServerError> {
        let subcommand = B::SUBCOMMAND;
        let mut cmd = match self.launcher.split_first() {
            Some((program, args)) => {
                let mut cmd = Command::new(program);
                cmd.args(args).arg(&self.bin);
                cmd
            }
            None => Command::new(&self.bin),
        };
        cmd.arg(subcommand)
            .args(&self.default_args)
            .arg("--exit-with-parent")
            .arg(std::process::id().to_string())
            .args(&self.args)
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            // A process group of its own: a terminal's Ctrl-C, `timeout` or `kill -- -PGID`
            // meant for the program must not stop the server its pages live on (a SIGTERM to
            // `farmem run`'s group stopped the private node, and the program read zeros); it
            // ends with its parent instead. posix_spawn sets it (no fork).
            .process_group(0)
            .stdout(Stdio::piped())
            .stderr(match self.stderr {
                ServerStderr::Inherit => Stdio::inherit(),
                ServerStderr::Capture => Stdio::piped(),
            });
        let mut child = cmd.spawn().map_err(|source| ChildServerError::Spawn {
            bin: self.bin.clone(),
            subcommand,
            source,
        })?;
        let mut stderr = child
            .stderr
            .take()
            .map(|pipe| StderrCollector::start(pipe, subcommand));
        let mut stdout = child.stdout.take().expect("stdout is piped");
        let mut pending = Vec::new();
        let deadline = Instant::now() + self.banner_timeout;
        let failure = match read_line_until(&mut stdout, &mut pending, deadline) {
            Ok(Line::Read(line)) => match B::parse_line(&line) {
                Ok(banner) => {
                    return Ok(ChildServer {
                        child,
                        banner,
                        stdout: Some(stdout),
                        after_banner: pending,
                        stderr,
                    })
                }
                Err(source) => ChildFailure::BadBanner(source),
            },
            Ok(Line::Eof) => ChildFailure::ExitedEarly,
            Ok(Line::TimedOut) => ChildFailure::Timeout,
            Err(source) => ChildFailure::ReadBanner(source),
        };
        let _ = child.kill();
        let status = child.wait().ok();
        let stderr = stderr.as_mut().map(|c| c.text(true));
        let bin = self.bin;
        Err(match failure {
            ChildFailure::ReadBanner(source) => ChildServerError::ReadBanner {
                bin,
                subcommand,
                source,
            },
            ChildFailure::BadBanner(source) => ChildServerError::BadBanner {
                bin,
                subcommand,
                source,
                stderr,
            },
            ChildFailure::ExitedEarly => ChildServerError::ExitedEarly {
                bin,
                subcommand,
                status: status.map_or_else(|| "status unknown".into(), |s| s.to_string()),
                stderr,
            },
            ChildFailure::Timeout => ChildServerError::Timeout {
                bin,
                subcommand,
                timeout: self.banner_timeout,
                stderr,
            },
        })
    }
}

impl ChildServerCommand<DonorBanner> {
    /// Listens on `addr` (`HOST:PORT`) instead of 127.0.0.1:0. A non-loopback address needs a
    /// token (`--token-file`) or `--insecure` among the arguments.
    pub fn listen(mut self, addr: impl Into<OsString>) -> ChildDonorCommand {
        self.default_args = vec!["--listen".into(), addr.into()];
        self
    }
}

enum ChildFailure {
    ReadBanner(std::io::Error),
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
    fn start(mut pipe: std::process::ChildStderr, subcommand: &str) -> StderrCollector {
        let text = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&text);
        let thread = std::thread::Builder::new()
            .name(format!("farmem-{subcommand}-stderr"))
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

/// A running child server. Dropping it kills and reaps the child.
pub struct ChildServer<B> {
    child: Child,
    banner: B,
    stdout: Option<ChildStdout>,
    after_banner: Vec<u8>,
    stderr: Option<StderrCollector>,
}

/// A running child donor.
pub type ChildDonor = ChildServer<DonorBanner>;

impl ChildServer<DonorBanner> {
    /// The address from the donor's banner.
    pub fn addr(&self) -> SocketAddr {
        self.banner.addr
    }
}

impl<B> ChildServer<B> {
    /// The banner the server printed (where it listens).
    pub fn banner(&self) -> &B {
        &self.banner
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
    /// [`ServerStderr::Capture`]). Once the child has exited, waits for the pipe's end so no late
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
}

impl<B: fmt::Debug> fmt::Debug for ChildServer<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChildServer")
            .field("pid", &self.child.id())
            .field("banner", &self.banner)
            .finish()
    }
}

impl<B> Drop for ChildServer<B> {
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
            assert_eq!(e.subcommand, "donor");
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
    ///
    /// The file is written by a short-lived `sh`, not by this process: a file this process had
    /// open for writing could be inherited by a child another test thread forks at that
    /// moment, and executing it would then fail with ETXTBSY ("Text file busy", seen in CI).
    fn fake_farmem(tag: &str, body: &str) -> PathBuf {
        let p =
            std::env::temp_dir().join(format!("farmem-child-test-{tag}-{}", std::process::id()));
        let status = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(r#"printf '#!/bin/sh\n%s\n' "$1" > "$2" && chmod 755 "$2""#)
            .arg("sh")
            .arg(body)
            .arg(&p)
            .status()
            .unwrap();
        assert!(status.success(), "writing {}", p.display());
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
    fn a_launcher_comes_first_and_listen_replaces_the_default_address() {
        // `sh -c SCRIPT sh BIN donor --listen ADDR …`: the script sees BIN as $1 and the address
        // as $4, and announces that address as the banner.
        let bin = fake_farmem("unused", "exit 1");
        let mut d = ChildDonorCommand::new(&bin)
            .launcher(
                "/bin/sh",
                [
                    "-c",
                    r#"[ "$2 $3" = "donor --listen" ] && echo "farmem donor listening on $4"; exec sleep 60"#,
                    "sh",
                ],
            )
            .listen("10.1.2.3:7070")
            .spawn()
            .unwrap();
        std::fs::remove_file(&bin).unwrap();
        assert_eq!(d.addr(), "10.1.2.3:7070".parse().unwrap());
        assert_eq!(d.stdout_after_banner(), None, "still running");
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
