//! Measures how many logins over a slow link get through a flood of unauthenticated
//! connections: `cargo run --release -p farmem-donor --example login_flood -- [FARMEM_BINARY]`
//! (default: the `farmem` built next to this example). It starts `FARMEM_BINARY donor` on
//! 127.0.0.1, floods it for 8 s with 10,000 connections/s aimed at from 127.0.0.1 …
//! 127.0.0.64 (loopback only, bounded in time and count), and meanwhile logs in with a 300 ms
//! emulated round trip from two /24s of their own (first logins) and from the flood's /24 as a
//! client that logged in before; then prints logins succeeded / tried for each. Run it with an
//! older binary and the current one to compare them on the same machine.
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;

use farmem_donor::{ChildDonorCommand, DonorStderr};
use farmem_testkit::flood::{slow_login, Flood, FloodConfig};

fn main() {
    let bin = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(farmem_testkit::bins::farmem);
    let donor = ChildDonorCommand::new(&bin)
        .args(["--capacity", "16MiB", "--slab-size", "256KiB"])
        .env("FARMEM_LOG", "error")
        .stderr(DonorStderr::Inherit)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {} donor: {e}", bin.display()));
    let addr = donor.addr();
    let rtt = Duration::from_millis(300);
    let deadline = Duration::from_secs(10);
    let returning = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 200));
    slow_login(returning, addr, 1, b"", Duration::ZERO, deadline).expect("login before the flood");
    let flood = Flood::start(FloodConfig::standard(addr, Duration::from_secs(8)));
    std::thread::sleep(Duration::from_millis(500));
    let sources = [
        (
            "first login, own /24",
            IpAddr::V4(Ipv4Addr::new(127, 0, 1, 1)),
        ),
        (
            "first login, own /24",
            IpAddr::V4(Ipv4Addr::new(127, 0, 2, 1)),
        ),
        ("returning, flood's /24", returning),
    ];
    let threads: Vec<_> = sources
        .iter()
        .enumerate()
        .map(|(k, &(what, src))| {
            std::thread::spawn(move || {
                let ok = (0..8u64)
                    .filter(|n| {
                        slow_login(src, addr, 100 + k as u64 * 100 + n, b"", rtt, deadline).is_ok()
                    })
                    .count();
                (what, src, ok, 8)
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let report = flood.stop();
    println!(
        "binary {}: flood {} connections in {:.1} s ({:.0}/s)",
        bin.display(),
        report.connections,
        report.elapsed.as_secs_f64(),
        report.connections as f64 / report.elapsed.as_secs_f64()
    );
    let (mut ok, mut tried) = (0, 0);
    for (what, src, k, n) in results {
        println!("  {src} ({what}): {k}/{n} logins succeeded");
        ok += k;
        tried += n;
    }
    println!("  total: {ok}/{tried} logins succeeded");
}
