//! docs/operating.md, run: every shell block of the operator's guide is run on the host it
//! names, in order, so the guide cannot go stale.
//!
//! The guide's hosts are made here: `donor-a` and `donor-b` are network namespaces joined to
//! this one by veth links (testkit's [`Host`]), `app` is this namespace. Each host also gets a
//! PID and mount namespace of its own (`unshare --pid --mount-proc`), so the guide's
//! `pkill -f "farmem donor"` on donor-a reaches that host's donor and nothing else on the
//! machine. The guide's system paths (`/etc/farmem`, `/run/farmem`, `/var/log/farmem`) are
//! moved into a scratch directory per host, `farmem` is this build's binary, and the variables
//! the guide says to set (`DONOR_A`, `DONOR_B`, `HOST_IP`, `IFACE`, `FARMEM_SECRET`) are set.
//!
//! A block is a fence whose info string is `sh` followed by `host=NAME[,NAME…]` (or
//! `host=every`); a block that must not run here (installing into /usr/local) says
//! `not-run=REASON`, and any other `sh` block fails the test, so nothing is left unchecked by
//! accident. A block fails the test if it exits non-zero or runs over its time limit; its
//! output and the hosts' logs are shown.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use farmem_testkit::bins::{farmem, require_preload_lib};
use farmem_testkit::netns::Host;
use farmem_testkit::run::{require_program, Scratch};

/// The longest one block may run (its waits for heals included).
const BLOCK_LIMIT: Duration = Duration::from_secs(240);

/// One shell block of the guide.
#[derive(Debug)]
struct Block {
    line: usize,
    hosts: Vec<String>,
    not_run: Option<String>,
    text: String,
}

fn blocks(guide: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut lines = guide.lines().enumerate();
    while let Some((n, l)) = lines.next() {
        let Some(info) = l.trim_start().strip_prefix("```") else {
            continue;
        };
        let mut words = info.split_whitespace();
        let lang = words.next().unwrap_or("");
        let mut text = String::new();
        for (_, l) in lines.by_ref() {
            if l.trim_start().starts_with("```") {
                break;
            }
            text.push_str(l);
            text.push('\n');
        }
        if lang != "sh" {
            continue;
        }
        let mut hosts = Vec::new();
        let mut not_run = None;
        for w in words {
            if let Some(h) = w.strip_prefix("host=") {
                hosts = h.split(',').map(String::from).collect();
            } else if let Some(r) = w.strip_prefix("not-run=") {
                not_run = Some(r.to_string());
            }
        }
        assert!(
            !hosts.is_empty() || not_run.is_some(),
            "docs/operating.md line {}: a sh block names no host= (or not-run=REASON)",
            n + 1
        );
        out.push(Block {
            line: n + 1,
            hosts,
            not_run,
            text,
        });
    }
    out
}

/// One of the guide's hosts: its network (None: this namespace), its PID and mount namespace
/// (the `unshare` child, killed with everything in it when dropped), its scratch paths.
struct GuideHost {
    name: &'static str,
    net: Option<Host>,
    unshare: Child,
    init_pid: u32,
    root: PathBuf,
}

impl GuideHost {
    fn start(name: &'static str, net: Option<Host>, scratch: &Path) -> GuideHost {
        let root = scratch.join(name);
        for d in ["etc", "run", "log"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        let unshare_args = [
            "--pid",
            "--mount",
            "--fork",
            "--mount-proc",
            "--kill-child",
            "sleep",
            "infinity",
        ];
        let unshare = require_program("unshare", "util-linux");
        let mut cmd = match &net {
            Some(h) => {
                let mut c = h.command(unshare.to_str().unwrap());
                c.args(unshare_args);
                c
            }
            None => {
                let mut c = Command::new(&unshare);
                c.args(unshare_args);
                c
            }
        };
        let child = cmd
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting host {name}'s namespaces: {e}"));
        // The namespace's first process (pid 1 inside) is unshare's child.
        let start = Instant::now();
        let init_pid = loop {
            let path = format!("/proc/{0}/task/{0}/children", child.id());
            if let Some(p) = std::fs::read_to_string(path)
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse().ok())
            {
                break p;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "no init in {name}"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        GuideHost {
            name,
            net,
            unshare: child,
            init_pid,
            root,
        }
    }

    fn ip(&self) -> String {
        self.net
            .as_ref()
            .map_or("127.0.0.1".into(), |h| h.ip().to_string())
    }

    fn iface(&self) -> String {
        self.net
            .as_ref()
            .map_or("lo".into(), |h| h.host_link().to_string())
    }

    /// The block's text with the guide's system paths moved into this host's scratch.
    fn localize(&self, text: &str) -> String {
        let at = |d: &str| self.root.join(d).display().to_string();
        text.replace("/etc/farmem", &at("etc"))
            .replace("/run/farmem", &at("run"))
            .replace("/var/log/farmem", &at("log"))
    }

    /// Runs `text` with bash (errexit, pipefail) inside the host's namespaces; its output goes
    /// to a file, not a pipe, so a server the block leaves running holds no pipe open.
    fn run(&self, line: usize, text: &str, env: &BTreeMap<String, String>) -> (bool, String) {
        let nsenter = require_program("nsenter", "util-linux");
        let out_path = self.root.join(format!("block-{line}.out"));
        let out = std::fs::File::create(&out_path).unwrap();
        let mut cmd = Command::new(nsenter);
        cmd.args(["-t", &self.init_pid.to_string(), "-p", "-m"]);
        if self.net.is_some() {
            cmd.arg("-n");
        }
        let mut child = cmd
            .args(["--", "bash", "-euo", "pipefail", "-c", &self.localize(text)])
            .envs(env)
            .env("HOST_IP", self.ip())
            .env("IFACE", self.iface())
            .current_dir(&self.root)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("starting nsenter");
        let start = Instant::now();
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break Some(st);
            }
            if start.elapsed() > BLOCK_LIMIT {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let text = std::fs::read_to_string(&out_path).unwrap_or_default();
        match status {
            Some(st) => (st.success(), format!("({st})\n{text}")),
            None => (false, format!("(over {BLOCK_LIMIT:?}: killed)\n{text}")),
        }
    }

    /// Every log of the host, for a failure's message.
    fn logs(&self) -> String {
        let mut s = String::new();
        for e in std::fs::read_dir(self.root.join("log"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            s.push_str(&format!(
                "--- {}:{} (last 40 lines)\n",
                self.name,
                e.path().display()
            ));
            for l in tail.iter().rev() {
                s.push_str(l);
                s.push('\n');
            }
        }
        s
    }
}

impl Drop for GuideHost {
    fn drop(&mut self) {
        // unshare --kill-child kills the namespace's init, and with it every process there.
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
    }
}

#[test]
fn the_operators_guide_runs_as_written() {
    require_preload_lib();
    let guide_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/operating.md");
    let guide = std::fs::read_to_string(&guide_path).expect("reading docs/operating.md");
    let blocks = blocks(&guide);
    let not_run: Vec<&Block> = blocks.iter().filter(|b| b.not_run.is_some()).collect();
    assert!(
        not_run.len() <= 2,
        "only installing may be left out: {not_run:?}"
    );
    assert!(blocks.len() >= 10, "the guide has {} blocks", blocks.len());

    let scratch = Scratch::new("guide");
    let hosts = [
        GuideHost::start("app", None, &scratch.0),
        GuideHost::start("donor-a", Some(Host::new()), &scratch.0),
        GuideHost::start("donor-b", Some(Host::new()), &scratch.0),
    ];
    let bin = farmem();
    let mut env = BTreeMap::new();
    env.insert(
        "PATH".into(),
        format!(
            "{}:{}",
            bin.parent().unwrap().display(),
            std::env::var("PATH").unwrap_or_default()
        ),
    );
    env.insert("DONOR_A".into(), hosts[1].ip());
    env.insert("DONOR_B".into(), hosts[2].ip());
    let secret: String = (0..32)
        .map(|i| char::from(b'a' + ((std::process::id() as usize * 7 + i * 13) % 26) as u8))
        .collect();
    env.insert("FARMEM_SECRET".into(), secret);

    for b in blocks.iter().filter(|b| b.not_run.is_none()) {
        let on: Vec<&GuideHost> = if b.hosts == ["every"] {
            hosts.iter().collect()
        } else {
            b.hosts
                .iter()
                .map(|n| {
                    hosts
                        .iter()
                        .find(|h| h.name == n)
                        .unwrap_or_else(|| panic!("line {}: no host {n}", b.line))
                })
                .collect()
        };
        for h in on {
            let (ok, out) = h.run(b.line, &b.text, &env);
            println!("--- line {} on {}: {out}", b.line, h.name);
            if !ok {
                let logs: String = hosts.iter().map(GuideHost::logs).collect();
                panic!(
                    "docs/operating.md line {} on {} failed {out}\n--- block:\n{}\n{logs}",
                    b.line, h.name, b.text
                );
            }
        }
    }
}
