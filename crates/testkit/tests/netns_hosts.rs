//! Hosts in network namespaces with donors in them (testkit's `netns`): distinct subnets for
//! hosts made at once (in threads and in other processes), donors reachable from the root
//! namespace (by the transport and by `farmem run`), each injected failure seen as a real
//! peer sees it (a cut link: timeouts, no reset; a crash: refused; a stall: timeouts until
//! resumed; a restart: an empty store on the same address), and nothing left behind by a drop,
//! a panic or a dead process.

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use farmem_testkit::netns::{Host, HostDonor};
use farmem_testkit::run::{c_source, compile_c, counter, farmem_run, read_stats, text, Scratch};
use farmem_transport::{ClientConfig, DonorClient, PageAddr, PageWrite, TransportError};

const PAGE: usize = 4096;

fn ip_out(args: &[&str]) -> String {
    let o = Command::new("ip").args(args).output().expect("running ip");
    assert!(o.status.success(), "ip {args:?}: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Fails unless neither the namespace nor either veth end exists any more.
fn assert_gone(ns: &str, links: &[&str]) {
    let namespaces = ip_out(&["netns", "list"]);
    assert!(
        !namespaces
            .lines()
            .any(|l| l.split_whitespace().next() == Some(ns)),
        "namespace {ns} is left behind:\n{namespaces}"
    );
    let all = ip_out(&["-o", "link", "show"]);
    for link in links {
        let name = format!(": {link}");
        assert!(
            !all.lines()
                .any(|l| l.contains(&format!("{name}:")) || l.contains(&format!("{name}@"))),
            "link {link} is left behind:\n{all}"
        );
    }
}

/// A client of `d` that gives up on a request after `timeout`.
fn client(d: &HostDonor, timeout: Duration) -> DonorClient {
    let cfg = ClientConfig {
        token: Some(d.token().to_vec()),
        ..ClientConfig::default()
    };
    client_as(d, cfg, timeout)
}

/// A client of `d` with `cfg`'s identity (clients sharing it share slabs) and `timeout`.
fn client_as(d: &HostDonor, cfg: ClientConfig, timeout: Duration) -> DonorClient {
    let cfg = ClientConfig {
        connect_timeout: timeout,
        request_timeout: timeout,
        ..cfg
    };
    DonorClient::connect(&d.addr().to_string(), cfg)
        .unwrap_or_else(|e| panic!("connecting to the donor at {}: {e}", d.addr()))
}

/// Two clients of `d` sharing slabs: one patient (10 s: the steps that must succeed, on a
/// loaded machine) and one that gives up after `IMPATIENT` (the request a failure must stop).
fn patient_and_impatient(d: &HostDonor) -> (DonorClient, DonorClient) {
    let patient = client(d, Duration::from_secs(10));
    let cfg = ClientConfig {
        client_id: patient.client_id(),
        reconnect_key: patient.reconnect_key().clone(),
        token: Some(d.token().to_vec()),
        ..ClientConfig::default()
    };
    let impatient = client_as(d, cfg, IMPATIENT);
    (patient, impatient)
}

const IMPATIENT: Duration = Duration::from_secs(2);

fn page_of(v: u8) -> Vec<u8> {
    vec![v; PAGE]
}

fn write_page(c: &DonorClient, at: PageAddr, v: u8) -> Result<(), TransportError> {
    c.write_pages(&[PageWrite {
        addr: at,
        data: &page_of(v),
    }])
}

fn read_page(c: &DonorClient, at: PageAddr) -> Result<Vec<u8>, TransportError> {
    let mut out = page_of(0);
    c.read_pages(&[at], &mut out).map(|()| out)
}

/// A connect to `addr` with a `limit`, and how long it took.
fn connect(addr: SocketAddr, limit: Duration) -> (std::io::Result<TcpStream>, Duration) {
    let start = Instant::now();
    let r = TcpStream::connect_timeout(&addr, limit);
    (r, start.elapsed())
}

#[test]
fn hosts_made_at_once_in_threads_get_distinct_subnets() {
    let hosts: Vec<Host> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4).map(|_| s.spawn(Host::new)).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut ips: Vec<Ipv4Addr> = hosts.iter().flat_map(|h| [h.ip(), h.root_ip()]).collect();
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), 8, "hosts share addresses: {hosts:?}");
    let addrs = ip_out(&["-4", "-o", "addr", "show"]);
    for h in &hosts {
        assert!(
            addrs.contains(&format!("{} ", h.root_link()))
                && addrs.contains(&h.root_ip().to_string()),
            "{h:?} has no root address:\n{addrs}"
        );
        let inside = ip_out(&["-n", h.name(), "-4", "-o", "addr", "show"]);
        assert!(inside.contains(&format!("{}/30", h.ip())), "{inside}");
        assert!(
            inside.contains("127.0.0.1/8"),
            "loopback is not up in {}: {inside}",
            h.name()
        );
    }
}

/// Run by `hosts_made_at_once_in_processes_get_distinct_subnets`: holds a host, says its
/// address, and keeps it until stdin closes.
#[test]
#[ignore = "a child of hosts_made_at_once_in_processes_get_distinct_subnets"]
fn child_holds_a_host() {
    let h = Host::new();
    println!("HOST {}", h.ip());
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

#[test]
fn hosts_made_at_once_in_processes_get_distinct_subnets() {
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<_> = (0..3)
        .map(|_| {
            Command::new(&exe)
                .args(["--exact", "child_holds_a_host", "--ignored", "--nocapture"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("starting a child test process")
        })
        .collect();
    let mine = Host::new();
    let mut ips = vec![mine.ip()];
    // Each child's stdout is read to its end: a closed pipe would fail its last lines.
    let mut outs = Vec::new();
    for c in &mut children {
        let mut out = BufReader::new(c.stdout.take().unwrap()).lines();
        let ip = out
            .by_ref()
            .map_while(Result::ok)
            .find_map(|l| {
                l.strip_prefix("HOST ")
                    .map(|a| a.parse::<Ipv4Addr>().unwrap())
            })
            .expect("a child ended without a host");
        ips.push(ip);
        outs.push(out);
    }
    let mut distinct = ips.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        ips.len(),
        "processes share subnets: {ips:?}"
    );
    for (mut c, out) in children.into_iter().zip(outs) {
        drop(c.stdin.take());
        out.for_each(drop);
        assert!(c.wait().unwrap().success());
    }
}

#[test]
fn a_donor_in_a_host_serves_the_root_namespace() {
    let d = HostDonor::start("64MiB", "1MiB");
    assert_eq!(d.addr().ip(), d.host().ip());
    assert_ne!(d.addr().port(), 0);
    let c = client(&d, Duration::from_secs(5));
    let slab = c.alloc_slab().unwrap();
    let at = PageAddr { slab, page: 7 };
    write_page(&c, at, 0x5a).unwrap();
    assert_eq!(read_page(&c, at).unwrap(), page_of(0x5a));
    // The donor wants its token: a client without it is turned away.
    let anon = DonorClient::connect(&d.addr().to_string(), ClientConfig::default());
    assert!(anon.is_err(), "a client without the token was let in");
}

#[test]
fn farmem_run_pages_to_a_donor_in_a_host() {
    let d = HostDonor::start("512MiB", "4MiB");
    let dir = Scratch::new("netns-run");
    let prog = dir.path("fill_sum_free");
    compile_c(&c_source("fill_sum_free.c"), &prog, &[]);
    let stats = dir.path("stats.json");
    let o = farmem_run(
        &[
            "--local-mem",
            "32MiB",
            "--donor",
            &d.addr().to_string(),
            "--token-file",
            d.token_file().to_str().unwrap(),
            "--stats",
            stats.to_str().unwrap(),
        ],
        &[prog.to_str().unwrap(), "96", "2", "sum"],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("ok"),
        "{}",
        text(&o)
    );
    let s = read_stats(&stats);
    assert!(
        counter(&s, "remote_bytes_out") > 32 << 20,
        "pages should have gone to the donor in the host: {s}"
    );
    assert!(
        counter(&s, "remote_bytes_in") > 0,
        "pages should have come back: {s}"
    );
}

#[test]
fn a_cut_link_times_out_without_a_reset_and_heals() {
    let d = HostDonor::start("64MiB", "1MiB");
    let (c, quick) = patient_and_impatient(&d);
    let at = PageAddr {
        slab: c.alloc_slab().unwrap(),
        page: 0,
    };
    write_page(&c, at, 1).unwrap();

    d.partition();
    let (r, took) = connect(d.addr(), Duration::from_secs(2));
    let e = r.expect_err("a connect crossed a cut link");
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "not a timeout: {e}");
    assert!(
        took >= Duration::from_millis(1900),
        "gave up after {took:?}: {e}"
    );
    match read_page(&quick, at) {
        Err(TransportError::Timeout { .. }) => {}
        other => panic!("a request across a cut link should time out: {other:?}"),
    }

    d.heal_link();
    let (r, _) = connect(d.addr(), Duration::from_secs(10));
    r.expect("no connect after the link was healed");
    // The connection that was idle across the cut still works, and the page is there.
    assert_eq!(read_page(&c, at).unwrap(), page_of(1));
}

#[test]
fn a_crashed_donor_refuses_and_a_restarted_one_is_empty() {
    let mut d = HostDonor::start("64MiB", "1MiB");
    let c = client(&d, Duration::from_secs(5));
    let at = PageAddr {
        slab: c.alloc_slab().unwrap(),
        page: 0,
    };
    write_page(&c, at, 2).unwrap();
    let before = d.addr();
    let pid = d.pid().unwrap();

    d.crash();
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    let (r, took) = connect(d.addr(), Duration::from_secs(5));
    let e = r.expect_err("a crashed donor accepted a connection");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
    assert!(took < Duration::from_secs(1), "a refusal took {took:?}");
    assert!(read_page(&c, at).is_err(), "a crashed donor answered");

    d.restart();
    assert_eq!(d.addr(), before, "the restarted donor moved");
    let fresh = client(&d, Duration::from_secs(5));
    let st = fresh.stats().unwrap();
    assert_eq!(
        (st.slabs, st.used_bytes),
        (0, 0),
        "the store is not empty: {st:?}"
    );
    assert!(
        read_page(&c, at).is_err(),
        "the restarted donor handed back a page it never had"
    );
}

#[test]
fn a_stalled_donor_times_out_and_answers_once_resumed() {
    let d = HostDonor::start("64MiB", "1MiB");
    let (c, quick) = patient_and_impatient(&d);
    let at = PageAddr {
        slab: c.alloc_slab().unwrap(),
        page: 3,
    };
    write_page(&c, at, 3).unwrap();

    d.stall();
    // The kernel still completes connects for a stopped listener; nothing answers on them.
    let (r, _) = connect(d.addr(), Duration::from_secs(2));
    r.expect("the kernel should accept connects for a stalled donor");
    let start = Instant::now();
    match read_page(&quick, at) {
        Err(TransportError::Timeout { .. }) => {}
        other => panic!("a request to a stalled donor should time out: {other:?}"),
    }
    assert!(start.elapsed() >= IMPATIENT - Duration::from_millis(100));

    d.resume();
    assert_eq!(read_page(&c, at).unwrap(), page_of(3));
}

#[test]
fn dropping_a_host_donor_leaves_nothing_behind() {
    let d = HostDonor::start("64MiB", "1MiB");
    let pid = d.pid().unwrap();
    let ns = d.host().name().to_string();
    let links = [
        d.host().root_link().to_string(),
        d.host().host_link().to_string(),
    ];
    d.stall(); // a stopped donor is killed as well
    drop(d);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "donor {pid} survived"
    );
    assert_gone(&ns, &[&links[0], &links[1]]);
}

#[test]
fn a_panicking_test_leaves_nothing_behind() {
    let mut seen = None;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let d = HostDonor::start("64MiB", "1MiB");
        let h = d.host();
        seen = Some((
            h.name().to_string(),
            h.root_link().to_string(),
            h.host_link().to_string(),
            d.pid().unwrap(),
        ));
        h.partition();
        panic!("a test fails mid-way");
    }));
    assert!(r.is_err());
    let (ns, root, inner, pid) = seen.unwrap();
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "donor {pid} survived"
    );
    assert_gone(&ns, &[&root, &inner]);
}

#[test]
fn leftovers_of_dead_processes_are_removed_and_live_ones_kept() {
    // A pid that is certainly dead: a child we started and reaped.
    let mut child = Command::new("true").spawn().unwrap();
    child.wait().unwrap();
    let dead = child.id();
    let stale_ns = format!("fmt-{dead}-0");
    let stale_link = format!("fmt{dead}h0");
    let stale_peer = format!("fmt{dead}n0");
    // pid 1 lives as long as the machine: its names must survive (numbered by our pid, so
    // test processes running this at once do not collide).
    let live_ns = &format!("fmt-1-{}", std::process::id());
    ip_out(&["netns", "add", &stale_ns]);
    ip_out(&["netns", "add", live_ns]);
    ip_out(&[
        "link",
        "add",
        &stale_link,
        "type",
        "veth",
        "peer",
        "name",
        &stale_peer,
    ]);

    let h = Host::new();
    assert_gone(&stale_ns, &[&stale_link, &stale_peer]);
    let namespaces = ip_out(&["netns", "list"]);
    let kept = namespaces
        .lines()
        .any(|l| l.split_whitespace().next() == Some(live_ns));
    ip_out(&["netns", "delete", live_ns]);
    assert!(
        kept,
        "a live process's namespace was removed:\n{namespaces}"
    );
    drop(h);
}
