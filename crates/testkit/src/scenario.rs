//! A test scenario that must run in a process of its own (it may end with a signal, e.g.
//! SIGBUS from a poisoned page): the test binary runs itself on one `#[ignore]`d test, which
//! prints `READY` once set up and waits for a line on stdin before its last step.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The scenario process, stopped at `READY`.
pub struct Scenario {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl Scenario {
    /// Runs the ignored test `name` of this test binary with `env`, and waits for its `READY`
    /// line (the test fails if it ends before).
    pub fn start(name: &str, env: &[(&str, String)]) -> Scenario {
        let mut cmd = Command::new(std::env::current_exe().expect("the test binary's path"));
        cmd.args(["--exact", name, "--ignored", "--nocapture"])
            .env("FARMEM_LOG", "error")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("starting the scenario process");
        let mut out = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut line = String::new();
        let ready = loop {
            line.clear();
            match out.read_line(&mut line) {
                Ok(0) | Err(_) => break false,
                Ok(_) if line.trim() == "READY" => break true,
                Ok(_) => {}
            }
        };
        if !ready {
            let _ = child.kill();
            let status = child.wait();
            panic!("scenario {name} ended before READY: {status:?}");
        }
        Scenario { child, out }
    }

    /// Lets the scenario take its last step and waits at most `limit` for it to end (a hang
    /// fails the test); returns how it ended, its remaining stdout and its stderr.
    pub fn go(mut self, limit: Duration) -> (ExitStatus, String, String) {
        writeln!(self.child.stdin.take().expect("piped stdin"), "GO").expect("writing GO");
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("waiting for the scenario") {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("the scenario hung (more than {limit:?})");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut stdout = String::new();
        let _ = self.out.read_to_string(&mut stdout);
        let mut stderr = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut stderr);
        }
        (status, stdout, stderr)
    }
}

/// In the scenario process: says `READY` and waits for the test's `GO`.
pub fn ready() {
    println!("READY");
    std::io::stdout().flush().expect("writing READY");
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .expect("reading the test's GO");
}
