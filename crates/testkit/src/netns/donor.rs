//! A `farmem donor` in a host of its own, and the failures tests inject into it: a crash, a
//! stall, a cut link, a restart with an empty store.

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use farmem_donor::{ChildDonor, ChildDonorCommand, DonorStderr};

use super::host::Host;
use super::ip::ip_bin;
use crate::bins::farmem;
use crate::run::Scratch;

/// A `farmem donor` listening on its [`Host`]'s address, with a token (its file at
/// [`HostDonor::token_file`], for `farmem run --token-file`). Dropping it kills the donor, then
/// removes the host.
pub struct HostDonor {
    // Fields drop in this order: the donor must be gone before its namespace is deleted.
    donor: Option<ChildDonor>,
    args: Vec<String>,
    addr: SocketAddr,
    token: Vec<u8>,
    token_dir: Scratch,
    host: Host,
    /// What the donor's earlier processes (before a crash or restart) wrote to stderr.
    earlier_log: String,
}

impl HostDonor {
    /// A new host with a donor of `capacity` bytes in slabs of `slab` (e.g. `"64MiB"`,
    /// `"1MiB"`).
    pub fn start(capacity: &str, slab: &str) -> HostDonor {
        HostDonor::spawn(Host::new(), &["--capacity", capacity, "--slab-size", slab])
    }

    /// Like [`HostDonor::start`], with `token` (`farmem run` takes one `--token-file`, so
    /// donors of one run must share their token).
    pub fn start_with_token(capacity: &str, slab: &str, token: &[u8]) -> HostDonor {
        HostDonor::spawn_with_token(
            Host::new(),
            &["--capacity", capacity, "--slab-size", slab],
            token.to_vec(),
        )
    }

    /// Runs `farmem donor --listen HOST_IP:0 --token-file FILE ARGS…` in `host` and waits for
    /// its banner.
    pub fn spawn(host: Host, args: &[&str]) -> HostDonor {
        static TOKENS: AtomicU32 = AtomicU32::new(0);
        let token = format!(
            "host-donor-{}-{}",
            std::process::id(),
            TOKENS.fetch_add(1, Ordering::Relaxed)
        )
        .into_bytes();
        HostDonor::spawn_with_token(host, args, token)
    }

    /// [`HostDonor::spawn`] with the token given.
    pub fn spawn_with_token(host: Host, args: &[&str], token: Vec<u8>) -> HostDonor {
        let token_dir = Scratch::new("host-donor");
        write_token(&token_dir.path("token"), &token);
        let mut d = HostDonor {
            donor: None,
            args: args.iter().map(|a| a.to_string()).collect(),
            addr: SocketAddr::from((host.ip(), 0)),
            token,
            token_dir,
            host,
            earlier_log: String::new(),
        };
        d.launch();
        d
    }

    /// Starts the donor on `self.addr` (port 0 the first time: it keeps the one it got).
    fn launch(&mut self) {
        let child = ChildDonorCommand::new(farmem())
            .launcher(ip_bin(), ["netns", "exec", self.host.name()])
            .listen(self.addr.to_string())
            .arg("--token-file")
            .arg(self.token_file())
            .args(&self.args)
            .env("FARMEM_LOG", "info")
            .stderr(DonorStderr::Capture)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "starting farmem donor {:?} in host {}: {e}",
                    self.args,
                    self.host.name()
                )
            });
        self.addr = child.addr();
        self.donor = Some(child);
    }

    /// Where the root namespace reaches the donor (`--donor ADDR`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The file holding the donor's token (mode 600).
    pub fn token_file(&self) -> PathBuf {
        self.token_dir.path("token")
    }

    /// The donor's token (for `farmem_transport::ClientConfig::token`).
    pub fn token(&self) -> &[u8] {
        &self.token
    }

    /// The host the donor runs in.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The donor's process id, while one runs.
    pub fn pid(&self) -> Option<u32> {
        self.donor.as_ref().map(ChildDonor::pid)
    }

    /// What the running donor wrote to stderr so far.
    pub fn stderr_text(&mut self) -> String {
        self.donor
            .as_mut()
            .and_then(ChildDonor::stderr_text)
            .unwrap_or_default()
    }

    fn running(&self) -> u32 {
        self.pid()
            .unwrap_or_else(|| panic!("no donor runs in host {}", self.host.name()))
    }

    /// Kills the donor with SIGKILL and reaps it: its connections are reset, its store is lost,
    /// and connects are refused until [`HostDonor::restart`].
    pub fn crash(&mut self) {
        signal(self.running(), libc::SIGKILL);
        let mut child = self.donor.take().expect("checked by running()");
        match child.wait_timeout(Duration::from_secs(10)) {
            Ok(Some(_)) => {}
            other => panic!("the donor did not die of SIGKILL within 10 s: {other:?}"),
        }
        if let Some(text) = child.stderr_text() {
            self.earlier_log.push_str(&text);
            self.earlier_log.push_str("(killed)\n");
        }
    }

    /// Stops the donor with SIGSTOP (returns once it is stopped): connections stay open and
    /// connects still complete (the kernel accepts them), but nothing is answered.
    pub fn stall(&self) {
        let pid = self.running();
        signal(pid, libc::SIGSTOP);
        wait_for_state(pid, |s| s == 'T' || s == 't', "stopped");
    }

    /// Lets a stalled donor go on (SIGCONT).
    pub fn resume(&self) {
        let pid = self.running();
        signal(pid, libc::SIGCONT);
        wait_for_state(pid, |s| s != 'T' && s != 't', "running");
    }

    /// Cuts the host's link ([`Host::partition`]): packets are dropped without an answer.
    pub fn partition(&self) {
        self.host.partition();
    }

    /// Restores the host's link.
    pub fn heal_link(&self) {
        self.host.heal_link();
    }

    /// Starts a fresh donor (an empty store) on the same address and port, killing the running
    /// one first if there is one.
    pub fn restart(&mut self) {
        if self.donor.is_some() {
            self.crash();
        }
        self.launch();
    }
}

/// A failing test shows each donor's log (its earlier processes' too): a donor's side of a
/// failure (why it closed a connection, what it refused) is otherwise lost with the test.
impl Drop for HostDonor {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let now = self.stderr_text();
        let log = format!("{}{now}", self.earlier_log);
        let lines: Vec<&str> = log.lines().collect();
        let tail = &lines[lines.len().saturating_sub(DONOR_LOG_LINES)..];
        eprintln!(
            "--- donor {} in host {} (its last {} log lines) ---\n{}",
            self.addr,
            self.host.name(),
            tail.len(),
            tail.join("\n")
        );
    }
}

/// How much of a donor's log a failing test shows.
const DONOR_LOG_LINES: usize = 80;

fn write_token(path: &Path, token: &[u8]) {
    let mut f = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .unwrap_or_else(|e| panic!("creating the token file {}: {e}", path.display()));
    f.write_all(token).unwrap();
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) takes plain integers and touches no memory of ours; pid is a child we have
    // not reaped, so it names no other process.
    let r = unsafe { libc::kill(pid as libc::pid_t, sig) };
    assert_eq!(
        r,
        0,
        "kill({pid}, {sig}): {}",
        std::io::Error::last_os_error()
    );
}

/// Waits until the state letter in /proc/PID/stat satisfies `want` (a signal's effect is not
/// immediate).
fn wait_for_state(pid: u32, want: impl Fn(char) -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The state follows the command name, which is in parentheses and may hold spaces.
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next());
        if state.is_some_and(&want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "donor {pid} is not {what} after 10 s (state {state:?})"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}
