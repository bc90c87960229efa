//! Careless input, each refused with one clear error line and a non-zero exit before anything
//! starts: `farmem run` with an unwritable --stats path, --record-trace /dev/full (a device),
//! --local-mem above the machine's memory, token files that are world-readable, empty or
//! over-long;
//! `farmem donor` with a --capacity above the machine's memory. A token file's one trailing
//! newline is not part of the token (`echo secret > tok` works against a file without it).

use farmem_testkit::bins::*;
use farmem_testkit::clients::*;
use farmem_testkit::run::*;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts `o` failed and its stderr holds every one of `needles`.
fn refused(o: &std::process::Output, needles: &[&str]) {
    assert!(!o.status.success(), "accepted: {}", text(o));
    let err = stderr(o);
    for n in needles {
        assert!(err.contains(n), "{n:?} missing from: {}", text(o));
    }
}

fn token_file(dir: &Scratch, name: &str, bytes: &[u8], mode: u32) -> String {
    let p = dir.path(name);
    std::fs::write(&p, bytes).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    p.to_str().unwrap().to_string()
}

#[test]
fn stats_to_an_unwritable_path_fails_before_the_program_starts() {
    let dir = Scratch::new("careless-stats");
    let marker = dir.path("ran");
    let o = farmem_run(
        &[
            "--local-mem",
            "256MiB",
            "--stats",
            "/nonexistent-farmem-dir/stats.json",
        ],
        &["touch", marker.to_str().unwrap()],
    );
    refused(
        &o,
        &["--stats /nonexistent-farmem-dir/stats.json", "No such file"],
    );
    assert!(!marker.exists(), "the program ran anyway");
}

#[test]
fn record_trace_to_a_device_is_refused() {
    // It used to be opened (and /dev/full failed with "No space left"): farmem writes only
    // regular files of its user's (see run_output_files.rs).
    let o = farmem_run(
        &["--local-mem", "256MiB", "--record-trace", "/dev/full"],
        &["true"],
    );
    refused(
        &o,
        &[
            "--record-trace /dev/full",
            "is a character device, not a regular file",
        ],
    );
}

#[test]
fn local_memory_above_the_machine_is_refused() {
    let o = farmem_run(&["--local-mem", "10TiB"], &["true"]);
    refused(&o, &["--local-mem", "more than this machine's memory"]);
}

#[test]
fn a_keep_free_watermark_above_the_machine_is_refused() {
    // Both servers used to start and lend nothing, with one log line.
    for cmd in [
        &["donor", "--listen", "127.0.0.1:0", "--capacity", "64MiB"][..],
        &[
            "node",
            "--socket",
            "/tmp/farmem-careless-keep-free.sock",
            "--capacity",
            "64MiB",
        ][..],
    ] {
        let o = Command::new(farmem())
            .args(cmd)
            .args(["--keep-free", "100TiB"])
            .output()
            .unwrap();
        refused(&o, &["--keep-free", "is not below this machine's memory"]);
    }
}

#[test]
fn a_local_donor_capacity_below_one_slab_names_the_flag() {
    // It used to fail in the embedded donor, whose message named the donor's own flags.
    for kind in ["node", "tcp"] {
        let o = farmem_run(
            &[
                "--local-donor",
                kind,
                "--local-donor-capacity",
                "0",
                "--local-mem",
                "32MiB",
            ],
            &["true"],
        );
        refused(&o, &["--local-donor-capacity 0 bytes holds not one slab"]);
        assert!(!stderr(&o).contains("--slab-size"), "{}", text(&o));
    }
}

#[test]
fn a_heap_reserve_below_the_minimum_names_the_flag() {
    // It used to fail inside the program, naming an internal setting.
    for size in ["0", "1MiB"] {
        let o = farmem_run(&["--heap-reserve", size, "--local-mem", "32MiB"], &["true"]);
        refused(&o, &["--heap-reserve", "too small: give at least 64.0 MiB"]);
        assert!(!stderr(&o).contains("heap_reserve_bytes"), "{}", text(&o));
    }
}

#[test]
fn bad_token_files_are_refused_with_what_to_do() {
    let dir = Scratch::new("careless-token");
    let open = token_file(&dir, "open", b"secret", 0o644);
    refused(
        &farmem_run(&["--local-mem", "256MiB", "--token-file", &open], &["true"]),
        &["readable by others", &format!("chmod 600 {open}")],
    );
    // Empty (or only a newline), with and without --donor.
    for (name, bytes) in [("empty", &b""[..]), ("newline", b"\n")] {
        let f = token_file(&dir, name, bytes, 0o600);
        refused(
            &farmem_run(&["--local-mem", "256MiB", "--token-file", &f], &["true"]),
            &["is empty"],
        );
        refused(
            &farmem_run(
                &[
                    "--local-mem",
                    "256MiB",
                    "--donor",
                    "127.0.0.1:9",
                    "--token-file",
                    &f,
                ],
                &["true"],
            ),
            &["is empty"],
        );
    }
    let long = token_file(&dir, "long", &[b'x'; 300], 0o600);
    refused(
        &farmem_run(&["--local-mem", "256MiB", "--token-file", &long], &["true"]),
        &["300-byte token", "at most 256 bytes"],
    );
    // The donor refuses the same files.
    let o = Command::new(farmem())
        .args(["donor", "--capacity", "64MiB", "--listen", "127.0.0.1:0"])
        .args(["--token-file", &open])
        .output()
        .unwrap();
    refused(&o, &["chmod 600"]);
}

#[test]
fn a_donor_capacity_above_the_machine_is_refused() {
    let o = Command::new(farmem())
        .args(["donor", "--capacity", "1000TiB", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    refused(&o, &["--capacity", "MemTotal", "smaller --capacity"]);
}

#[test]
fn a_trailing_newline_in_a_token_file_is_not_part_of_the_token() {
    let dir = Scratch::new("careless-newline");
    let plain = token_file(&dir, "plain", b"the-secret", 0o600);
    let echoed = token_file(&dir, "echoed", b"the-secret\n", 0o600);
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut donor = Command::new(farmem())
        .args(["donor", "--listen", &addr, "--capacity", "256MiB"])
        .args(["--token-file", &plain])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let _ = connect_plain(port, Duration::from_secs(10), &mut donor);
    // farmem run checks the donor with the echoed file, and so does the program's runtime.
    let o = farmem_run(
        &[
            "--local-mem",
            "256MiB",
            "--donor",
            &addr,
            "--token-file",
            &echoed,
        ],
        &["true"],
    );
    let _ = donor.kill();
    let _ = donor.wait();
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn an_embedded_donor_lowers_a_computed_capacity_to_the_machine() {
    use std::io::BufRead;
    // Embedded donors (started with --exit-with-parent by farmem run and the runtime) get a
    // computed capacity; above the machine it is lowered rather than refused.
    let script = format!(
        "{} donor --capacity 1000TiB --listen 127.0.0.1:0 --exit-with-parent $$",
        farmem().display()
    );
    let mut child = Command::new("sh")
        .args(["-c", &script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(line.starts_with("farmem donor listening on"), "{line:?}");
}

#[test]
fn sizes_beyond_the_machine_or_any_link_name_their_flag() {
    // Each was taken: a 1000TiB mapping threshold made farmem manage nothing, a 1000TiB heal
    // rate left healing unpaced, a 1000TiB private node was silently capped.
    let dir = Scratch::new("careless-sizes");
    let marker = dir.path("ran");
    let touch = ["touch", marker.to_str().unwrap()];
    let cases: [(&[&str], &[&str]); 4] = [
        (
            &["--mmap-threshold", "1000TiB"],
            &[
                "--mmap-threshold 1000.0 TiB",
                "more than this machine's memory",
                "256KiB",
            ],
        ),
        (
            &["--heal-rate", "1000TiB"],
            &[
                "--heal-rate 1000.0 TiB/s",
                "faster than any link",
                "at most 100.0 GiB/s",
            ],
        ),
        (
            &["--local-donor-capacity", "1000TiB"],
            &[
                "--local-donor-capacity 1000.0 TiB",
                "more than this machine's memory",
            ],
        ),
        (
            &["--local-donor", "tcp", "--local-donor-capacity", "1000TiB"],
            &[
                "--local-donor-capacity 1000.0 TiB",
                "more than this machine's memory",
            ],
        ),
    ];
    for (flags, needles) in cases {
        let mut args = vec!["--local-mem", "64MiB"];
        args.extend_from_slice(flags);
        let o = farmem_run(&args, &touch);
        refused(&o, needles);
        assert!(!marker.exists(), "the program ran anyway: {flags:?}");
    }
}

#[test]
fn a_token_file_that_is_not_a_regular_file_is_refused_without_chmod_advice() {
    // `--token-file /dev/full` advised `chmod 600 /dev/full`.
    let dir = Scratch::new("careless-token-kind");
    let folder = dir.path("folder");
    std::fs::create_dir(&folder).unwrap();
    let folder = folder.to_str().unwrap().to_string();
    for (path, kind) in [
        ("/dev/full", "a character device"),
        ("/dev/null", "a character device"),
        (folder.as_str(), "a directory"),
    ] {
        let o = farmem_run(&["--local-mem", "64MiB", "--token-file", path], &["true"]);
        refused(&o, &["is not a regular file", kind]);
        assert!(
            !stderr(&o).contains(&format!("chmod 600 {path}")),
            "{}",
            text(&o)
        );
        let o = Command::new(farmem())
            .args(["donor", "--capacity", "64MiB", "--listen", "127.0.0.1:0"])
            .args(["--token-file", path])
            .output()
            .unwrap();
        refused(&o, &["is not a regular file", kind]);
        assert!(
            !stderr(&o).contains(&format!("chmod 600 {path}")),
            "{}",
            text(&o)
        );
    }
}
