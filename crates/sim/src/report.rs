//! Presenting simulation rows: a fixed-width text table and an SVG plot of hit ratio against
//! cache size (hand-written SVG, no dependencies).

use std::fmt::Write as _;

use crate::sim::Row;

fn opt_us(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.0}"))
}

/// One line per row, with a header; ratios to 3 decimals, timeliness in µs of trace time.
pub fn table(rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<13} {:<6} {:>8} {:>9} {:>9} {:>6} {:>10} {:>10} {:>6} {:>6} {:>8} {:>8} {:>9} {:>8}",
        "prefetcher",
        "evict",
        "cache",
        "accesses",
        "faults",
        "hit",
        "prefetched",
        "pf_hits",
        "acc",
        "cov",
        "tl50_us",
        "tl95_us",
        "pollution",
        "amat_us"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<13} {:<6} {:>8} {:>9} {:>9} {:>6.3} {:>10} {:>10} {:>6.3} {:>6.3} {:>8} {:>8} {:>9} {:>8.2}",
            r.prefetcher,
            r.evict,
            r.cache_pages,
            r.accesses,
            r.faults,
            r.hit_ratio,
            r.prefetched,
            r.prefetch_hits,
            r.accuracy,
            r.coverage,
            opt_us(r.timeliness_p50_us),
            opt_us(r.timeliness_p95_us),
            r.pollution,
            r.amat_us
        );
    }
    s
}

const COLORS: &[&str] = &[
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf",
];

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// An SVG line chart: x = cache size (pages), y = hit ratio (0..1), one line per prefetcher
/// (and eviction policy, dashed for the second and later ones), with axes, ticks and a legend.
pub fn svg(rows: &[Row], title: &str) -> String {
    let (w, h) = (820.0f64, 480.0f64);
    let (left, right, top, bottom) = (70.0, 190.0, 40.0, 60.0);
    let (pw, ph) = (w - left - right, h - top - bottom);
    let xmax = rows.iter().map(|r| r.cache_pages).max().unwrap_or(1).max(1) as f64;
    let x = |c: u64| left + pw * (c as f64 / xmax);
    let y = |v: f64| top + ph * (1.0 - v.clamp(0.0, 1.0));

    // Series in order of first appearance.
    let mut series: Vec<(String, String)> = Vec::new();
    for r in rows {
        let key = (r.prefetcher.clone(), r.evict.clone());
        if !series.contains(&key) {
            series.push(key);
        }
    }
    let mut prefetchers: Vec<&str> = Vec::new();
    let mut evicts: Vec<&str> = Vec::new();
    for (p, e) in &series {
        if !prefetchers.contains(&p.as_str()) {
            prefetchers.push(p);
        }
        if !evicts.contains(&e.as_str()) {
            evicts.push(e);
        }
    }

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        left + pw / 2.0,
        escape(title)
    );
    // Grid and y ticks.
    for i in 0..=10 {
        let v = f64::from(i) / 10.0;
        let yy = y(v);
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#e0e0e0"/><text x="{:.1}" y="{:.1}" text-anchor="end">{v:.1}</text>"##,
            left + pw,
            left - 6.0,
            yy + 4.0
        );
    }
    // X ticks at each distinct cache size.
    let mut caches: Vec<u64> = rows.iter().map(|r| r.cache_pages).collect();
    caches.sort_unstable();
    caches.dedup();
    for &c in &caches {
        let xx = x(c);
        let _ = writeln!(
            s,
            r##"<line x1="{xx:.1}" y1="{:.1}" x2="{xx:.1}" y2="{:.1}" stroke="#000"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle">{c}</text>"##,
            top + ph,
            top + ph + 5.0,
            top + ph + 18.0
        );
    }
    // Axes and labels.
    let _ = writeln!(
        s,
        r##"<line x1="{left}" y1="{top}" x2="{left}" y2="{:.1}" stroke="#000"/><line x1="{left}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#000"/>"##,
        top + ph,
        top + ph,
        left + pw,
        top + ph
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">cache size (pages)</text>"#,
        left + pw / 2.0,
        h - 18.0
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(20 {:.1}) rotate(-90)" text-anchor="middle">hit ratio</text>"#,
        top + ph / 2.0
    );
    // Lines and legend.
    for (i, (p, e)) in series.iter().enumerate() {
        let color = COLORS[prefetchers.iter().position(|q| q == p).unwrap_or(0) % COLORS.len()];
        let dash = if evicts.iter().position(|q| q == e).unwrap_or(0) == 0 {
            ""
        } else {
            r#" stroke-dasharray="6 4""#
        };
        let mut pts: Vec<(u64, f64)> = rows
            .iter()
            .filter(|r| &r.prefetcher == p && &r.evict == e)
            .map(|r| (r.cache_pages, r.hit_ratio))
            .collect();
        pts.sort_by_key(|&(c, _)| c);
        let path: Vec<String> = pts
            .iter()
            .map(|&(c, v)| format!("{:.1},{:.1}", x(c), y(v)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="{}"/>"#,
            path.join(" ")
        );
        for &(c, v) in &pts {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"/>"#,
                x(c),
                y(v)
            );
        }
        let ly = top + 10.0 + 20.0 * i as f64;
        let lx = left + pw + 15.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}">{}</text>"#,
            lx + 24.0,
            lx + 30.0,
            ly + 4.0,
            escape(&format!("{p} / {e}"))
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(p: &str, e: &str, cache: u64, hit: f64) -> Row {
        Row {
            prefetcher: p.into(),
            evict: e.into(),
            cache_pages: cache,
            accesses: 100,
            faults: 100 - (hit * 100.0) as u64,
            hit_ratio: hit,
            prefetched: 10,
            prefetch_hits: 5,
            accuracy: 0.5,
            coverage: 0.25,
            pollution: 1,
            amat_us: 12.5,
            timeliness_p50_us: Some(3.0),
            timeliness_p95_us: None,
        }
    }

    #[test]
    fn table_has_a_header_and_one_line_per_row() {
        let t = table(&[
            row("leap", "fifo", 256, 0.9),
            row("none", "clock", 512, 0.25),
        ]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("prefetcher"));
        assert!(
            lines[1].contains("leap") && lines[1].contains("0.900") && lines[1].contains("12.50")
        );
        assert!(
            lines[2].contains("clock") && lines[2].contains("0.250") && lines[2].contains(" - ")
        );
    }

    #[test]
    fn svg_draws_one_polyline_per_series_with_points_in_cache_order() {
        let rows = vec![
            row("leap", "fifo", 512, 0.95),
            row("leap", "fifo", 256, 0.90),
            row("none", "fifo", 256, 0.0),
            row("none", "fifo", 512, 0.5),
            row("leap", "clock", 256, 0.8),
        ];
        let s = svg(&rows, "seq <test>");
        assert!(s.starts_with("<svg") && s.ends_with("</svg>\n"));
        assert_eq!(s.matches("<polyline").count(), 3);
        assert_eq!(
            s.matches("stroke-dasharray").count(),
            2,
            "clock line and its legend entry"
        );
        assert!(s.contains("seq &lt;test&gt;"));
        assert!(s.contains(">leap / fifo<") && s.contains(">none / fifo<"));
        // leap/fifo: x for 256 (half of 512) comes first; y of 0.90 is above 0.95's? no: lower.
        let leap = s
            .lines()
            .find(|l| l.contains("<polyline") && l.contains("#1f77b4") && !l.contains("dash"))
            .unwrap();
        // plot width 560 from x=70: 256 -> 350.0, 512 -> 630.0; height 380 from y=40: 0.9 -> 78.0.
        assert!(leap.contains(r#"points="350.0,78.0 630.0,59.0""#), "{leap}");
    }
}
