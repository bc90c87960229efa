//! The deployment files of deploy/, checked against the real tools and the real binary.
//!
//! - systemd units: `systemd-analyze verify` prints nothing about them; `systemd-analyze security
//!   --offline=yes` rates their exposure under a bound, and the settings farmem's safety rests on
//!   are there; their ExecStart lines, expanded as systemd would, start the built `farmem`.
//! - Kubernetes manifests: kubernetes-validate (pinned in scripts/setup.sh, strict) accepts them;
//!   they agree with each other (socket path and group, donor names, tokens, seccomp profile);
//!   their containers' commands run: a node and two donors, and the example application's
//!   `farmem run` paging its program through them, all under strace, so that every system call
//!   the node and the donors make is one their unit's SystemCallFilter= allows and every one the
//!   application's process tree makes is one the seccomp profile allows.
//!
//! Needs systemd-analyze (Debian's systemd), strace, and kubernetes-validate in target/tools/venv
//! (with PyYAML, its dependency, which reads the manifests here); scripts/setup.sh installs them
//! and a test without them fails saying so. Every test works in its own temp folder, with port 0.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use farmem_donor::DonorBanner;
use farmem_node::NodeBanner;
use farmem_testkit::run::require_program;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

const FARMEM: &str = env!("CARGO_BIN_EXE_farmem");
/// Where the units expect the binary (the install steps in their header put it there).
const INSTALLED_FARMEM: &str = "/usr/local/bin/farmem";
const UNITS: [&str; 2] = ["farmem-node.service", "farmem-donor.service"];
/// How long a server has to print its banner (a start takes milliseconds; strace and a loaded
/// 2-core machine slow it down).
const BANNER_TIMEOUT: Duration = Duration::from_secs(30);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {mode:o} {}: {e}", path.display()));
}

// ---------------------------------------------------------------------------------------------
// systemd units

/// A unit file's assignments, in order. Our units use no continuation lines or quoting, which
/// keeps this reader exact; it refuses them rather than misread them.
struct Unit {
    name: &'static str,
    text: String,
    entries: Vec<(String, String, String)>,
}

impl Unit {
    fn load(name: &'static str) -> Unit {
        let text = read(&repo().join("deploy/systemd").join(name));
        let mut section = String::new();
        let mut entries = Vec::new();
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = s.to_string();
                continue;
            }
            let (key, value) = line
                .split_once('=')
                .unwrap_or_else(|| panic!("{name}: not KEY=VALUE: {line:?}"));
            assert!(
                !value.ends_with('\\'),
                "{name}: continuation lines are not read here: {line:?}"
            );
            entries.push((section.clone(), key.trim().into(), value.trim().into()));
        }
        Unit {
            name,
            text,
            entries,
        }
    }

    fn values(&self, section: &str, key: &str) -> Vec<&str> {
        self.entries
            .iter()
            .filter(|(s, k, _)| s == section && k == key)
            .map(|(_, _, v)| v.as_str())
            .collect()
    }

    fn one(&self, key: &str) -> &str {
        match self.values("Service", key)[..] {
            [v] => v,
            ref vs => panic!("{}: expected one {key}=, found {vs:?}", self.name),
        }
    }

    /// The unit with ExecStart's binary replaced by the one under test, written into `dir`
    /// under its own name (systemd-analyze verify needs an executable there).
    fn installed_copy(&self, dir: &Path) -> PathBuf {
        assert!(
            self.one("ExecStart").starts_with(INSTALLED_FARMEM),
            "{}: ExecStart must run {INSTALLED_FARMEM}",
            self.name
        );
        let path = dir.join(self.name);
        fs::write(&path, self.text.replace(INSTALLED_FARMEM, FARMEM)).unwrap();
        path
    }

    /// The Environment= defaults, then `overrides` (what /etc/default/… would set).
    fn environment(&self, overrides: &[(&str, &str)]) -> HashMap<String, String> {
        let mut env = HashMap::new();
        for line in self.values("Service", "Environment") {
            assert!(
                !line.contains('"') && !line.contains('\''),
                "{}: quoted Environment= values are not read here",
                self.name
            );
            for word in line.split_whitespace() {
                let (k, v) = word
                    .split_once('=')
                    .unwrap_or_else(|| panic!("{}: Environment= word {word:?}", self.name));
                env.insert(k.to_string(), v.to_string());
            }
        }
        for (k, v) in overrides {
            env.insert(k.to_string(), v.to_string());
        }
        env
    }

    /// ExecStart expanded as systemd does for the forms our units use: `${NAME}` is replaced in
    /// place; `$NAME` alone as a word becomes the value split at whitespace (no word if empty).
    fn exec_start(&self, env: &HashMap<String, String>) -> Vec<String> {
        let line = self.one("ExecStart");
        assert!(
            !line.contains('"') && !line.contains('\''),
            "{}: quoted ExecStart words are not read here",
            self.name
        );
        let lookup = |name: &str| {
            env.get(name)
                .unwrap_or_else(|| {
                    panic!("{}: ExecStart uses ${name}, which is not set", self.name)
                })
                .clone()
        };
        let mut argv = Vec::new();
        for word in line.split_whitespace() {
            if let Some(name) = word.strip_prefix('$').filter(|n| !n.starts_with('{')) {
                argv.extend(lookup(name).split_whitespace().map(String::from));
                continue;
            }
            let mut out = String::new();
            let mut rest = word;
            while let Some(start) = rest.find("${") {
                let end = rest[start..]
                    .find('}')
                    .unwrap_or_else(|| panic!("{}: unclosed ${{ in {word:?}", self.name));
                out.push_str(&rest[..start]);
                out.push_str(&lookup(&rest[start + 2..start + end]));
                rest = &rest[start + end + 1..];
            }
            out.push_str(rest);
            argv.push(out);
        }
        assert_eq!(argv[0], INSTALLED_FARMEM, "{}", self.name);
        argv[0] = FARMEM.to_string();
        argv
    }
}

/// Replaces the value following `flag` in `argv`; the flag must be there.
fn set_flag(argv: &mut [String], flag: &str, value: &str) {
    let i = argv
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("{flag} is not in {argv:?}"));
    argv[i + 1] = value.to_string();
}

/// The value following `flag` in `argv`; the flag must be there.
fn flag_value<'a>(argv: &'a [String], flag: &str) -> &'a str {
    let i = argv
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("{flag} is not in {argv:?}"));
    &argv[i + 1]
}

#[test]
fn systemd_units_pass_verify_without_a_warning() {
    let tool = require_program("systemd-analyze", "systemd");
    for name in UNITS {
        let dir = tempfile::tempdir().unwrap();
        let path = Unit::load(name).installed_copy(dir.path());
        let out = Command::new(&tool)
            .arg("verify")
            .arg(&path)
            .output()
            .expect("running systemd-analyze verify");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // Its exit status stays 0 for unknown keys and bad values: the output is the verdict.
        // Lines about other units (their own files on this machine) are not ours to judge.
        let ours: Vec<&str> = text
            .lines()
            .filter(|l| l.contains(name) || l.contains(&*dir.path().to_string_lossy()))
            .collect();
        assert!(
            out.status.success() && ours.is_empty(),
            "systemd-analyze verify {name}: {}\n{text}",
            out.status
        );
    }
}

/// Highest overall exposure `systemd-analyze security --offline=yes` may rate each unit (0 is
/// the safest, 10 the worst). Measured with systemd 252 (Debian 12): node 0.8, donor 1.1. Each
/// bound is that figure plus 0.1, the weight of the lightest setting, so that another systemd
/// release's rounding does not fail the test; dropping anything heavier fails it, and
/// [`REQUIRED`] names the settings that must stay whatever their weight.
const MAX_EXPOSURE: [(&str, f64); 2] =
    [("farmem-node.service", 0.9), ("farmem-donor.service", 1.2)];

/// Settings each unit must keep, exactly (unit, key, value).
const REQUIRED: &[(&str, &str, &str)] = &[
    ("*", "NoNewPrivileges", "yes"),
    ("*", "CapabilityBoundingSet", ""),
    ("*", "ProtectSystem", "strict"),
    ("*", "ProtectHome", "yes"),
    ("*", "PrivateTmp", "yes"),
    ("*", "PrivateDevices", "yes"),
    ("*", "MemoryDenyWriteExecute", "yes"),
    ("*", "RestrictNamespaces", "yes"),
    ("*", "LockPersonality", "yes"),
    ("*", "SystemCallFilter", "@system-service"),
    ("*", "SystemCallFilter", "~@privileged @resources"),
    ("farmem-node.service", "RestrictAddressFamilies", "AF_UNIX"),
    ("farmem-node.service", "PrivateNetwork", "yes"),
    ("farmem-node.service", "RuntimeDirectoryMode", "0755"),
    ("farmem-donor.service", "DynamicUser", "yes"),
];

#[test]
fn systemd_units_keep_their_hardening() {
    let tool = require_program("systemd-analyze", "systemd");
    for (name, max) in MAX_EXPOSURE {
        let unit = Unit::load(name);
        for (_, key, value) in REQUIRED.iter().filter(|(u, ..)| *u == "*" || *u == name) {
            assert!(
                unit.values("Service", key).contains(value),
                "{name} lost {key}={value}"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let path = unit.installed_copy(dir.path());
        let out = Command::new(&tool)
            .args(["security", "--offline=yes"])
            .arg(&path)
            .output()
            .expect("running systemd-analyze security");
        let text = String::from_utf8_lossy(&out.stdout);
        let marker = format!("Overall exposure level for {name}:");
        let score: f64 = text
            .lines()
            .find_map(|l| l.split_once(&marker))
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "no exposure figure for {name} in systemd-analyze security's output ({}):\n{text}{}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                )
            });
        assert!(
            score <= max,
            "{name}: exposure {score} is above {max}: a hardening setting was dropped or \
             weakened; its report:\n{text}"
        );
    }
}

#[test]
fn systemd_exec_start_lines_start_the_real_binary() {
    let tmp = tempfile::tempdir().unwrap();

    // The node: the unit's socket (the node's default, under RuntimeDirectory=) moved to a temp
    // folder; its group `farmem` does not exist here, so this process's own group stands in.
    let node = Unit::load("farmem-node.service");
    let mut argv = node.exec_start(&node.environment(&[]));
    let socket = flag_value(&argv, "--socket").to_string();
    assert_eq!(
        Path::new(&socket).parent(),
        Some(
            Path::new("/run")
                .join(node.one("RuntimeDirectory"))
                .as_path()
        ),
        "the socket lives in the unit's RuntimeDirectory="
    );
    assert!(
        node.one("ExecStartPost").contains(&socket),
        "ExecStartPost waits for the socket ExecStart makes"
    );
    let test_socket = tmp.path().join("node.sock");
    set_flag(&mut argv, "--socket", test_socket.to_str().unwrap());
    set_flag(
        &mut argv,
        "--socket-group",
        &nix::unistd::getgid().as_raw().to_string(),
    );
    let mut server = Server::start("node unit", &argv, &[], tmp.path(), false);
    let banner: NodeBanner = server.banner();
    assert_eq!(banner.path, test_socket);
    server.stop();

    // The donor: the token as systemd 252 hands a credential over (a 0400 file in a private
    // folder, owned by the service's user), which the donor's token check must accept.
    let donor = Unit::load("farmem-donor.service");
    let (id, source) = donor
        .one("LoadCredential")
        .split_once(':')
        .expect("LoadCredential=ID:PATH");
    assert_eq!(source, "/etc/farmem/donor.token");
    let creds = tmp.path().join("credentials");
    fs::create_dir(&creds).unwrap();
    fs::write(creds.join(id), "unit-test-token\n").unwrap();
    chmod(&creds.join(id), 0o400);
    chmod(&creds, 0o500);
    let env = donor.environment(&[
        ("FARMEM_DONOR_LISTEN", "127.0.0.1:0"),
        ("FARMEM_DONOR_METRICS", "127.0.0.1:0"),
        ("CREDENTIALS_DIRECTORY", creds.to_str().unwrap()),
    ]);
    let argv = donor.exec_start(&env);
    assert_eq!(
        flag_value(&argv, "--token-file"),
        creds.join(id).to_str().unwrap(),
        "--token-file names the credential LoadCredential= loads"
    );
    let mut server = Server::start("donor unit", &argv, &[], tmp.path(), false);
    let _: DonorBanner = server.banner();
    let metrics = server.metrics_addr();
    let (head, body) = farmem_testkit::clients::http_get(metrics.as_str(), "/metrics");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(body.contains("farmem_build_info"), "{body}");
    server.stop();
}

// ---------------------------------------------------------------------------------------------
// Servers under test

/// A `farmem` server started from a deployment file's command line, optionally under strace
/// (`strace -f -o TRACE`); killed on drop.
struct Server {
    what: String,
    child: Child,
    /// The farmem process (strace's child when traced).
    pid: u32,
    stdout: mpsc::Receiver<String>,
    stderr: PathBuf,
    trace: Option<PathBuf>,
}

impl Server {
    fn start(
        what: &str,
        argv: &[String],
        env: &[(&str, &str)],
        dir: &Path,
        traced: bool,
    ) -> Server {
        let tag: String = what.chars().filter(char::is_ascii_alphanumeric).collect();
        let stderr = dir.join(format!("{tag}.stderr"));
        let trace = traced.then(|| dir.join(format!("{tag}.trace")));
        let mut cmd = match &trace {
            Some(t) => {
                let mut c = Command::new(require_program("strace", "strace"));
                c.args(["-f", "-qq", "-o"]).arg(t).arg("--").args(argv);
                c
            }
            None => {
                let mut c = Command::new(&argv[0]);
                c.args(&argv[1..]);
                c
            }
        };
        let mut child = cmd
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("starting the {what}: {e}"));
        let out = child.stdout.take().unwrap();
        let (tx, stdout) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let pid = if traced {
            traced_child(child.id())
        } else {
            child.id()
        };
        Server {
            what: what.to_string(),
            child,
            pid,
            stdout,
            stderr,
            trace,
        }
    }

    fn stderr_text(&self) -> String {
        fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// The first line of stdout, read as the server's banner.
    fn banner<B: std::str::FromStr>(&mut self) -> B
    where
        B::Err: std::fmt::Display,
    {
        match self.stdout.recv_timeout(BANNER_TIMEOUT) {
            Ok(line) => line.parse().unwrap_or_else(|e| {
                panic!("{}: {e}; its stderr:\n{}", self.what, self.stderr_text())
            }),
            Err(_) => panic!(
                "the {} printed no banner within {} s (exit: {:?}); its stderr:\n{}",
                self.what,
                BANNER_TIMEOUT.as_secs(),
                self.child.try_wait().ok().flatten(),
                self.stderr_text()
            ),
        }
    }

    /// The metrics address the server logged (`metrics at http://ADDR/metrics`).
    fn metrics_addr(&self) -> String {
        let text = self.stderr_text();
        text.split("metrics at http://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .unwrap_or_else(|| panic!("the {} logged no metrics address:\n{text}", self.what))
            .to_string()
    }

    /// SIGTERM, then the clean exit (status 0) every farmem server promises.
    fn stop(&mut self) {
        if let Err(e) = kill(Pid::from_raw(self.pid as i32), Signal::SIGTERM) {
            panic!(
                "signalling the {} (pid {}): {e}; exit: {:?}; its stderr:\n{}",
                self.what,
                self.pid,
                self.child.try_wait().ok().flatten(),
                self.stderr_text()
            );
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            assert!(
                Instant::now() < deadline,
                "the {} did not stop within 60 s of SIGTERM",
                self.what
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(
            status.success(),
            "the {} stopped with {status}; its stderr:\n{}",
            self.what,
            self.stderr_text()
        );
    }

    /// The system calls the traced server made.
    fn syscalls(&self) -> BTreeSet<String> {
        syscalls_in(self.trace.as_deref().expect("traced"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // A tracee outlives a killed strace: kill the server itself first.
        let _ = kill(Pid::from_raw(self.pid as i32), Signal::SIGKILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `farmem` process strace (pid `strace`) started: its child once it runs the binary (strace
/// first forks short-lived children of its own, probing what ptrace offers).
fn traced_child(strace: u32) -> u32 {
    let path = format!("/proc/{strace}/task/{strace}/children");
    let farmem = fs::canonicalize(FARMEM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let children = fs::read_to_string(&path).unwrap_or_default();
        if let Some(pid) = children
            .split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok())
            .find(|p| fs::read_link(format!("/proc/{p}/exe")).is_ok_and(|exe| exe == farmem))
        {
            return pid;
        }
        assert!(
            Instant::now() < deadline,
            "strace did not start {FARMEM} within 10 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The names of the system calls in an `strace -f -qq` output file.
fn syscalls_in(trace: &Path) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in read(trace).lines() {
        // "PID  name(args…" or "PID  <... name resumed>…"; signals and exits are skipped.
        let rest = line
            .trim_start_matches(|c: char| c.is_ascii_digit())
            .trim_start();
        let rest = rest.strip_prefix("<... ").unwrap_or(rest);
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() && rest[name.len()..].starts_with(['(', ' ']) {
            names.insert(name);
        }
    }
    assert!(
        names.contains("execve"),
        "{} holds no system calls",
        trace.display()
    );
    names
}

/// The system calls a unit's SystemCallFilter= lines allow, by systemd's rules: the first line
/// is an allow list; a later `~` line takes its calls away, a later plain line adds them back.
fn unit_allows(unit: &Unit) -> BTreeSet<String> {
    let tool = require_program("systemd-analyze", "systemd");
    let mut cache = HashMap::new();
    let lines = unit.values("Service", "SystemCallFilter");
    assert!(
        lines.first().is_some_and(|l| !l.starts_with('~')),
        "{}: the first SystemCallFilter= must be an allow list",
        unit.name
    );
    let mut allowed = BTreeSet::new();
    for line in lines {
        let (deny, items) = match line.strip_prefix('~') {
            Some(rest) => (true, rest),
            None => (false, line),
        };
        for item in items.split_whitespace() {
            for call in expand_filter(&tool, item, &mut cache) {
                if deny {
                    allowed.remove(&call);
                } else {
                    allowed.insert(call);
                }
            }
        }
    }
    allowed
}

/// The system calls of a filter item: a name, or a `@group` (`systemd-analyze syscall-filter`,
/// its nested groups expanded).
fn expand_filter(
    tool: &Path,
    item: &str,
    cache: &mut HashMap<String, BTreeSet<String>>,
) -> BTreeSet<String> {
    if !item.starts_with('@') {
        return BTreeSet::from([item.to_string()]);
    }
    if let Some(set) = cache.get(item) {
        return set.clone();
    }
    let out = Command::new(tool)
        .args(["syscall-filter", item])
        .output()
        .expect("running systemd-analyze syscall-filter");
    assert!(
        out.status.success(),
        "systemd-analyze syscall-filter {item}"
    );
    let mut set = BTreeSet::new();
    for line in String::from_utf8_lossy(&out.stdout).lines().skip(1) {
        let word = line.trim();
        if word.is_empty() || word.starts_with('#') {
            continue;
        }
        set.extend(expand_filter(tool, word, cache));
    }
    assert!(!set.is_empty(), "systemd-analyze knows no {item}");
    cache.insert(item.to_string(), set.clone());
    set
}

// ---------------------------------------------------------------------------------------------
// Kubernetes manifests

fn kubernetes_dir() -> PathBuf {
    repo().join("deploy/kubernetes")
}

fn venv_bin(name: &str) -> PathBuf {
    let path = repo().join("target/tools/venv/bin").join(name);
    assert!(
        path.is_file(),
        "{} is missing: run scripts/setup.sh (it installs kubernetes-validate into \
         target/tools/venv)",
        path.display()
    );
    path
}

/// Every YAML file under deploy/kubernetes/, sorted.
fn manifest_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "yaml" || x == "yml") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(&kubernetes_dir(), &mut files);
    files.sort();
    assert!(files.len() >= 7, "manifests: {files:?}");
    files
}

/// Every object of every manifest, read by PyYAML (from kubernetes-validate's venv).
fn manifest_objects() -> Vec<Value> {
    let out = Command::new(venv_bin("python3"))
        .args([
            "-c",
            "import json, sys, yaml\n\
             docs = [d for f in sys.argv[1:] for d in yaml.safe_load_all(open(f)) if d]\n\
             json.dump(docs, sys.stdout)",
        ])
        .args(manifest_files())
        .output()
        .expect("running the venv's python3");
    assert!(
        out.status.success(),
        "reading the manifests: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    match serde_json::from_slice(&out.stdout).unwrap() {
        Value::Array(objects) => objects,
        other => panic!("not a list of objects: {other}"),
    }
}

/// The object of `kind` named `name`.
fn object<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in deploy/kubernetes"))
}

/// `value` at a dotted path (`spec.template.spec`); a missing step fails naming the path.
fn at<'a>(value: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(value, |v, step| {
        let next = match step.parse::<usize>() {
            Ok(i) => v.get(i),
            Err(_) => v.get(step),
        };
        next.unwrap_or_else(|| panic!("no {path} (stopped at {step:?}) in {value}"))
    })
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v}"))
}

/// The container `name` of a pod spec.
fn container<'a>(pod_spec: &'a Value, name: &str) -> &'a Value {
    at(pod_spec, "containers")
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn command(container: &Value) -> Vec<String> {
    at(container, "command")
        .as_array()
        .unwrap()
        .iter()
        .map(|a| text(a).to_string())
        .collect()
}

/// The volume of a pod spec that `container` mounts at `mount_path`.
fn volume_at<'a>(pod_spec: &'a Value, container: &Value, mount_path: &str) -> &'a Value {
    let mount = at(container, "volumeMounts")
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == mount_path)
        .unwrap_or_else(|| panic!("nothing is mounted at {mount_path}"));
    at(pod_spec, "volumes")
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap_or_else(|| panic!("no volume {}", mount["name"]))
}

/// The Kubernetes release whose schemas the manifests are checked against: the newest that
/// kubernetes-validate 1.37.0 ships, named so that another tool version cannot change it silently.
const KUBERNETES_VERSION: &str = "1.37.0";

/// The pinned kubernetes-validate version: scripts/setup.sh's, read there so the two agree.
fn pinned_kubernetes_validate() -> String {
    read(&repo().join("scripts/setup.sh"))
        .lines()
        .find_map(|l| l.strip_prefix("KUBERNETES_VALIDATE_VERSION="))
        .expect("scripts/setup.sh pins KUBERNETES_VALIDATE_VERSION")
        .to_string()
}

#[test]
fn kubernetes_manifests_pass_kubernetes_validate_strict() {
    let tool = venv_bin("kubernetes-validate");
    let pinned = pinned_kubernetes_validate();
    let version = Command::new(&tool).arg("--version").output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        pinned,
        "target/tools/venv holds another kubernetes-validate than scripts/setup.sh pins: run \
         scripts/setup.sh"
    );
    let files = manifest_files();
    let out = Command::new(&tool)
        .args(["--strict", "--kubernetes-version", KUBERNETES_VERSION])
        .args(&files)
        .output()
        .expect("running kubernetes-validate");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "kubernetes-validate:\n{report}");
    for line in report.lines() {
        assert!(line.starts_with("INFO "), "kubernetes-validate: {line}");
    }
    for f in &files {
        assert!(
            report
                .lines()
                .any(|l| l.contains(&*f.to_string_lossy()) && l.contains(" passed ")),
            "kubernetes-validate did not pass {}:\n{report}",
            f.display()
        );
    }
}

#[test]
fn kubernetes_manifests_agree_with_each_other() {
    let objects = manifest_objects();
    let node = at(
        object(&objects, "DaemonSet", "farmem-node"),
        "spec.template.spec",
    );
    let node_c = container(node, "node");
    let node_cmd = command(node_c);
    let socket = PathBuf::from(flag_value(&node_cmd, "--socket"));
    let socket_dir = socket.parent().unwrap().to_str().unwrap();
    let node_run = volume_at(node, node_c, socket_dir);
    assert_eq!(at(node_run, "hostPath.path"), socket_dir);

    let app = at(object(&objects, "Pod", "farmem-app"), "spec");
    let app_c = container(app, "app");
    let app_cmd = command(app_c);
    assert_eq!(&app_cmd[..2], ["farmem", "run"]);
    // The node's socket, from the same host folder.
    assert_eq!(flag_value(&app_cmd, "--node"), socket.to_str().unwrap());
    assert_eq!(
        at(volume_at(app, app_c, socket_dir), "hostPath.path"),
        socket_dir
    );
    // A non-root user in the socket's group.
    let security = at(app, "securityContext");
    assert_eq!(security["runAsNonRoot"], true);
    assert_ne!(security["runAsUser"], 0);
    assert!(app_c["securityContext"].get("runAsUser").is_none());
    let group: u64 = flag_value(&node_cmd, "--socket-group").parse().unwrap();
    assert!(
        at(security, "supplementalGroups")
            .as_array()
            .unwrap()
            .contains(&Value::from(group)),
        "the app pod is in the node socket's group {group}"
    );
    // farmem run keeps private folders in /tmp: writable even with a read-only root.
    if app_c["securityContext"]["readOnlyRootFilesystem"] == true {
        assert!(volume_at(app, app_c, "/tmp").get("emptyDir").is_some());
    }
    // userfaultfd: the device, and the seccomp profile that allows the system call.
    let uffd = volume_at(app, app_c, "/dev/userfaultfd");
    assert_eq!(at(uffd, "hostPath.path"), "/dev/userfaultfd");
    assert_eq!(at(uffd, "hostPath.type"), "CharDevice");
    assert_eq!(at(security, "seccompProfile.type"), "Localhost");
    let profile = text(at(security, "seccompProfile.localhostProfile"));
    assert!(
        kubernetes_dir().join("seccomp").join(profile).is_file(),
        "the app pod's seccomp profile {profile} is deploy/kubernetes/seccomp/{profile}"
    );

    // Donors: each --donor of the app is a StatefulSet pod's name under the headless Service,
    // on the port named `farmem` (the SRV record _farmem._tcp.SERVICE).
    let service = object(&objects, "Service", "farmem-donor");
    assert_eq!(at(service, "spec.clusterIP"), "None");
    let port = at(service, "spec.ports")
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "farmem")
        .expect("a service port named farmem");
    assert_eq!(port["protocol"], "TCP");
    let sts = object(&objects, "StatefulSet", "farmem-donor");
    assert_eq!(at(sts, "spec.serviceName"), at(service, "metadata.name"));
    let labels = at(sts, "spec.template.metadata.labels");
    for (k, v) in at(service, "spec.selector").as_object().unwrap() {
        assert_eq!(&labels[k], v, "the service selects the donor pods");
    }
    let donor_spec = at(sts, "spec.template.spec");
    let donor_c = container(donor_spec, "donor");
    let container_port = at(donor_c, "ports")
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "farmem")
        .expect("a container port named farmem");
    assert_eq!(container_port["containerPort"], port["port"]);
    let namespace = text(at(sts, "metadata.namespace"));
    let replicas = at(sts, "spec.replicas").as_u64().unwrap();
    let donors: Vec<&str> = app_cmd
        .windows(2)
        .filter(|w| w[0] == "--donor")
        .map(|w| w[1].as_str())
        .collect();
    let names: Vec<String> = (0..replicas)
        .map(|i| {
            format!(
                "farmem-donor-{i}.farmem-donor.{namespace}.svc.cluster.local:{}",
                port["port"]
            )
        })
        .collect();
    assert!(!donors.is_empty());
    for d in &donors {
        assert!(
            names.iter().any(|n| n == d),
            "--donor {d} is none of {names:?}"
        );
    }

    // Tokens: the tenants file names files the donor's init container copies from the Secret;
    // the app's token is one of them.
    let secret = object(&objects, "Secret", "farmem-tokens");
    let keys: Vec<&String> = at(secret, "stringData")
        .as_object()
        .unwrap()
        .keys()
        .collect();
    let tenants_path = PathBuf::from(flag_value(&command(donor_c), "--tenants"));
    let tenants_dir = tenants_path.parent().unwrap().to_str().unwrap();
    let config = volume_at(donor_spec, donor_c, tenants_dir);
    let cm = object(&objects, "ConfigMap", text(at(config, "configMap.name")));
    let toml_text = text(&at(cm, "data")[tenants_path.file_name().unwrap().to_str().unwrap()]);
    let tenants: toml::Value = toml::from_str(toml_text).expect("tenants.toml is TOML");
    for t in tenants["tenant"].as_array().unwrap() {
        let file = PathBuf::from(t["token_file"].as_str().unwrap());
        let dir = file.parent().unwrap().to_str().unwrap();
        assert!(volume_at(donor_spec, donor_c, dir)
            .get("emptyDir")
            .is_some());
        let key = file.file_name().unwrap().to_str().unwrap();
        assert!(
            keys.iter().any(|k| *k == key),
            "{key} is a key of the Secret"
        );
    }
    let token = PathBuf::from(flag_value(&app_cmd, "--token-file"));
    let key = token.file_name().unwrap().to_str().unwrap();
    assert!(
        keys.iter().any(|k| *k == key),
        "{key} is a key of the Secret"
    );
    assert!(
        volume_at(app, app_c, token.parent().unwrap().to_str().unwrap())
            .get("emptyDir")
            .is_some()
    );
}

#[test]
fn seccomp_profile_denies_by_default_and_allows_userfaultfd() {
    let path = kubernetes_dir().join("seccomp/farmem.json");
    let profile: Value = serde_json::from_str(&read(&path))
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    let default = text(at(&profile, "defaultAction"));
    assert!(
        [
            "SCMP_ACT_ERRNO",
            "SCMP_ACT_KILL",
            "SCMP_ACT_KILL_PROCESS",
            "SCMP_ACT_TRAP"
        ]
        .contains(&default),
        "the default action must refuse, not {default}"
    );
    assert!(at(&profile, "architectures")
        .as_array()
        .unwrap()
        .contains(&Value::from("SCMP_ARCH_X86_64")));
    let allowed = profile_allows(&profile);
    for call in [
        "userfaultfd",
        "ioctl",
        "memfd_create",
        "mmap",
        "madvise",
        "process_madvise",
    ] {
        assert!(allowed.contains(call), "the profile must allow {call}");
    }
    assert!(!allowed.contains("bpf") && !allowed.contains("mount"));
}

/// The system calls a seccomp profile allows without conditions on their arguments (`clone`
/// and `socket`, allowed for some arguments, count too: farmem's uses are among those).
fn profile_allows(profile: &Value) -> BTreeSet<String> {
    let mut allowed = BTreeSet::new();
    for rule in at(profile, "syscalls").as_array().unwrap() {
        if rule["action"] == "SCMP_ACT_ALLOW" {
            for n in at(rule, "names").as_array().unwrap() {
                allowed.insert(text(n).to_string());
            }
        }
    }
    allowed
}

/// The system calls the profile answers with ENOSYS (`clone3`), so the C library falls back.
fn profile_enosys(profile: &Value) -> BTreeSet<String> {
    let mut calls = BTreeSet::new();
    for rule in at(profile, "syscalls").as_array().unwrap() {
        if rule["action"] == "SCMP_ACT_ERRNO" && rule["errnoRet"] == 38 {
            for n in at(rule, "names").as_array().unwrap() {
                calls.insert(text(n).to_string());
            }
        }
    }
    calls
}

/// The manifests' own command lines, run: a node (the DaemonSet's), two donors (the
/// StatefulSet's, with the ConfigMap's tenants) and the example application's `farmem run`
/// paging its program through them; addresses and paths moved to a temp folder, every flag and
/// size kept. All under strace: what the node and the donors call must pass their systemd
/// units' SystemCallFilter=, what the application's process tree calls the seccomp profile.
#[test]
fn manifest_commands_page_a_program_within_the_system_call_filters() {
    let objects = manifest_objects();
    let tmp = tempfile::tempdir().unwrap();
    chmod(tmp.path(), 0o755);
    let farmem_argv = |cmd: Vec<String>| {
        assert_eq!(cmd[0], "farmem", "the image runs farmem from its PATH");
        std::iter::once(FARMEM.to_string())
            .chain(cmd.into_iter().skip(1))
            .collect::<Vec<_>>()
    };

    let node_spec = at(
        object(&objects, "DaemonSet", "farmem-node"),
        "spec.template.spec",
    );
    let mut node_argv = farmem_argv(command(container(node_spec, "node")));
    let socket = tmp.path().join("node.sock");
    set_flag(&mut node_argv, "--socket", socket.to_str().unwrap());
    let mut node = Server::start("manifest node", &node_argv, &[], tmp.path(), true);
    let _: NodeBanner = node.banner();

    // The tenants file as mounted, its token files moved to the temp folder.
    let sts = object(&objects, "StatefulSet", "farmem-donor");
    let donor_c = container(at(sts, "spec.template.spec"), "donor");
    let cm = object(&objects, "ConfigMap", "farmem-tenants");
    let tokens = tmp.path().join("tokens");
    fs::create_dir(&tokens).unwrap();
    let mut tenants = text(&at(cm, "data")["tenants.toml"]).to_string();
    let secret = object(&objects, "Secret", "farmem-tokens");
    for key in at(secret, "stringData").as_object().unwrap().keys() {
        let file = tokens.join(key);
        fs::write(&file, format!("test-token-for-{key}\n")).unwrap();
        chmod(&file, 0o400);
        tenants = tenants.replace(&format!("/run/farmem-tokens/{key}"), file.to_str().unwrap());
    }
    assert!(
        !tenants.contains("/run/farmem-tokens/"),
        "every token of tenants.toml is a key of the Secret: {tenants}"
    );
    let tenants_file = tmp.path().join("tenants.toml");
    fs::write(&tenants_file, tenants).unwrap();
    let mut donors = Vec::new();
    for i in 0..2 {
        let mut argv = farmem_argv(command(donor_c));
        set_flag(&mut argv, "--listen", "127.0.0.1:0");
        set_flag(&mut argv, "--metrics", "127.0.0.1:0");
        set_flag(&mut argv, "--tenants", tenants_file.to_str().unwrap());
        let mut donor = Server::start(&format!("manifest donor {i}"), &argv, &[], tmp.path(), true);
        let banner: DonorBanner = donor.banner();
        donors.push((donor, banner.addr.to_string()));
    }

    let app = container(at(object(&objects, "Pod", "farmem-app"), "spec"), "app");
    let mut argv = farmem_argv(command(app));
    set_flag(&mut argv, "--node", socket.to_str().unwrap());
    let token_key = Path::new(flag_value(&argv, "--token-file"))
        .file_name()
        .unwrap()
        .to_owned();
    set_flag(
        &mut argv,
        "--token-file",
        tokens.join(token_key).to_str().unwrap(),
    );
    let mut next = donors.iter().map(|(_, addr)| addr.as_str());
    for i in 0..argv.len() {
        if argv[i] == "--donor" {
            argv[i + 1] = next.next().expect("one test donor per --donor").to_string();
        }
    }
    let trace = tmp.path().join("app.trace");
    let out = farmem_testkit::run::output_within(
        Command::new(require_program("strace", "strace"))
            .args(["-f", "-qq", "-o"])
            .arg(&trace)
            .arg("--")
            .args(&argv),
        Duration::from_secs(300),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("touched 512 MiB"),
        "the app pod's command ({}):\n{stdout}{stderr}",
        out.status
    );
    let summary = stderr
        .lines()
        .find(|l| l.starts_with("farmem: ") && l.contains(" faults ("))
        .unwrap_or_else(|| panic!("no summary line:\n{stderr}"));
    assert!(
        summary.contains("host tier in") && !summary.contains("host tier in 0 B out 0 B"),
        "the program's pages went through the node: {summary}"
    );

    let profile: Value =
        serde_json::from_str(&read(&kubernetes_dir().join("seccomp/farmem.json"))).unwrap();
    let allowed = profile_allows(&profile);
    let enosys = profile_enosys(&profile);
    let refused: Vec<String> = syscalls_in(&trace)
        .into_iter()
        .filter(|c| !allowed.contains(c) && !enosys.contains(c))
        .collect();
    assert!(
        refused.is_empty(),
        "farmem run and its program made system calls seccomp/farmem.json refuses: {refused:?}"
    );

    node.stop();
    let outside: Vec<String> = node
        .syscalls()
        .difference(&unit_allows(&Unit::load("farmem-node.service")))
        .cloned()
        .collect();
    assert!(
        outside.is_empty(),
        "the node made system calls farmem-node.service's SystemCallFilter= refuses: {outside:?}"
    );
    let donor_allows = unit_allows(&Unit::load("farmem-donor.service"));
    for (donor, _) in &mut donors {
        donor.stop();
        let outside: Vec<String> = donor
            .syscalls()
            .difference(&donor_allows)
            .cloned()
            .collect();
        assert!(
            outside.is_empty(),
            "a donor made system calls farmem-donor.service's SystemCallFilter= refuses: \
             {outside:?}"
        );
    }
}
