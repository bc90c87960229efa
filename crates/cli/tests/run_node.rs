//! `farmem run` on the host tier: a real `farmem node` process holds the program's overflow as
//! shared memory charged to the node, not to the program's memory cgroup; killing the node
//! mid-run loses nothing already written; the embedded default runs on a private node.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use farmem_node::child::{child_node_command, ChildNode};
use farmem_testkit::bins::{farmem, require_preload_lib};
use farmem_testkit::donor::Donor;
use farmem_testkit::run::*;

/// A `farmem node` child on a socket in `dir`, lending `capacity`.
fn node(dir: &Scratch, capacity: &str) -> (ChildNode, PathBuf) {
    let socket = dir.path("node.sock");
    let n = child_node_command(farmem(), &socket)
        .arg("--capacity")
        .arg(capacity)
        .arg("--slab-size")
        .arg("4MiB")
        .spawn()
        .unwrap_or_else(|e| panic!("the node did not start: {e}"));
    (n, socket)
}

fn tier_hold(dir: &Scratch) -> PathBuf {
    let prog = dir.path("tier_hold");
    compile_c(&c_source("tier_hold.c"), &prog, &[]);
    prog
}

/// A memory cgroup made for one test (v1's memory controller, or v2), removed when dropped.
struct Cgroup {
    dir: PathBuf,
    v1: bool,
}

impl Cgroup {
    fn new(tag: &str) -> Cgroup {
        let name = format!("farmem-test-{tag}-{}", std::process::id());
        let v1 = Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists();
        let dir = if v1 {
            Path::new("/sys/fs/cgroup/memory").join(name)
        } else {
            let root = Path::new("/sys/fs/cgroup");
            assert!(
                root.join("cgroup.controllers").exists(),
                "this test needs a memory cgroup: cgroup v1's memory controller at \
                 /sys/fs/cgroup/memory or cgroup v2 at /sys/fs/cgroup (run as root)"
            );
            let _ = std::fs::write(root.join("cgroup.subtree_control"), "+memory");
            root.join(name)
        };
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        Cgroup { dir, v1 }
    }

    fn set_limit(&self, bytes: u64) {
        let file = if self.v1 {
            "memory.limit_in_bytes"
        } else {
            "memory.max"
        };
        std::fs::write(self.dir.join(file), bytes.to_string()).unwrap();
    }

    /// The most memory charged to the cgroup at once.
    fn peak(&self) -> u64 {
        let file = if self.v1 {
            "memory.max_usage_in_bytes"
        } else {
            "memory.peak"
        };
        std::fs::read_to_string(self.dir.join(file))
            .unwrap_or_else(|e| panic!("reading {file}: {e}"))
            .trim()
            .parse()
            .unwrap()
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[test]
fn a_program_in_a_cgroup_keeps_its_overflow_in_the_node() {
    let dir = Scratch::new("node-cgroup");
    let prog = tier_hold(&dir);
    let (_node, socket) = node(&dir, "1GiB");
    // The program's cgroup may hold 1 GiB: if the tier's pages were charged to it, its peak
    // would show them. Its budget is 64 MiB; it writes 2 × 192 MiB.
    let cg = Cgroup::new("node");
    cg.set_limit(1 << 30);
    let stats = dir.path("stats.json");
    let script = format!(
        "echo $$ > {}/cgroup.procs && exec {} run --node {} --local-mem 64MiB --stats {} -- {} 192",
        cg.dir.display(),
        farmem().display(),
        socket.display(),
        stats.display(),
        prog.display()
    );
    require_preload_lib();
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let text = text(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("checksum "), "{text}");
    let s = read_stats(&stats);
    assert!(far_bytes_out(&s) > 256 << 20, "pages went to the tier: {s}");
    assert_eq!(counter(&s, "remote_bytes_out"), 0, "no donor here: {s}");
    let peak = cg.peak();
    assert!(
        peak <= 160 << 20,
        "the program's cgroup peaked at {peak} bytes for a 64 MiB budget and 384 MiB written: \
         the tier's memory must be charged to the node"
    );
}

/// `farmem run` of tier_hold in the background with stdin piped; returns it once the program
/// said "filled", with its stdout reader.
fn start_holding(
    args: &[&str],
    prog: &Path,
    mib: &str,
) -> (std::process::Child, BufReader<std::process::ChildStdout>) {
    require_preload_lib();
    let mut child = Command::new(farmem())
        .arg("run")
        .args(args)
        .arg("--")
        .arg(prog)
        .arg(mib)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !line.contains("filled") {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 || Instant::now() > deadline {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!("the program did not fill its buffer: {}", text(&o));
        }
    }
    (child, out)
}

#[test]
fn killing_the_node_loses_nothing_already_written() {
    let dir = Scratch::new("node-kill");
    let prog = tier_hold(&dir);
    let want = without_farmem(&prog);
    assert!(want.contains("checksum"), "{want}");

    let (mut node, socket) = node(&dir, "1GiB");
    let donor = Donor::start("1GiB", "4MiB");
    let stats = dir.path("stats.json");
    let (child, out) = start_holding(
        &[
            "--node",
            socket.to_str().unwrap(),
            "--donor",
            &donor.addr.to_string(),
            "--local-mem",
            "32MiB",
            "--stats",
            stats.to_str().unwrap(),
        ],
        &prog,
        "96",
    );
    // Everything written so far is in the tier (the donor has nothing yet).
    let pid = node.pid();
    Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    let _ = node.wait_timeout(Duration::from_secs(10));
    assert_eq!(finish(child, out), want);
    let s = read_stats(&stats);
    assert!(counter(&s, "tier_bytes_out") > 32 << 20, "{s}");
    assert!(
        counter(&s, "remote_bytes_out") > 32 << 20,
        "the second buffer went to the donor once the node was gone: {s}"
    );
}

#[test]
fn the_embedded_default_runs_on_a_private_node() {
    let dir = Scratch::new("node-private");
    let prog = dir.path("seq_scan");
    compile_c(&c_source("seq_scan.c"), &prog, &[]);
    let stats = dir.path("stats.json");
    let o = farmem_run(
        &["--local-mem", "32MiB", "--stats", stats.to_str().unwrap()],
        &[prog.to_str().unwrap(), "96"],
    );
    assert!(o.status.success(), "{}", text(&o));
    let s = read_stats(&stats);
    assert!(counter(&s, "tier_bytes_out") > 32 << 20, "{s}");
    assert!(counter(&s, "tier_bytes_in") > 0, "{s}");
    assert_eq!(counter(&s, "remote_bytes_out"), 0, "{s}");
    // `--local-donor tcp` keeps the embedded TCP donor, for comparison.
    let o = farmem_run(
        &[
            "--local-mem",
            "32MiB",
            "--local-donor",
            "tcp",
            "--stats",
            stats.to_str().unwrap(),
        ],
        &[prog.to_str().unwrap(), "96"],
    );
    assert!(o.status.success(), "{}", text(&o));
    let s = read_stats(&stats);
    assert_eq!(counter(&s, "tier_bytes_out"), 0, "{s}");
    assert!(counter(&s, "remote_bytes_out") > 32 << 20, "{s}");
}

#[test]
fn an_untrusted_node_socket_is_refused_with_the_fix() {
    let dir = Scratch::new("node-untrusted");
    let (_node, socket) = node(&dir, "256MiB");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let o = farmem_run(
        &["--node", socket.to_str().unwrap(), "--local-mem", "32MiB"],
        &["/bin/true"],
    );
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(t.contains("chmod"), "the error says what to run: {t}");
}

/// tier_hold's output on 96 MiB without farmem: what every run under farmem must print.
fn without_farmem(prog: &Path) -> String {
    let mut baseline = Command::new(prog)
        .arg("96")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    baseline.stdin.take().unwrap().write_all(b"go\n").unwrap();
    String::from_utf8(baseline.wait_with_output().unwrap().stdout).unwrap()
}

/// The node's figures, read as a client.
fn node_stats(socket: &Path) -> farmem_node::NodeStats {
    farmem_node::NodeClient::connect(socket, farmem_node::NodeClientConfig::default())
        .and_then(|c| c.stats())
        .unwrap_or_else(|e| panic!("reading the node's stats: {e}"))
}

/// Lets a holding program go on, and returns its output after "filled".
fn finish(mut child: std::process::Child, mut out: BufReader<std::process::ChildStdout>) -> String {
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{rest}{err}");
    format!("filled\n{rest}")
}

#[test]
fn two_programs_share_one_node_within_its_cap() {
    let dir = Scratch::new("node-two");
    let prog = tier_hold(&dir);
    let want = without_farmem(&prog);
    // 96 MiB of tier for two programs that each put about 64 MiB there.
    let (_node, socket) = node(&dir, "96MiB");
    let args = |stats: &Path| {
        vec![
            "--node".to_string(),
            socket.to_str().unwrap().to_string(),
            "--local-mem".into(),
            "32MiB".into(),
            "--stats".into(),
            stats.to_str().unwrap().to_string(),
            // The second program's pages wait over its budget until the first one exits and
            // its slabs come back (by default it would be killed after 30 s at its budget).
            "--over-budget".into(),
            "allow".into(),
        ]
    };
    let (sa, sb) = (dir.path("a.json"), dir.path("b.json"));
    let aa = args(&sa);
    let (a, a_out) = start_holding(
        &aa.iter().map(String::as_str).collect::<Vec<_>>(),
        &prog,
        "96",
    );
    let ab = args(&sb);
    let (b, b_out) = start_holding(
        &ab.iter().map(String::as_str).collect::<Vec<_>>(),
        &prog,
        "96",
    );
    let s = node_stats(&socket);
    assert!(s.used_bytes <= 96 << 20, "the cap holds: {s:?}");
    let holding: Vec<_> = s.clients.iter().filter(|c| c.slabs > 0).collect();
    assert_eq!(holding.len(), 2, "each program is accounted: {s:?}");
    let before: Vec<(u32, u64)> = holding.iter().map(|c| (c.pid, c.slabs)).collect();
    // One program finishes and exits: its slabs go back to the node. (The other's pages that
    // did not fit went to a private node of its own meanwhile, Host tier runtime side, so it
    // kept its budget rather than wait for them.)
    assert_eq!(finish(a, a_out), want);
    let settled = |s: &farmem_node::NodeStats| {
        let left: Vec<_> = before
            .iter()
            .filter_map(|(pid, _)| s.clients.iter().find(|c| c.pid == *pid))
            .collect();
        left.len() == 1 && s.used_bytes == left[0].slabs * s.slab_bytes
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let s = loop {
        let s = node_stats(&socket);
        if settled(&s) || Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        settled(&s),
        "one program left, the other's slabs back to the node ({before:?}): {s:?}"
    );
    assert!(s.used_bytes <= 96 << 20, "{s:?}");
    assert_eq!(finish(b, b_out), want);
    let b_stats = read_stats(&sb);
    assert!(counter(&b_stats, "tier_bytes_out") > 0, "{b_stats}");
}
