//! Donors for tests: a real `farmem donor` child process, or a donor server in the test's own
//! process.

use std::net::SocketAddr;
use std::process::{Command, ExitStatus};
use std::time::Duration;

use farmem_donor::{
    ChildDonor, ChildDonorCommand, DonorConfig, DonorServer, DonorStderr, RunningDonor,
};

use crate::bins::farmem;

/// A running `farmem donor` child (`--listen 127.0.0.1:0`, info logs, stderr collected), killed
/// when dropped, so a failing test leaves no donor behind. It also dies with the thread that
/// started it (`--exit-with-parent`).
pub struct Donor {
    child: ChildDonor,
    /// The address from its banner.
    pub addr: SocketAddr,
}

impl Donor {
    /// Runs `farmem donor --listen 127.0.0.1:0 ARGS…` and waits for its banner.
    pub fn spawn(args: &[&str]) -> Donor {
        let child = ChildDonorCommand::new(farmem())
            .args(args)
            .env("FARMEM_LOG", "info")
            .stderr(DonorStderr::Capture)
            .spawn()
            .unwrap_or_else(|e| panic!("starting farmem donor {args:?}: {e}"));
        let addr = child.addr();
        Donor { child, addr }
    }

    /// A donor of `capacity` bytes in slabs of `slab` bytes (e.g. `"64MiB"`, `"1MiB"`).
    pub fn start(capacity: &str, slab: &str) -> Donor {
        Donor::spawn(&["--capacity", capacity, "--slab-size", slab])
    }

    /// The donor's process id.
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// Sends `sig` (as kill(1) spells it, e.g. `-TERM`) to the donor.
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.pid().to_string()])
            .status()
            .expect("run kill(1)")
            .success();
        assert!(ok, "kill {sig} failed");
    }

    /// Waits for the donor to exit (60 s at most: far beyond a clean stop on a loaded machine).
    pub fn wait_exit(&mut self) -> ExitStatus {
        match self.child.wait_timeout(Duration::from_secs(60)) {
            Ok(Some(st)) => st,
            Ok(None) => panic!("the donor did not exit within 60 s"),
            Err(e) => panic!("waiting for the donor: {e}"),
        }
    }

    /// After the donor exited: what it wrote to stdout after its banner, and to stderr. Waits
    /// for the pipes' ends, so no late line is missed.
    pub fn output_after_exit(&mut self) -> (String, String) {
        let rest = self
            .child
            .stdout_after_banner()
            .expect("the donor is still running");
        let stderr = self.child.stderr_text().expect("stderr is captured");
        (rest, stderr)
    }
}

/// A donor server in this process on 127.0.0.1 (a free port), lending `capacity_bytes` in
/// slabs of `slab_bytes`; stopped when dropped or with `RunningDonor::stop`.
pub fn in_process(capacity_bytes: u64, slab_bytes: u64) -> RunningDonor {
    DonorServer::bind(DonorConfig {
        listen: "127.0.0.1:0".into(),
        capacity_bytes,
        slab_size_bytes: slab_bytes,
        ..DonorConfig::default()
    })
    .unwrap_or_else(|e| panic!("starting an in-process donor: {e}"))
    .spawn()
}

/// Writes a `farmem donor --tenants` file into `dir` with a token file (mode 600) per tenant:
/// `(name, token, extra TOML lines)`; returns its path as text.
pub fn tenants_file(dir: &std::path::Path, tenants: &[(&str, &[u8], &str)]) -> String {
    use std::os::unix::fs::PermissionsExt;
    let mut toml = String::new();
    for (name, token, extra) in tenants {
        let tok = dir.join(format!("{name}.token"));
        std::fs::write(&tok, token).expect("writing a token file");
        std::fs::set_permissions(&tok, std::fs::Permissions::from_mode(0o600))
            .expect("making a token file private");
        toml.push_str(&format!(
            "[[tenant]]\nname = \"{name}\"\ntoken_file = \"{name}.token\"\n{extra}\n"
        ));
    }
    let path = dir.join("tenants.toml");
    std::fs::write(&path, toml).expect("writing the tenants file");
    path.to_str().expect("a UTF-8 temp path").to_string()
}
