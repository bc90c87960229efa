//! The real `farmem donor` taking memory back: its owner lowers its capacity through
//! `--capacity-file` and SIGHUP (bad content is logged and the old capacity kept), or its host
//! falls below `--keep-free`; the client holding the slabs is asked for them (RECLAIMS), frees
//! them, and the donor process's resident memory falls.
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use farmem_testkit::donor::Donor;
use farmem_transport::{ClientConfig, DonorClient, PageAddr, PageWrite, PAGE_SIZE};

const SLAB: u64 = 8 << 20;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("farmem-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes `text` to `path` (through a rename, so the donor never reads half of it) with `mode`.
fn put(path: &Path, text: &str, mode: u32) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn rss_anon_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("RssAnon in /proc/PID/status");
    kb * 1024
}

/// Allocates `n` slabs and writes every page of each, oldest first.
fn fill(c: &DonorClient, n: usize) -> Vec<u32> {
    let data = vec![0x6bu8; PAGE_SIZE];
    let pages = (SLAB / PAGE_SIZE as u64) as u32;
    (0..n)
        .map(|_| {
            let slab = c.alloc_slab().expect("alloc");
            for chunk in (0..pages).collect::<Vec<_>>().chunks(256) {
                let batch: Vec<PageWrite> = chunk
                    .iter()
                    .map(|&page| PageWrite {
                        addr: PageAddr { slab, page },
                        data: &data,
                    })
                    .collect();
                c.write_pages(&batch).expect("write");
            }
            std::thread::sleep(Duration::from_millis(2));
            slab
        })
        .collect()
}

/// Asks RECLAIMS until the answer is not empty, for 10 s at most.
fn wanted(c: &DonorClient) -> Vec<u32> {
    let start = Instant::now();
    loop {
        let mut w = c.reclaims().expect("reclaims");
        if !w.is_empty() {
            w.sort_unstable();
            return w;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the donor asked for nothing back within 10 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn client(d: &Donor) -> DonorClient {
    DonorClient::connect(&d.addr.to_string(), ClientConfig::default()).expect("connect")
}

#[test]
fn sighup_rereads_the_capacity_file_keeps_it_on_bad_content_and_given_back_slabs_free_memory() {
    let dir = scratch("capfile");
    let file = dir.join("capacity");
    put(&file, "64MiB\n", 0o600);
    let f = file.to_str().unwrap();
    let mut d = Donor::spawn(&["--slab-size", "8MiB", "--capacity-file", f]);
    let c = client(&d);
    assert_eq!(c.info().capacity_bytes, 64 << 20);
    let slabs = fill(&c, 4);
    assert!(c.reclaims().unwrap().is_empty());

    // Bad content, one SIGHUP each: logged, the capacity kept, the donor serving.
    for (text, mode) in [("lots\n", 0o600), ("0\n", 0o600), ("16MiB\n", 0o666)] {
        put(&file, text, mode);
        d.signal("-HUP");
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            c.stats().unwrap().capacity_bytes,
            64 << 20,
            "after {text:?}"
        );
        assert!(c.reclaims().unwrap().is_empty(), "after {text:?}");
    }

    // Lowered to 2 slabs: the two least recently written are asked for; nothing new is lent.
    let before = rss_anon_bytes(d.pid());
    put(&file, "16MiB\n", 0o600);
    d.signal("-HUP");
    let w = wanted(&c);
    assert_eq!(w, vec![slabs[0], slabs[1]]);
    assert_eq!(c.stats().unwrap().capacity_bytes, 16 << 20);
    let refused = c.alloc_slab().unwrap_err();
    assert!(refused.to_string().contains("capacity"), "{refused}");
    for s in &w {
        c.free_slab(*s).unwrap();
    }
    assert!(c.reclaims().unwrap().is_empty());
    let st = c.stats().unwrap();
    assert_eq!((st.used_bytes, st.committed_bytes), (2 * SLAB, 2 * SLAB));
    assert_eq!(st.slabs_given_back_total, 2);
    let after = rss_anon_bytes(d.pid());
    assert!(
        after + SLAB * 3 / 2 <= before,
        "giving back 2 written slabs of {SLAB} bytes did not return memory: RssAnon {before} -> {after}"
    );

    // Raised again: lends again.
    put(&file, "32MiB", 0o600);
    d.signal("-HUP");
    let start = Instant::now();
    while c.stats().unwrap().capacity_bytes != 32 << 20 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "SIGHUP not applied"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    c.alloc_slab().expect("lends again once under the capacity");

    d.signal("-TERM");
    assert!(d.wait_exit().success());
    let (_, stderr) = d.output_after_exit();
    assert!(stderr.contains("does not hold a size"), "{stderr}");
    assert!(stderr.contains("says 0"), "{stderr}");
    assert!(stderr.contains("writable by others"), "{stderr}");
    assert_eq!(
        stderr.matches("SIGHUP: keeping the capacity").count(),
        3,
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn keep_free_asks_for_slabs_when_the_host_falls_short() {
    let dir = scratch("keepfree");
    let meminfo = dir.join("meminfo");
    let available = |bytes: u64| {
        format!(
            "MemTotal: {} kB\nMemAvailable: {} kB\n",
            64 << 20,
            bytes / 1024
        )
    };
    put(&meminfo, &available(8 << 30), 0o644);
    let mut d = Donor::spawn(&[
        "--slab-size",
        "8MiB",
        "--capacity",
        "64MiB",
        "--keep-free",
        "1GiB",
        "--meminfo-file",
        meminfo.to_str().unwrap(),
    ]);
    let c = client(&d);
    let slabs = fill(&c, 3);
    assert!(c.reclaims().unwrap().is_empty());
    // 12 MiB short: two written slabs cover it.
    put(&meminfo, &available((1 << 30) - (12 << 20)), 0o644);
    assert_eq!(wanted(&c), vec![slabs[0], slabs[1]]);
    let refused = c.alloc_slab().unwrap_err();
    assert!(refused.to_string().contains("--keep-free"), "{refused}");
    d.signal("-TERM");
    assert!(d.wait_exit().success());
    let (_, stderr) = d.output_after_exit();
    assert!(stderr.contains("wants memory back"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}
