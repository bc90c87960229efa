//! `farmem run` on python3 with numpy: a ~1 GiB matrix computation under `--local-mem 256MiB`
//! gives the same result as without farmem, and the stats show pages went to the donor and
//! came back.

use farmem_testkit::run::*;

use std::process::Command;

/// Two 8192×8192 float64 matrices (512 MiB each, 1 GiB live): element-wise work (hashed,
/// must match bit for bit), a reduction and a 512-row matrix product (compared with a relative
/// tolerance: BLAS and reductions may round differently with differently aligned data).
const SCRIPT: &str = r#"
import hashlib, json
import numpy as np
n = 8192
rng = np.random.default_rng(12345)
a = rng.random((n, n))
b = a * 3.0
h = hashlib.sha256()
for i in range(0, n, 512):
    h.update(b[i:i + 512].tobytes())
total = float(b.sum())
mm = float((a[:512] @ b[:512].T).sum())
print(json.dumps({"sha": h.hexdigest(), "total": total, "mm": mm}))
"#;

fn python() -> &'static str {
    // Debian's interpreter with Debian's numpy (python3-numpy); a PATH python3 may be a
    // version-manager shim (a shell script), which would put the shell, not python, under farmem.
    let py = "/usr/bin/python3";
    assert!(
        std::path::Path::new(py).is_file(),
        "{py} is missing: install the Debian package python3"
    );
    let o = Command::new(py)
        .args(["-c", "import numpy"])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "numpy is missing for {py}: install the Debian package python3-numpy"
    );
    py
}

fn result_of(stdout: &[u8]) -> serde_json::Value {
    let s = String::from_utf8_lossy(stdout);
    let line = s.lines().last().unwrap_or_else(|| panic!("no output: {s}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

fn close(a: &serde_json::Value, b: &serde_json::Value, key: &str) {
    let (x, y) = (a[key].as_f64().unwrap(), b[key].as_f64().unwrap());
    assert!(
        (x - y).abs() <= 1e-9 * x.abs().max(y.abs()),
        "{key}: {x} vs {y}"
    );
}

#[test]
fn numpy_gigabyte_under_256mib_matches_and_pages_move() {
    let py = python();
    let plain = Command::new(py).args(["-c", SCRIPT]).output().unwrap();
    assert!(plain.status.success(), "without farmem: {}", text(&plain));
    let expect = result_of(&plain.stdout);

    let dir = Scratch::new("numpy");
    let stats = dir.path("stats.json");
    let o = farmem_run(
        &["--local-mem", "256MiB", "--stats", stats.to_str().unwrap()],
        &[py, "-c", SCRIPT],
    );
    assert!(o.status.success(), "under farmem: {}", text(&o));
    let got = result_of(&o.stdout);
    assert_eq!(got["sha"], expect["sha"], "element-wise results differ");
    for k in ["total", "mm"] {
        close(&got, &expect, k);
    }
    let s = read_stats(&stats);
    assert!(
        far_bytes_out(&s) > 256 << 20,
        "pages should have gone far (host tier or donor): {s}"
    );
    assert!(
        far_bytes_in(&s) > 64 << 20,
        "pages should have come back: {s}"
    );
    assert!(
        counter(&s, "peak_resident_bytes") <= 256 << 20,
        "budget exceeded: {s}"
    );
}
