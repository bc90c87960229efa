//! The Prometheus text endpoint: served over HTTP, parses, and counts what happened.
mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;

use common::*;
use farmem_donor::DonorConfig;
use farmem_proto::{PageAddr, Status};

use farmem_testkit::clients::http_get;

/// Parses the text format: `name{labels} value` samples, `# HELP`/`# TYPE` comments.
fn parse(body: &str) -> HashMap<String, f64> {
    let mut samples = HashMap::new();
    let mut typed = HashMap::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
            assert!(
                ["gauge", "counter", "histogram"].contains(&kind),
                "bad type in {line:?}"
            );
            typed.insert(name.to_string(), kind.to_string());
            continue;
        }
        if line.starts_with("# HELP ") || line.is_empty() {
            continue;
        }
        let (key, value) = line.rsplit_once(' ').expect("sample has a value");
        let v: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        let name = key.split('{').next().unwrap();
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "bad metric name in {line:?}"
        );
        if let Some(labels) = key.strip_prefix(name) {
            if !labels.is_empty() {
                assert!(
                    labels.starts_with('{') && labels.ends_with('}'),
                    "bad labels in {line:?}"
                );
                for pair in labels[1..labels.len() - 1].split(',') {
                    let (k, v) = pair.split_once('=').expect("label k=v");
                    assert!(
                        !k.is_empty() && v.starts_with('"') && v.ends_with('"'),
                        "{line:?}"
                    );
                }
            }
        }
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|f| typed.get(*f).is_some_and(|t| t == "histogram"))
            })
            .unwrap_or(name);
        assert!(
            typed.contains_key(family),
            "sample before its TYPE: {line:?}"
        );
        assert!(
            samples.insert(key.to_string(), v).is_none(),
            "duplicate {key}"
        );
    }
    samples
}

#[test]
fn metrics_endpoint_serves_parseable_prometheus_text() {
    let donor = start(DonorConfig {
        metrics_listen: Some("127.0.0.1:0".into()),
        ..config()
    });
    let maddr = donor.metrics_addr().expect("metrics address");
    let mut c = Raw::hello(donor.local_addr(), 1, b"");
    let slab = c.alloc_ok();
    let p = page(1);
    assert_eq!(
        c.write(&[
            (PageAddr { slab, page: 0 }, &p),
            (PageAddr { slab, page: 1 }, &p)
        ]),
        Reply::Done
    );
    assert!(matches!(
        c.read(&[PageAddr { slab, page: 0 }]),
        Reply::Pages(_)
    ));
    assert_eq!(
        c.read(&[PageAddr { slab: 999, page: 0 }]).status(),
        Status::NoSuchSlab
    );

    // The donor counts a request after sending its reply, so the last read may be counted a
    // moment after the client has its answer: scrape until it is (seen once in six runs).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let (head, body) = loop {
        let (head, body) = http_get(maddr, "/metrics");
        let counted = parse(&body)
            .get("farmem_donor_requests_total{type=\"read_pages\"}")
            .is_some_and(|n| *n >= 2.0);
        if counted || std::time::Instant::now() > deadline {
            break (head, body);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    let m = parse(&body);
    let get = |k: &str| {
        *m.get(k)
            .unwrap_or_else(|| panic!("missing {k} in:\n{body}"))
    };
    assert_eq!(get("farmem_donor_capacity_bytes"), (16 * SLAB_BYTES) as f64);
    assert_eq!(get("farmem_donor_used_bytes"), SLAB_BYTES as f64);
    assert_eq!(get("farmem_donor_committed_bytes"), 2.0 * 4096.0);
    assert_eq!(get("farmem_donor_slabs"), 1.0);
    assert_eq!(get("farmem_donor_clients"), 1.0);
    assert_eq!(
        get("farmem_donor_requests_total{type=\"write_pages\"}"),
        1.0
    );
    assert_eq!(get("farmem_donor_requests_total{type=\"read_pages\"}"), 2.0);
    assert_eq!(get("farmem_donor_requests_total{type=\"hello\"}"), 1.0);
    assert_eq!(get("farmem_donor_requests_total{type=\"auth\"}"), 1.0);
    assert!(get("farmem_donor_bytes_in_total{type=\"write_pages\"}") > 8192.0);
    assert!(get("farmem_donor_bytes_out_total{type=\"read_pages\"}") > 4096.0);
    assert_eq!(
        get("farmem_donor_errors_total{status=\"no_such_slab\"}"),
        1.0
    );
    assert_eq!(get("farmem_donor_pages_written_total"), 2.0);
    // Histogram: cumulative, ending in +Inf == count == all requests so far.
    let mut buckets: Vec<(f64, f64)> = m
        .iter()
        .filter_map(|(k, v)| {
            let le = k
                .strip_prefix("farmem_donor_service_seconds_bucket{le=\"")?
                .strip_suffix("\"}")?;
            Some((
                if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap()
                },
                *v,
            ))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
    assert!(buckets.len() > 5);
    assert!(
        buckets.windows(2).all(|w| w[0].1 <= w[1].1),
        "buckets not cumulative"
    );
    assert_eq!(
        buckets.last().unwrap().1,
        get("farmem_donor_service_seconds_count")
    );
    // The handshake is two requests (HELLO, AUTH).
    assert_eq!(get("farmem_donor_service_seconds_count"), 6.0);
    assert!(get("farmem_donor_service_seconds_sum") > 0.0);

    let (head, _) = http_get(maddr, "/nope");
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    // The data path is unaffected by scrapes.
    assert!(matches!(c.read(&[PageAddr { slab, page: 1 }]), Reply::Pages(d) if d == p));
}

#[test]
fn a_scraper_that_dribbles_its_request_cannot_hold_the_endpoint_or_shutdown() {
    let donor = start(DonorConfig {
        metrics_listen: Some("127.0.0.1:0".into()),
        ..config()
    });
    let maddr = donor.metrics_addr().expect("metrics address");
    // The donor lives on a thread of its own, so that a hung stop cannot hang this test.
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let (stopped_tx, stopped_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = stop_rx.recv();
        let _ = stopped_tx.send(donor.stop().is_ok());
    });
    let mut slow = TcpStream::connect(maddr).unwrap();
    // One byte every 300 ms, never finishing the headers: each read is quick, the request never is.
    let dribbler = std::thread::spawn(move || {
        for b in b"GET /metrics HTTP/1.1\r\nX-Slow: "
            .iter()
            .chain(b"a".repeat(8000).iter())
        {
            if slow.write_all(std::slice::from_ref(b)).is_err() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        false
    });
    // Another scraper is served once the slow one's time is up (well within 30 s).
    let mut s = TcpStream::connect(maddr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text)
        .expect("a second scraper was not answered within 30 s while the first one dribbled");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("farmem_donor_capacity_bytes"));
    // And the donor stops, even while that scraper is connected.
    stop_tx.send(()).unwrap();
    let stopped = stopped_rx.recv_timeout(std::time::Duration::from_secs(30));
    assert_eq!(
        stopped,
        Ok(true),
        "the donor did not stop within 30 s while a scraper dribbled its request"
    );
    assert!(
        dribbler.join().unwrap(),
        "the endpoint kept reading a request dribbled for 40 minutes"
    );
}
