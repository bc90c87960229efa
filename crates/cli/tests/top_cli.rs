//! `farmem top` in a real terminal (tmux): the rows it draws match a program paging through a
//! real node and a real donor; its keys sort and quit; `--once --json` gives the same figures
//! to scripts; without a terminal or with bad flags it says what to do.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use farmem_node::child::child_node_command;
use farmem_testkit::bins::farmem;
use farmem_testkit::donor::Donor;
use farmem_testkit::run::*;

/// A tmux server of this test's own (its own socket name), killed when dropped.
struct Tmux {
    tmux: PathBuf,
    socket: String,
}

impl Tmux {
    fn start(tag: &str, command: &str) -> Tmux {
        let t = Tmux {
            tmux: require_program("tmux", "tmux"),
            socket: format!("farmem-{tag}-{}", std::process::id()),
        };
        let st = t
            .cmd()
            .args(["new-session", "-d", "-x", "220", "-y", "50", "-s", "top"])
            .arg(command)
            .status()
            .unwrap();
        assert!(st.success(), "tmux new-session failed: {st}");
        t
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new(&self.tmux);
        c.args(["-L", &self.socket]);
        c
    }

    fn capture(&self) -> String {
        let out = self
            .cmd()
            .args(["capture-pane", "-p", "-t", "top"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn keys(&self, keys: &str) {
        let st = self
            .cmd()
            .args(["send-keys", "-t", "top", keys])
            .status()
            .unwrap();
        assert!(st.success());
    }

    fn alive(&self) -> bool {
        self.cmd()
            .args(["has-session", "-t", "top"])
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap()
            .success()
    }

    /// Waits until the pane shows what `ok` accepts; the last capture otherwise, in the panic.
    fn until(&self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let screen = self.capture();
            if ok(&screen) {
                return screen;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the pane never showed {what}:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self
            .cmd()
            .arg("kill-server")
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// The program's pid: the child of `farmem run` (the tree's root).
fn program_pid(run: &Running) -> u32 {
    let children =
        std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", run.child.id())).unwrap();
    children
        .split_whitespace()
        .next()
        .expect("farmem run has a child")
        .parse()
        .unwrap()
}

#[test]
fn top_draws_the_node_the_program_and_its_donor_and_answers_its_keys() {
    let dir = Scratch::new("top");
    let prog = dir.path("phases");
    compile_c(&c_source("phases.c"), &prog, &[]);
    let donor = Donor::start("512MiB", "1MiB");
    let donor_addr = donor.addr.to_string();
    let socket = dir.path("node.sock");
    let _node = child_node_command(farmem(), &socket)
        .args(["--capacity", "16MiB", "--slab-size", "4MiB"])
        .spawn()
        .unwrap_or_else(|e| panic!("the node did not start: {e}"));
    let d = dir.path("");
    let mut run = farmem_spawn(
        &[
            "--local-mem",
            "24MiB",
            "--donor",
            &donor_addr,
            "--node",
            socket.to_str().unwrap(),
        ],
        &[
            prog.to_str().unwrap(),
            "96",
            d.to_str().unwrap(),
            "fill:1",
            "loop:1:stop",
        ],
        &dir.path("run.log"),
    );
    run.wait_for_file(&dir.path("at-stop"));
    let pid = program_pid(&run).to_string();

    let top = format!("{} top --node {}", farmem().display(), socket.display());
    let tmux = Tmux::start("top", &top);
    let screen = tmux.until("the program's row with a fault rate", |s| {
        s.lines().any(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            cells.first() == Some(&pid.as_str())
                && l.contains("phases 96")
                // PID PROCS, three sizes of two words each, then FAULTS/S.
                && cells.get(8).is_some_and(|f| f.parse::<f64>().is_ok_and(|f| f > 0.0))
        })
    });
    assert!(
        screen.contains(&format!(
            "NODE {}  capacity 16.0 MiB  used 16.0 MiB",
            socket.display()
        )) || screen.contains(&format!("NODE {}  capacity 16.0 MiB", socket.display())),
        "{screen}"
    );
    // The node's clients are matched to the program (its pid in the PROGRAM column).
    assert!(
        screen
            .lines()
            .any(|l| l.split_whitespace().last() == Some(pid.as_str()) && l.contains("MiB")),
        "no node client of the program:\n{screen}"
    );
    let donor_row = screen
        .lines()
        .find(|l| l.trim_start().starts_with(&donor_addr))
        .unwrap_or_else(|| panic!("no donor row:\n{screen}"));
    assert!(
        donor_row.contains("live") && donor_row.contains("512.0 MiB") && donor_row.contains(" ms"),
        "{donor_row}"
    );
    assert!(
        screen.contains("sorted by resident — s: sort, q: quit"),
        "{screen}"
    );
    tmux.keys("p");
    tmux.until("the pid order", |s| s.contains("sorted by pid"));
    tmux.keys("s");
    tmux.until("the next order", |s| s.contains("sorted by resident"));
    tmux.keys("q");
    let start = Instant::now();
    while tmux.alive() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "q did not end top:\n{}",
            tmux.capture()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // The same figures for scripts.
    let out = Command::new(farmem())
        .args(["top", "--once", "--json", "--interval", "0.5", "--node"])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = v["programs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"].as_u64() == pid.parse().ok())
        .unwrap_or_else(|| panic!("no program {pid} in {v}"));
    assert_eq!(p["local_mem_bytes"], 24 << 20);
    assert!(p["resident_bytes"].as_u64().unwrap() > 0, "{p}");
    let f = &p["faults_per_s"];
    assert!(
        f["host_tier"].as_f64().unwrap() + f["remote"].as_f64().unwrap() > 0.0,
        "a looping program faults: {p}"
    );
    assert_eq!(v["node"]["capacity_bytes"], 16 << 20);
    let d = v["donors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["addr"] == donor_addr.as_str())
        .unwrap_or_else(|| panic!("no donor {donor_addr} in {v}"));
    assert_eq!(d["health"], "live");
    assert!(d["round_trip_ms"].as_f64().is_some(), "{d}");
    assert!(d["used_bytes"].as_u64().unwrap() > 0, "{d}");

    std::fs::write(dir.path("stop"), "").unwrap();
    let st = run.wait(Duration::from_secs(120));
    assert!(st.success(), "{}", run.log_text());
}

#[test]
fn top_without_a_terminal_or_with_bad_flags_says_what_to_do() {
    let out = Command::new(farmem())
        .args(["top", "--node", "/nonexistent/node.sock"])
        .stdout(std::process::Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("needs a terminal") && text(&out).contains("--once"),
        "{}",
        text(&out)
    );
    for (args, says) in [
        (&["--json"][..], "--once"),
        (&["--once", "--interval", "0"][..], "0.1 to 3600"),
        (&["--once", "--interval", "soon"][..], "not a number"),
    ] {
        let out = Command::new(farmem())
            .arg("top")
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(says), "{args:?}: {}", text(&out));
    }
    // No node: the view says so and goes on.
    let out = Command::new(farmem())
        .args([
            "top",
            "--once",
            "--interval",
            "0.1",
            "--node",
            "/nonexistent/node.sock",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("NODE none: no node on /nonexistent/node.sock"),
        "{}",
        text(&out)
    );
}

/// Run as root, `top` reads files under a directory another user's environment names: a FIFO
/// or a link planted there is neither waited on nor followed, and a directory that is a link
/// is not read at all.
#[test]
fn top_as_root_is_not_held_or_misled_by_a_planted_tree() {
    use farmem_contract::{OverBudget, RunSettings, SealMode, TierMode};
    use std::os::unix::fs::symlink;
    let dir = Scratch::new("top-hostile");
    let tree = dir.path("tree");
    std::fs::create_dir_all(tree.join("stats")).unwrap();
    let fifo = tree.join("stats/1.json");
    let st = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(st.success());
    symlink("/etc/shadow", tree.join("stats/2.json")).unwrap();
    let settings = |tree_dir: &Path| {
        RunSettings {
            version: farmem_contract::run_settings::RUN_SETTINGS_VERSION,
            local_mem_bytes: 7 << 20,
            donors: Vec::new(),
            token_file: None,
            evict: None,
            prefetch: None,
            prefetch_install: None,
            seal: SealMode::Off,
            tier: TierMode::Off,
            replicas: None,
            backup_file: None,
            heal_rate_bytes: None,
            over_budget: OverBudget::Allow,
            stats_file: None,
            tree_dir: Some(tree_dir.to_path_buf()),
            record_trace: None,
            mmap_threshold_bytes: 4096,
            heap_reserve_bytes: 256 << 30,
            allocator_only: true,
            farmem_bin: None,
            orig_ld_preload: None,
        }
        .encode()
        .unwrap()
    };
    let linked = dir.path("linked-tree");
    symlink(&tree, &linked).unwrap();
    let mut sleepers: Vec<std::process::Child> = [tree.as_path(), linked.as_path()]
        .iter()
        .map(|t| {
            Command::new("sleep")
                .arg("60")
                .env(farmem_contract::run_settings::RUN_SETTINGS_VAR, settings(t))
                .spawn()
                .unwrap()
        })
        .collect();
    let out = output_within(
        Command::new(farmem()).args([
            "top",
            "--once",
            "--json",
            "--node",
            "/nonexistent/node.sock",
        ]),
        Duration::from_secs(30),
    );
    for s in &mut sleepers {
        let _ = s.kill();
        let _ = s.wait();
    }
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mine: Vec<&serde_json::Value> = v["programs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["local_mem_bytes"] == 7 << 20)
        .collect();
    // The real directory is listed (with nothing read from it); the link to it is not.
    assert_eq!(mine.len(), 1, "{v}");
    assert_eq!(mine[0]["processes"], 0, "{v}");
}
