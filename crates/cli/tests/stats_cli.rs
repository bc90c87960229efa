//! `farmem stats` end to end: a real `farmem donor` process on 127.0.0.1 with a token, a real
//! client holding a slab, and `farmem stats --json` parsed; plus the table and the errors for a
//! missing token, an unreachable donor and a bad address.

use std::process::{Command, Output};

use farmem_transport::{ClientConfig, DonorClient, PageAddr, PageWrite};

use farmem_testkit::donor::Donor;

/// A `farmem donor` lending 256 MiB (in 64 MiB slabs) to holders of the token in `token_file`;
/// returns it and its address as text.
fn start_donor(token_file: &std::path::Path) -> (Donor, String) {
    let donor = Donor::spawn(&[
        "--capacity",
        "256MiB",
        "--token-file",
        token_file.to_str().expect("a UTF-8 temp path"),
    ]);
    let addr = donor.addr.to_string();
    (donor, addr)
}

fn farmem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_farmem"))
        .args(args)
        .output()
        .expect("cannot run the farmem binary")
}

#[test]
fn stats_reports_a_live_donors_figures_as_json_and_as_a_table() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, b"stats-test-token").unwrap();
    // Token files must be private (mode 600).
    std::fs::set_permissions(
        &token_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let (_donor, addr) = start_donor(&token_file);

    // A client that holds one slab and has written and read 8 pages.
    let client = DonorClient::connect(
        &addr,
        ClientConfig {
            client_id: 11,
            token: Some(b"stats-test-token".to_vec()),
            ..ClientConfig::default()
        },
    )
    .unwrap();
    let slab = client.alloc_slab().unwrap();
    let page = vec![3u8; 4096];
    let writes: Vec<_> = (0..8)
        .map(|i| PageWrite {
            addr: PageAddr { slab, page: i },
            data: &page,
        })
        .collect();
    client.write_pages(&writes).unwrap();
    let mut out = vec![0u8; 8 * 4096];
    let addrs: Vec<_> = writes.iter().map(|w| w.addr).collect();
    client.read_pages(&addrs, &mut out).unwrap();

    let token = token_file.to_str().unwrap();
    let out = farmem(&[
        "stats",
        "--donor",
        &addr,
        "--token-file",
        token,
        "--json",
        "--interval-ms",
        "200",
    ]);
    assert!(
        out.status.success(),
        "farmem stats failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("--json prints JSON");
    let n = |k: &str| {
        v[k].as_f64()
            .unwrap_or_else(|| panic!("{k} missing or not a number in {v}"))
    };
    assert_eq!(v["donor"], addr.as_str());
    assert_eq!(n("capacity_bytes"), (256u64 << 20) as f64);
    // The default slab: 4 MiB (see docs/architecture.md, Donor: slab size).
    assert_eq!(n("slab_size_bytes"), (4u64 << 20) as f64);
    assert_eq!(n("used_bytes"), (4u64 << 20) as f64);
    assert_eq!(n("free_bytes"), (252u64 << 20) as f64);
    assert_eq!(n("slabs"), 1.0);
    assert_eq!(
        n("clients"),
        1.0,
        "the test's client, not stats' own connection"
    );
    assert_eq!(n("pages_written_total"), 8.0);
    assert_eq!(n("pages_read_total"), 8.0);
    assert!(n("requests_total") >= 3.0);
    assert!(n("service_p99_us") >= n("service_p50_us") && n("service_p50_us") > 0.0);
    assert!(n("requests_per_s") >= 0.0);
    assert_eq!(v["rate_method"], "sampled");
    assert!(n("rate_interval_ms") >= 150.0, "{v}");
    // Nothing asked back: the donor is within its capacity.
    assert_eq!(n("reclaim_wanted_bytes"), 0.0);
    assert_eq!(n("slabs_given_back_total"), 0.0);

    let out = farmem(&[
        "stats",
        "--donor",
        &addr,
        "--token-file",
        token,
        "--interval-ms",
        "0",
    ]);
    assert!(out.status.success());
    let table = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "capacity     256.0 MiB",
        "used         4.0 MiB (1.6%)",
        "free         252.0 MiB",
        "slabs        1 of 4.0 MiB",
        "clients      1",
        "(lifetime average)",
        "service p50",
        "8 read, 8 written",
        "given back   0 slabs; wanted back now 0 B",
    ] {
        assert!(table.contains(needle), "{needle:?} missing from\n{table}");
    }
}

#[test]
fn stats_without_the_token_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, b"right").unwrap();
    // Token files must be private (mode 600).
    std::fs::set_permissions(
        &token_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let (_donor, addr) = start_donor(&token_file);
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, b"wrong").unwrap();
    // Token files must be private (mode 600).
    std::fs::set_permissions(&wrong, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    for extra in [vec![], vec!["--token-file", wrong.to_str().unwrap()]] {
        let mut args = vec!["stats", "--donor", addr.as_str(), "--json"];
        args.extend(extra);
        let out = farmem(&args);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("refused the auth token") && err.contains("--token-file"),
            "{err}"
        );
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn stats_on_an_unreachable_or_malformed_address_says_so() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let out = farmem(&["stats", "--donor", &addr]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&addr) && err.contains("farmem donor") && err.contains("refused"),
        "{err}"
    );

    let out = farmem(&["stats", "--donor", "no-port-here"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("HOST:PORT"), "{err}");

    let out = farmem(&[
        "stats",
        "--donor",
        "127.0.0.1:1",
        "--token-file",
        "/nonexistent/token",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/token"), "{err}");
}

#[test]
fn several_donors_are_one_table_and_one_that_does_not_answer_is_named() {
    let dir = farmem_testkit::run::Scratch::new("stats-several");
    let token_file = dir.path("token");
    std::fs::write(&token_file, "stats-test-token").unwrap();
    std::fs::set_permissions(
        &token_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let (_a, a) = start_donor(&token_file);
    let (_b, b) = start_donor(&token_file);
    // A port nothing listens on.
    let gone = format!("127.0.0.1:{}", farmem_testkit::clients::free_port());
    let token = token_file.to_str().unwrap();
    let args = |json: bool| {
        let mut v = vec![
            "stats",
            "--donor",
            &a,
            "--donor",
            &b,
            "--donor",
            &gone,
            "--token-file",
            token,
            "--interval-ms",
            "0",
        ];
        if json {
            v.push("--json");
        }
        farmem(&v)
    };
    let out = args(false);
    assert_eq!(out.status.code(), Some(1), "one donor did not answer");
    let table = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "donor ",
        &format!("{a} "),
        &format!("{b} "),
        "256.0 MiB",
        "all 2 answering: capacity 512.0 MiB",
        &format!("NOT ANSWERING {gone}"),
    ] {
        assert!(table.contains(needle), "{needle:?} missing from:\n{table}");
    }
    assert!(String::from_utf8_lossy(&out.stderr).contains("1 of 3 donors did not answer"));
    let out = args(true);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let rows = v.as_array().expect("an array, one element per donor");
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0]["donor"], a.as_str());
    assert_eq!(rows[1]["capacity_bytes"], 256u64 << 20);
    assert_eq!(rows[2]["donor"], gone.as_str());
    assert!(rows[2]["error"]
        .as_str()
        .unwrap()
        .contains("could not connect"));
}
