//! `farmem-bench donor` end to end, on a tiny working set: it starts its own donor and memcached
//! (the Debian package `memcached` must be installed), prints exactly the promised JSON keys,
//! and names the package when memcached is missing. No figure is asserted: performance is
//! reported by the command, not tested.

use std::process::Command;

fn bench(extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_farmem-bench"))
        .args([
            "donor",
            "--requests",
            "200",
            "--batches",
            "20",
            "--pages",
            "512",
        ])
        .args(extra)
        .output()
        .expect("cannot run the farmem-bench binary")
}

#[test]
fn bench_donor_prints_exactly_the_promised_json() {
    let out = bench(&["--json"]);
    assert!(
        out.status.success(),
        "farmem-bench donor failed (is the Debian package `memcached` installed?): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("--json prints JSON");
    let top = v.as_object().expect("a JSON object");
    assert_eq!(
        top.keys().collect::<Vec<_>>(),
        ["farmem", "memcached"],
        "{v}"
    );
    for system in ["farmem", "memcached"] {
        let o = v[system].as_object().expect("an object per system");
        let mut keys: Vec<_> = o.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            ["batch_pages_per_s", "single_p50_us", "single_p99_us"],
            "{v}"
        );
        for (k, x) in o {
            let x = x
                .as_f64()
                .unwrap_or_else(|| panic!("{system}.{k} is not a number"));
            assert!(x.is_finite() && x > 0.0, "{system}.{k} = {x}");
        }
        assert!(o["single_p99_us"].as_f64() >= o["single_p50_us"].as_f64());
    }
}

#[test]
fn bench_donor_table_shows_the_ratio_and_the_targets() {
    let out = bench(&[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "farmem/memcached",
        "single-page read p50",
        "batch read, 64 pages x 4 in flight",
        "targets:",
    ] {
        assert!(table.contains(needle), "{needle:?} missing from\n{table}");
    }
}

#[test]
fn a_missing_memcached_names_the_package_to_install() {
    let out = bench(&["--memcached", "/nonexistent/memcached"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("apt-get install memcached") && err.contains("/nonexistent/memcached"),
        "{err}"
    );
}

#[test]
fn help_explains_the_phases_the_ratio_and_the_json() {
    let out = Command::new(env!("CARGO_BIN_EXE_farmem-bench"))
        .args(["donor", "--help"])
        .output()
        .expect("cannot run the farmem-bench binary");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "memcached",
        "warm-up",
        "ratio to memcached",
        "single_p50_us",
        "batch_pages_per_s",
    ] {
        assert!(help.contains(needle), "{needle:?} missing from:\n{help}");
    }
}
