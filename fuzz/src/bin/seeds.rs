//! Writes the seed corpora (`corpus/<target>/seed-*`) from real encoded frames, real trace files
//! and real configuration text, so every fuzz run starts from inputs that reach deep into the
//! code. Run by `scripts/fuzz.sh seeds`.
use std::io::Cursor;
use std::path::Path;

use farmem_proto::{
    encode_alloc_slab, encode_auth, encode_challenge, encode_error, encode_free_slab,
    encode_give_back, encode_hello, encode_pages_header, encode_read_pages, encode_reclaims,
    encode_slab_allocated, encode_stats,
    encode_stats_reply, encode_success, encode_welcome, encode_write_pages, AuthMode, DonorInfo,
    DonorStats, Opcode, PageAddr, Status, PAGE_SIZE,
};
use farmem_sim::{AccessKind, Record, TraceWriter};

fn write(dir: &Path, name: &str, data: &[u8]) {
    std::fs::create_dir_all(dir).expect("create the corpus folder");
    std::fs::write(dir.join(format!("seed-{name}")), data).expect("write a seed");
}

/// Requests a session may send after its handshake. Each session runs against an empty store
/// (`farmem_fuzz::session`), so its slabs are 1, 2, … in allocation order; slabs 1..=3 are
/// named.
fn requests() -> Vec<(&'static str, Vec<u8>)> {
    let page = vec![0xA5u8; PAGE_SIZE];
    let a = |slab, page| PageAddr { slab, page };
    let mut out = Vec::new();
    let mut f = Vec::new();
    encode_alloc_slab(&mut f, 3);
    out.push(("alloc", std::mem::take(&mut f)));
    encode_free_slab(&mut f, 4, 1);
    out.push(("free", std::mem::take(&mut f)));
    encode_stats(&mut f, 5);
    out.push(("stats", std::mem::take(&mut f)));
    encode_read_pages(&mut f, 6, &[a(1, 0), a(1, 15), a(2, 3)]).unwrap();
    out.push(("read", std::mem::take(&mut f)));
    encode_read_pages(&mut f, 7, &vec![a(1, 1); 256]).unwrap();
    out.push(("read-256", std::mem::take(&mut f)));
    encode_write_pages(&mut f, 8, &[(a(1, 2), &page), (a(1, 3), &page)]).unwrap();
    out.push(("write", std::mem::take(&mut f)));
    encode_hello(&mut f, 9);
    out.push(("hello", std::mem::take(&mut f)));
    encode_auth(&mut f, 10, 77, AuthMode::Attach, &[1; 32], &[2; 32]);
    out.push(("auth-attach", std::mem::take(&mut f)));
    encode_auth(&mut f, 11, 78, AuthMode::Register, &[1; 32], &[2; 32]);
    out.push(("auth-register", std::mem::take(&mut f)));
    encode_reclaims(&mut f, 12);
    out.push(("reclaims", std::mem::take(&mut f)));
    out
}

fn responses() -> Vec<(&'static str, Vec<u8>)> {
    let mut out = Vec::new();
    let mut f = Vec::new();
    encode_challenge(&mut f, 1, &[9; 32]);
    out.push(("r-challenge", std::mem::take(&mut f)));
    let info = DonorInfo {
        slab_size_bytes: 64 << 20,
        capacity_bytes: 1 << 30,
    };
    encode_welcome(&mut f, 2, info);
    out.push(("r-welcome", std::mem::take(&mut f)));
    encode_slab_allocated(&mut f, 3, 5);
    out.push(("r-slab", std::mem::take(&mut f)));
    encode_success(&mut f, Opcode::WritePages, 4);
    out.push(("r-done", std::mem::take(&mut f)));
    encode_error(&mut f, Opcode::Hello as u8, 0, Status::DonorFull, "donor full: 2");
    out.push(("r-error", std::mem::take(&mut f)));
    encode_pages_header(&mut f, 6, 2).unwrap();
    f.extend_from_slice(&vec![3u8; 2 * PAGE_SIZE]);
    out.push(("r-pages", std::mem::take(&mut f)));
    encode_stats_reply(&mut f, 7, &DonorStats::default());
    out.push(("r-stats", std::mem::take(&mut f)));
    encode_give_back(&mut f, 8, &[3, 1, 4]).unwrap();
    out.push(("r-give-back", std::mem::take(&mut f)));
    out
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    // decode: every request and response alone, and a whole session in one input.
    let decode = root.join("decode");
    let mut session = Vec::new();
    for (name, f) in requests().into_iter().chain(responses()) {
        write(&decode, name, &f);
        session.extend_from_slice(&f);
    }
    write(&decode, "session", &session);

    // donor: sessions of requests after the handshake.
    let donor = root.join("donor");
    let reqs = requests();
    let get = |n: &str| reqs.iter().find(|(k, _)| *k == n).unwrap().1.clone();
    for (name, f) in &reqs {
        write(&donor, name, f);
    }
    let cat = |names: &[&str]| names.iter().flat_map(|n| get(n)).collect::<Vec<u8>>();
    write(&donor, "alloc-write-read", &cat(&["alloc", "write", "read"]));
    write(&donor, "alloc-write-free-read", &cat(&["alloc", "write", "free", "read"]));
    write(&donor, "many", &cat(&["alloc", "alloc", "stats", "read-256", "free", "hello"]));
    write(&donor, "alloc-write-reclaims-free", &cat(&["alloc", "write", "reclaims", "free", "reclaims"]));

    // trace: real trace files.
    let trace = root.join("trace");
    for (name, n) in [("empty", 0u64), ("small", 5), ("medium", 200)] {
        let mut w = TraceWriter::new(Cursor::new(Vec::new())).unwrap();
        for i in 0..n {
            w.write(&Record {
                time_ns: i * 1000,
                page: (i * 7919) % 4096,
                thread: (i % 3) as u32,
                kind: if i % 2 == 0 {
                    AccessKind::Read
                } else {
                    AccessKind::Write
                },
            })
            .unwrap();
        }
        write(&trace, name, &w.finish().unwrap().into_inner());
    }

    // config: sizes, durations and tenants files.
    let config = root.join("config");
    for (name, text) in [
        ("size", "64MiB"),
        ("size-frac", "1.5GiB"),
        ("size-bytes", "4096"),
        ("duration", "60s"),
        ("duration-ms", "500ms"),
        (
            "tenants",
            "[[tenant]]\nname = \"a\"\ntoken_file = \"a.tok\"\nquota = \"4GiB\"\n\n[[tenant]]\nname = \"b\"\ntoken_file = \"/etc/b.tok\"\n",
        ),
        ("tenants-unknown-key", "[[tenant]]\nname = \"a\"\ntoken_file = \"a\"\nextra = 1\n"),
    ] {
        write(&config, name, text.as_bytes());
    }
    println!("seed corpora written under {}", root.display());
}
