//! A real `farmem donor` child process on 127.0.0.1 for the cli tests: started with
//! `--listen 127.0.0.1:0`, its address read from its one stdout line, its stderr collected, and
//! killed when dropped (so a failing test leaves no donor behind).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A running `farmem donor`.
pub struct Donor {
    pub child: Child,
    pub addr: SocketAddr,
    stderr: Arc<Mutex<String>>,
    stderr_reader: Option<JoinHandle<()>>,
    stdout_reader: Option<JoinHandle<String>>,
}

impl Donor {
    /// Runs `farmem donor --listen 127.0.0.1:0 ARGS…` with info logs and waits for its
    /// `farmem donor listening on ADDR` line.
    pub fn spawn(args: &[&str]) -> Donor {
        let mut child = Command::new(env!("CARGO_BIN_EXE_farmem"))
            .args(["donor", "--listen", "127.0.0.1:0"])
            .args(args)
            .env("FARMEM_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start farmem donor");
        let stderr = Arc::new(Mutex::new(String::new()));
        let stderr_reader = {
            let sink = Arc::clone(&stderr);
            let mut pipe = child.stderr.take().expect("piped stderr");
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = pipe.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    sink.lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            })
        };
        let mut out = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut line = String::new();
        out.read_line(&mut line)
            .expect("read the donor's first line");
        let addr = match line
            .strip_prefix("farmem donor listening on ")
            .and_then(|rest| rest.strip_suffix('\n'))
        {
            Some(a) => a.parse().expect("the line names a socket address"),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                let _ = stderr_reader.join();
                panic!(
                    "unexpected first stdout line {line:?}; stderr: {}",
                    stderr.lock().unwrap()
                )
            }
        };
        let stdout_reader = std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = out.read_to_string(&mut rest);
            rest
        });
        Donor {
            child,
            addr,
            stderr,
            stderr_reader: Some(stderr_reader),
            stdout_reader: Some(stdout_reader),
        }
    }

    /// A donor of `capacity` bytes in slabs of `slab` bytes (e.g. `"64MiB"`, `"1MiB"`).
    pub fn start(capacity: &str, slab: &str) -> Donor {
        Donor::spawn(&["--capacity", capacity, "--slab-size", slab])
    }

    /// Sends `sig` (as kill(1) spells it, e.g. `-TERM`) to the donor.
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .expect("run kill(1)")
            .success();
        assert!(ok, "kill {sig} failed");
    }

    /// Waits for the donor to exit (60 s at most: far beyond a clean stop on a loaded machine).
    pub fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("the donor did not exit within 60 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// After the donor exited: everything it wrote to stderr, and to stdout after its first line.
    /// Joins the pipe readers, so no late line is missed.
    pub fn output_after_exit(&mut self) -> (String, String) {
        assert!(
            self.child.try_wait().unwrap().is_some(),
            "the donor is still running"
        );
        if let Some(t) = self.stderr_reader.take() {
            t.join().expect("stderr reader");
        }
        let rest = self
            .stdout_reader
            .take()
            .map(|t| t.join().expect("stdout reader"))
            .unwrap_or_default();
        (rest, self.stderr.lock().unwrap().clone())
    }
}

impl Drop for Donor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
