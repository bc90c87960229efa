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

/// `farmem stats --donor` with tenants: the asking tenant's use and quota, and its clients with
/// the address each connects from and the program it said it is — a real `farmem run` among
/// them — and never another tenant's clients; the metrics endpoint gives every tenant's use.
#[test]
fn stats_shows_the_tenants_clients_with_host_and_program_and_metrics_each_tenants_use() {
    use farmem_testkit::clients::{free_port, http_get};
    use farmem_testkit::run::{farmem_spawn, Scratch};
    use std::time::{Duration, Instant};

    let dir = Scratch::new("stats-tenants");
    let file = farmem_testkit::donor::tenants_file(
        &dir.path(""),
        &[
            ("alice", b"alice-token", "quota = \"128MiB\""),
            ("bob", b"bob-token", ""),
        ],
    );
    let metrics = format!("127.0.0.1:{}", free_port());
    let donor = Donor::spawn(&[
        "--capacity",
        "256MiB",
        "--slab-size",
        "4MiB",
        "--tenants",
        &file,
        "--metrics",
        &metrics,
    ]);
    let addr = donor.addr.to_string();
    let client = |token: &[u8], label: &str, slabs: usize| {
        let c = DonorClient::connect(
            &addr,
            ClientConfig {
                token: Some(token.to_vec()),
                label: Some(label.to_string()),
                ..ClientConfig::default()
            },
        )
        .unwrap();
        for _ in 0..slabs {
            c.alloc_slab().unwrap();
        }
        c
    };
    let trainer = client(b"alice-token", "trainer pid 7 on host-a", 1);
    let _secret = client(b"bob-token", "secret-job pid 9 on host-b", 2);

    // A real program under farmem run, as alice: its runtime tells the donor what it is.
    let alice_token = dir.path("alice.token");
    let mut run = farmem_spawn(
        &[
            "--local-mem",
            "32MiB",
            "--donor",
            &addr,
            "--token-file",
            alice_token.to_str().unwrap(),
        ],
        &["sleep", "30"],
        &dir.path("run.log"),
    );

    let stats = |args: &[&str]| {
        let mut a = vec![
            "stats",
            "--donor",
            &addr,
            "--token-file",
            alice_token.to_str().unwrap(),
            "--interval-ms",
            "0",
        ];
        a.extend_from_slice(args);
        farmem(&a)
    };
    let until = Instant::now() + Duration::from_secs(30);
    let v = loop {
        let o = stats(&["--json"]);
        assert!(o.status.success(), "{}", farmem_testkit::run::text(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let has_run = v["tenant"]["clients"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["program"].as_str().unwrap().starts_with("sleep pid "));
        if has_run {
            break v;
        }
        assert!(
            Instant::now() < until,
            "farmem run's client never showed: {v}\n{}",
            run.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let t = &v["tenant"];
    assert_eq!(t["name"], "alice", "{v}");
    assert_eq!(t["quota_bytes"], 128 << 20, "{v}");
    assert!(t["used_bytes"].as_u64().unwrap() >= 4 << 20, "{v}");
    let clients = t["clients"].as_array().unwrap();
    let tr = clients
        .iter()
        .find(|c| c["program"] == "trainer pid 7 on host-a")
        .unwrap_or_else(|| panic!("the trainer is not listed: {v}"));
    assert_eq!(tr["address"], "127.0.0.1", "{v}");
    assert_eq!(tr["slabs"], 1, "{v}");
    assert_eq!(tr["used_bytes"], 4 << 20, "{v}");
    assert_eq!(tr["id"], format!("{:016x}", trainer.client_id()), "{v}");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let run_client = clients
        .iter()
        .find(|c| c["program"].as_str().unwrap().starts_with("sleep pid "))
        .unwrap();
    assert!(
        run_client["program"]
            .as_str()
            .unwrap()
            .ends_with(&format!(" on {}", host.trim_end())),
        "{run_client}"
    );
    let text = String::from_utf8(stats(&[]).stdout).unwrap();
    assert!(text.contains("tenant       alice: "), "{text}");
    assert!(text.contains("trainer pid 7 on host-a"), "{text}");
    for out in [v.to_string(), text] {
        assert!(
            !out.contains("secret-job"),
            "bob's client shown to alice: {out}"
        );
        assert!(!out.contains("bob"), "bob shown to alice: {out}");
    }

    // The operator's view: every tenant's use.
    let (head, body) = http_get(metrics.as_str(), "/metrics");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        body.contains("farmem_donor_tenant_used_bytes{tenant=\"bob\"} 8388608"),
        "{body}"
    );
    assert!(
        body.contains("farmem_donor_tenant_quota_bytes{tenant=\"alice\"} 134217728"),
        "{body}"
    );
    assert!(
        !body.contains("farmem_donor_tenant_quota_bytes{tenant=\"bob\"}"),
        "bob has no quota: {body}"
    );
    assert!(
        body.contains("farmem_donor_tenant_clients{tenant=\"bob\"} 1"),
        "{body}"
    );
    run.signal("TERM");
    run.wait(Duration::from_secs(30));
}
