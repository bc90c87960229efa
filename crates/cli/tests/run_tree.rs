//! Every process a program starts is under farmem, within one budget: a `#!/usr/bin/env`
//! launcher, `bash -c`, a shell script running Pythons in sequence and in parallel, Python
//! multiprocessing, a forking server whose children exit early (and children that read the
//! parent's state while the parent rewrites it, or after it was killed), and `make` running
//! the C compiler. Each run is checked for correct output, for remote or host-tier faults in every
//! process whose data exceeded its share, and for the tree's peak anonymous memory, sampled
//! from outside, within `--local-mem` plus the unmanaged memory the processes reported.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use farmem_testkit::bins::{farmem, require_preload_lib};
use farmem_testkit::donor::Donor;
use farmem_testkit::run::{far_bytes_in, read_stats, require_program, text, Scratch};
use farmem_testkit::tree_rss::TreeRssSampler;

const MIB: u64 = 1 << 20;
/// Debian's interpreter (a PATH python3 may be a version-manager shim).
const PYTHON: &str = "/usr/bin/python3";

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/tree")
        .join(name)
}

/// A finished run: its output, its stats file, the tree's sampled peak.
struct TreeRun {
    out: Output,
    stats: serde_json::Value,
    peak_anon: u64,
    local_mem: u64,
}

/// `farmem run --local-mem LOCAL --stats … -- command`, with the tree's memory sampled.
fn run_tree(local_mib: u64, command: &[&str], cwd: Option<&Path>) -> TreeRun {
    run_tree_with(local_mib, FarMem::HostTier, command, cwd)
}

/// Where the tree's far pages go.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum FarMem {
    /// The embedded default: a private host tier (`farmem node`).
    HostTier,
    /// Donors only, no host tier: a `farmem donor` the test starts (its memory is another
    /// host's, not the tree's), pages sealed (`--seal on`), as with a donor on another host.
    Donors,
    /// [`FarMem::Donors`] with an auth token, named to `farmem run` by a relative
    /// `--token-file` (the run starts in the scratch directory that holds it).
    DonorsWithToken,
}

/// [`run_tree`] with the tree's far pages in `far`.
fn run_tree_with(local_mib: u64, far: FarMem, command: &[&str], cwd: Option<&Path>) -> TreeRun {
    require_preload_lib();
    let scratch = Scratch::new("tree");
    let stats = scratch.path("stats.json");
    let mut cmd = Command::new(farmem());
    cmd.args(["run", "--local-mem", &format!("{local_mib}MiB"), "--stats"])
        .arg(&stats);
    let donor = match far {
        FarMem::HostTier => None,
        FarMem::Donors => Some(Donor::start("1GiB", "16MiB")),
        FarMem::DonorsWithToken => {
            let token = scratch.path("token");
            std::fs::write(&token, b"a tree's processes read this").unwrap();
            std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
            cmd.args(["--token-file", "token"]).current_dir(&scratch.0);
            let t = token.to_str().unwrap();
            Some(Donor::spawn(&[
                "--capacity",
                "1GiB",
                "--slab-size",
                "16MiB",
                "--token-file",
                t,
            ]))
        }
    };
    if let Some(d) = &donor {
        cmd.args(["--donor", &d.addr.to_string(), "--seal", "on"]);
    }
    cmd.arg("--")
        .args(command)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(d) = cwd {
        cmd.current_dir(d);
    }
    let child = cmd.spawn().expect("starting farmem run");
    let sampler = TreeRssSampler::start(child.id());
    let out = farmem_testkit::run::wait_output(child, Duration::from_secs(240));
    let seen = sampler.stop();
    drop(donor);
    assert!(out.status.success(), "{}", text(&out));
    TreeRun {
        stats: read_stats(&stats),
        out,
        peak_anon: seen.peak_anon_bytes,
        local_mem: local_mib * MIB,
    }
}

impl TreeRun {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }

    fn processes(&self) -> &Vec<serde_json::Value> {
        self.stats["tree"]["processes"]
            .as_array()
            .unwrap_or_else(|| panic!("no tree section: {}", self.stats))
    }

    /// Processes whose pages came back from far memory: from the host tier or a donor, by a
    /// fault or installed ahead of one (a sequential pass can bring every page back without a
    /// fault on a far page).
    fn paged(&self) -> usize {
        self.processes()
            .iter()
            .filter(|p| far_bytes_in(p) > 0)
            .count()
    }

    /// The tree's peak within --local-mem plus what its processes reported unmanaged (their
    /// stacks, interpreters' own memory, farmem's bookkeeping), plus the farmem run process and
    /// its private node, which are not the program's.
    fn check_budget(&self) {
        self.check_budget_beyond(0, "");
    }

    /// [`TreeRun::check_budget`] with `extra` bytes allowed, for the reason given.
    fn check_budget_beyond(&self, extra: u64, why: &str) {
        let unmanaged: u64 = self
            .processes()
            .iter()
            .map(|p| p["unmanaged"]["peak_unmanaged_bytes"].as_u64().unwrap_or(0))
            .sum();
        let farmem_own = 16 * MIB;
        eprintln!(
            "tree peak anonymous memory {} MiB, bound {} MiB",
            self.peak_anon / MIB,
            (self.local_mem + unmanaged + farmem_own + extra) / MIB
        );
        assert!(
            self.peak_anon <= self.local_mem + unmanaged + farmem_own + extra,
            "the tree's peak anonymous memory {} MiB exceeds --local-mem {} MiB + {} MiB \
             reported unmanaged + {} MiB of farmem's own processes + {} MiB {why}\n{}",
            self.peak_anon / MIB,
            self.local_mem / MIB,
            unmanaged / MIB,
            farmem_own / MIB,
            extra / MIB,
            text(&self.out)
        );
    }
}

/// One `ok <checksum>` line per job, all equal to a run without farmem.
fn expect_ok_lines(run: &TreeRun, n: usize) {
    let out = run.stdout();
    let oks: Vec<&str> = out.lines().filter(|l| l.starts_with("ok ")).collect();
    assert_eq!(oks.len(), n, "{}", text(&run.out));
    assert!(!out.contains("MISMATCH"), "{}", text(&run.out));
    assert!(
        oks.windows(2).all(|w| w[0] == w[1]),
        "the checksums differ: {out}"
    );
}

#[test]
fn an_env_launcher_shim_is_followed_and_its_python_paged() {
    let dir = Scratch::new("shim");
    let shim = dir.path("python3");
    // A version-manager shim, as pyenv, nvm, rbenv and asdf install: written by a short-lived
    // sh, so no write descriptor of this multi-threaded test process can leak into a fork.
    let st = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "printf '#!/usr/bin/env bash\\nexec {PYTHON} \"$@\"\\n' > {0} && chmod 755 {0}",
            shim.display()
        ))
        .status()
        .unwrap();
    assert!(st.success());
    let run = run_tree(
        48,
        &[
            shim.to_str().unwrap(),
            script("job.py").to_str().unwrap(),
            "128",
        ],
        None,
    );
    expect_ok_lines(&run, 1);
    assert!(run.paged() >= 1, "python was not paged: {}", run.stats);
    run.check_budget();
}

#[test]
fn bash_c_runs_python_under_farmem() {
    let job = format!("{PYTHON} {} 128", script("job.py").display());
    let run = run_tree(48, &["bash", "-c", &format!("{job}; true")], None);
    expect_ok_lines(&run, 1);
    assert!(run.processes().len() >= 2, "bash and python: {}", run.stats);
    assert!(run.paged() >= 1, "python was not paged: {}", run.stats);
    run.check_budget();
}

#[test]
fn a_background_job_that_outlives_the_program_is_still_paged() {
    // The shell exits at once; its background job starts a second later. farmem run used to
    // stop its coordinator and node with the shell, and the job's runtime could not start
    // (exit 125). It now waits for the tree, as a service manager's scope does.
    let job = format!("{PYTHON} {} 96", script("job.py").display());
    let sh = format!("(sleep 1; {job}) & echo main-exit");
    let run = run_tree(48, &["sh", "-c", &sh], None);
    expect_ok_lines(&run, 1);
    assert!(run.stdout().contains("main-exit"), "{}", text(&run.out));
    assert!(
        String::from_utf8_lossy(&run.out.stderr).contains("still run under farmem"),
        "{}",
        text(&run.out)
    );
    assert!(run.paged() >= 1, "the job was not paged: {}", run.stats);
    run.check_budget();
}

#[test]
fn a_script_runs_pythons_in_sequence_and_in_parallel_within_one_budget() {
    let job = format!("{PYTHON} {} 96", script("job.py").display());
    let sh = format!("{job}; {job}; {job} & {job} & wait");
    let run = run_tree(64, &["sh", "-c", &sh], None);
    expect_ok_lines(&run, 4);
    assert!(
        run.paged() >= 4,
        "every python over its share pages: {}",
        run.stats
    );
    run.check_budget();
}

/// The local memory a process of the tree ended with: its budget and its pool.
fn local_bytes(p: &serde_json::Value) -> u64 {
    let s = &p["summary"];
    s["budget_bytes"].as_u64().unwrap() + s["pool_bytes"].as_u64().unwrap()
}

#[test]
fn the_idle_processes_of_a_pipeline_leave_the_budget_to_the_busy_one() {
    // The shell and cat only wait: each keeps its least share, its pool shrunk with it (they
    // held 5 MiB each while the whole pool counted), and python gets the rest. Python's grant
    // grows a step per report while it pages: with 64 MiB of data a loaded CI machine once saw
    // it end at 15 MiB, so it pages 128 MiB, long enough for the grant to reach the rest.
    let job = format!("{PYTHON} {} 128 | cat", script("job.py").display());
    let run = run_tree(24, &["sh", "-c", &job], None);
    expect_ok_lines(&run, 1);
    let (busy, idle): (Vec<_>, Vec<_>) = run.processes().iter().partition(|p| far_bytes_in(p) > 0);
    assert_eq!(busy.len(), 1, "python alone pages: {}", run.stats);
    assert!(idle.len() >= 2, "the shell and cat: {}", run.stats);
    for p in &idle {
        assert!(
            local_bytes(p) <= 2 * MIB,
            "an idle process kept {} KiB of local memory: {}",
            local_bytes(p) >> 10,
            run.stats
        );
    }
    assert!(
        local_bytes(busy[0]) >= 18 * MIB,
        "python ended with {} KiB of the 24 MiB: {}",
        local_bytes(busy[0]) >> 10,
        run.stats
    );
    run.check_budget();
}

/// What a process outside the tree got when it asked the tree's coordinator for a share.
fn ask_for_a_share_from_outside(meeting: &Path) -> Result<String, String> {
    use std::io::{Read, Write};
    let settings = meeting.join("settings");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let text = loop {
        match std::fs::read_to_string(&settings) {
            Ok(t) if t.ends_with('\n') => break t,
            _ if std::time::Instant::now() > deadline => return Err("no settings".into()),
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let v: serde_json::Value = serde_json::from_str(text.trim()).map_err(|e| e.to_string())?;
    let dir = v["tree_dir"]
        .as_str()
        .ok_or("no tree_dir in the settings")?;
    let mut s = std::os::unix::net::UnixStream::connect(Path::new(dir).join("budget.sock"))
        .map_err(|e| format!("cannot connect: {e}"))?;
    // The shell's pid (the settings' writer is the shell), and most of the 24 MiB budget.
    let shell: u32 = std::fs::read_to_string(meeting.join("pid"))
        .map_err(|e| e.to_string())?
        .trim()
        .parse()
        .map_err(|e| format!("{e}"))?;
    let hello = format!("{{\"hello\":{{\"version\":1,\"pid\":{shell},\"min_pages\":5000}}}}\n");
    let _ = s.write_all(hello.as_bytes());
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    Ok(String::from_utf8_lossy(&got).into_owned())
}

/// A program started outside the tree with the tree's environment (as a daemon of the user
/// would start it): it must run, paged within the least share, and say so.
fn run_outside_with_the_tree_s_environment(meeting: &Path) -> Output {
    let settings = std::fs::read_to_string(meeting.join("settings")).unwrap();
    let job = Command::new(PYTHON)
        .arg(script("job.py"))
        .arg("32")
        .env("LD_PRELOAD", farmem_testkit::bins::preload_lib())
        .env("FARMEM_RUN_SETTINGS", settings.trim())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    farmem_testkit::run::wait_output(job, Duration::from_secs(120))
}

#[test]
fn a_process_outside_the_tree_cannot_take_its_budget() {
    // The attack: another process of the user finds budget.sock and says hello under the
    // shell's pid asking for 5000 of the 6144 pages. It used to be granted them, and python
    // paged in what was left. The coordinator now asks the kernel who is connecting. A
    // program started outside the tree with its environment runs at the least share.
    let meeting = Scratch::new("outsider");
    let m = meeting.0.display().to_string();
    let job = format!(
        "echo $$ > {m}/pid && echo \"$FARMEM_RUN_SETTINGS\" > {m}/settings && \
         while [ ! -e {m}/go ]; do sleep 0.05; done && {PYTHON} {} 64 | cat",
        script("job.py").display()
    );
    let outsider = {
        let dir = meeting.0.clone();
        std::thread::spawn(move || {
            let got = ask_for_a_share_from_outside(&dir);
            let outside_job = got
                .is_ok()
                .then(|| run_outside_with_the_tree_s_environment(&dir));
            std::fs::write(dir.join("go"), b"").unwrap();
            (got, outside_job)
        })
    };
    let run = run_tree(24, &["sh", "-c", &job], None);
    let (got, outside_job) = outsider.join().unwrap();
    assert_eq!(
        got,
        Ok(String::new()),
        "the outsider was answered: {}",
        text(&run.out)
    );
    let outside_job = outside_job.unwrap();
    assert!(outside_job.status.success(), "{}", text(&outside_job));
    assert!(
        String::from_utf8_lossy(&outside_job.stdout).starts_with("ok "),
        "{}",
        text(&outside_job)
    );
    assert!(
        String::from_utf8_lossy(&outside_job.stderr).contains("outside the process tree"),
        "{}",
        text(&outside_job)
    );
    expect_ok_lines(&run, 1);
    // The tree's python and the outsider page (the outsider's stats file joins the tree's:
    // it ran on the tree's settings); the tree's python has the budget, less the least shares
    // of three idle processes (the shell, its subshell, cat).
    let mut busy: Vec<u64> = run
        .processes()
        .iter()
        .filter(|p| far_bytes_in(p) > 0)
        .map(local_bytes)
        .collect();
    busy.sort_unstable();
    assert_eq!(busy.len(), 2, "python and the outsider page: {}", run.stats);
    assert!(
        busy[0] <= 2 * MIB && busy[1] >= 16 * MIB,
        "the outsider ended with {} KiB, python with {} KiB of the 24 MiB: {}",
        busy[0] >> 10,
        busy[1] >> 10,
        run.stats
    );
    run.check_budget();
}

#[test]
fn a_relative_token_file_reaches_a_process_that_changed_directory() {
    // The shell changes directory before python starts; the token file was named relative to
    // where the run started, and python's runtime could not read it (a pyenv shim does this).
    let job = format!("cd / && {PYTHON} {} 64", script("job.py").display());
    let run = run_tree_with(24, FarMem::DonorsWithToken, &["sh", "-c", &job], None);
    expect_ok_lines(&run, 1);
    let err = String::from_utf8_lossy(&run.out.stderr);
    assert!(!err.contains("token"), "{}", text(&run.out));
    assert!(run.paged() >= 1, "python was not paged: {}", run.stats);
    run.check_budget();
}

#[test]
fn multiprocessing_workers_share_the_budget() {
    let run = run_tree(
        64,
        &[PYTHON, script("workers.py").to_str().unwrap(), "48"],
        None,
    );
    let out = run.stdout();
    assert_eq!(out.lines().count(), 4, "{}", text(&run.out));
    // Same checksums as without farmem.
    let plain = Command::new(PYTHON)
        .arg(script("workers.py"))
        .arg("48")
        .output()
        .unwrap();
    assert_eq!(
        out,
        String::from_utf8_lossy(&plain.stdout),
        "{}",
        text(&run.out)
    );
    assert!(
        run.processes().len() >= 5,
        "the parent and 4 workers: {}",
        run.stats
    );
    assert!(
        run.paged() >= 4,
        "every worker over its share pages: {}",
        run.stats
    );
    run.check_budget();
}

#[test]
fn a_forking_server_s_children_read_the_parent_s_state() {
    let run = run_tree(
        48,
        &[PYTHON, script("forking_server.py").to_str().unwrap(), "96"],
        None,
    );
    expect_ok_lines(&run, 6);
    assert!(
        run.processes().len() >= 7,
        "the server and 6 children: {}",
        run.stats
    );
    assert!(run.paged() >= 1, "the server was not paged: {}", run.stats);
    // The server's pages in the host tier stay there for each fork: the children borrow them.
    run.check_budget();
}

/// `fork_rewrite.py` in `mode` with 96 MiB of state at 48 MiB, far pages in `far`: every
/// reader (`readers` lines) saw the state as at the fork, the parent (unless killed) its own
/// data, within the budget.
fn fork_rewrite(mode: &str, readers: usize, far: FarMem) -> TreeRun {
    let prog = script("fork_rewrite.py");
    let run = run_tree_with(48, far, &[PYTHON, prog.to_str().unwrap(), "96", mode], None);
    expect_ok_lines(&run, readers);
    if mode != "kill" {
        assert!(
            run.stdout().contains("parent ok"),
            "the parent's own data: {}",
            text(&run.out)
        );
    }
    run.check_budget();
    // The tree's summary: the parent lent pages in the host tier (a parent killed right after
    // the fork wrote no stats since), its child borrowed them.
    let summary = &run.stats["summary"];
    let count = |k: &str| summary[k].as_u64().unwrap_or(0);
    assert!(count("pages_borrowed") > 0, "nothing borrowed: {summary}");
    assert!(
        mode == "kill" || count("fork_pages_lent") > 0,
        "nothing lent: {summary}"
    );
    assert!(
        String::from_utf8_lossy(&run.out.stderr).contains("forks left "),
        "{}",
        text(&run.out)
    );
    run
}

/// The child borrows the parent's host-tier pages: whatever the parent does to its memory
/// after the fork — rewriting every page, freeing it, filling new memory — the child reads the
/// state as it was at the fork, and the parent its own.
#[test]
fn a_forked_child_reads_the_state_at_the_fork_while_the_parent_rewrites_it() {
    let run = fork_rewrite("rewrite", 1, FarMem::HostTier);
    // The launcher, the parent and the child: both of the last two read pages from far.
    assert!(run.paged() >= 2, "parent and child paged: {}", run.stats);
}

/// A grandchild forked by a child that borrowed pages borrows them in turn (and the child's own
/// host-tier pages): it reads the state as at the first fork too.
#[test]
fn a_grandchild_reads_what_its_parent_borrowed() {
    fork_rewrite("chain", 2, FarMem::HostTier);
}

/// The child keeps reading the pages it borrowed after its parent is SIGKILLed: the node keeps
/// the parent's slabs while the child maps them.
#[test]
fn a_forked_child_reads_the_state_after_its_parent_is_killed() {
    fork_rewrite("kill", 1, FarMem::HostTier);
}

/// With donors only (no host tier), the child borrows the parent's pages on the donor: it
/// reads them there as the parent's client, as they were at the fork, while the parent
/// rewrites them; the tree stays within its budget (a fork used to bring every page back).
#[test]
fn with_donors_only_a_forked_child_reads_the_state_at_the_fork_from_the_donor() {
    let run = fork_rewrite("rewrite", 1, FarMem::Donors);
    assert!(run.paged() >= 2, "parent and child paged: {}", run.stats);
}

/// With donors only, a grandchild borrows what its parent borrowed (still read as the first
/// parent's client) and its parent's own donor pages.
#[test]
fn with_donors_only_a_grandchild_reads_what_its_parent_borrowed() {
    fork_rewrite("chain", 2, FarMem::Donors);
}

/// With donors only, the child keeps reading the pages it borrowed after its parent is
/// SIGKILLed: its own connection keeps the parent's client (and slabs) alive on the donor.
#[test]
fn with_donors_only_a_forked_child_reads_the_state_after_its_parent_is_killed() {
    fork_rewrite("kill", 1, FarMem::Donors);
}

#[test]
fn make_runs_the_compiler_under_farmem() {
    require_program("make", "make");
    require_program("cc", "build-essential");
    let dir = Scratch::new("make");
    let mut rules = String::from("all:");
    for i in 0..6 {
        rules += &format!(" p{i}");
    }
    rules += "\n";
    for i in 0..6 {
        // A big generated function keeps the compiler's optimiser busy.
        let mut body = format!("int f{i}(int x) {{\n int a[64] = {{0}};\n");
        for k in 0..400 {
            body += &format!(" a[{}] += x * {k} + a[{}];\n", k % 64, (k * 7) % 64);
        }
        body += " int s = 0; for (int k = 0; k < 64; k++) s += a[k];\n return s;\n}\n";
        body += &format!("int main(void) {{ return f{i}(3) == 0; }}\n");
        std::fs::write(dir.path(&format!("p{i}.c")), body).unwrap();
        rules += &format!("p{i}: p{i}.c\n\tcc -O2 -o $@ $<\n");
    }
    std::fs::write(dir.path("Makefile"), rules).unwrap();
    let run = run_tree(32, &["make", "-j2"], Some(&dir.0));
    for i in 0..6 {
        assert!(
            dir.path(&format!("p{i}")).is_file(),
            "p{i} not built: {}",
            text(&run.out)
        );
    }
    // make, a shell or two per rule, cc, cc1, as, collect2, ld.
    assert!(
        run.processes().len() >= 12,
        "every process of the build ran a runtime: {}",
        run.stats
    );
    run.check_budget();
}
