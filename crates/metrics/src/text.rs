//! The Prometheus text exposition format (version 0.0.4), written family by family: a server
//! states each family's name, type and help once, then its samples.
use std::fmt::{Display, Write as _};

/// A metric family's type, as its `# TYPE` line names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A value that goes up and down.
    Gauge,
    /// A count that only goes up (its name ends in `_total`, which the caller writes).
    Counter,
    /// Observations in cumulative `le` buckets, with `_sum` and `_count`.
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
            Kind::Histogram => "histogram",
        }
    }
}

/// Prometheus text being written: names, help texts and values are written as given (a server
/// picks its own formats, e.g. seconds to 3 decimals); label values are escaped.
#[derive(Debug, Default)]
pub struct Exposition {
    text: String,
}

impl Exposition {
    /// Text that starts with `farmem_build_info{component, version} 1`: every endpoint says
    /// what answers it (`donor`, `node`, `run`) and which release, so a dashboard can tell
    /// versions apart during an upgrade.
    pub fn new(component: &str) -> Exposition {
        let mut e = Exposition {
            text: String::with_capacity(4096),
        };
        e.family(
            "farmem_build_info",
            Kind::Gauge,
            "Always 1: the farmem component serving these metrics and its version.",
        );
        e.sample(
            "farmem_build_info",
            &[
                ("component", component),
                ("version", env!("CARGO_PKG_VERSION")),
            ],
            1,
        );
        e
    }

    /// Starts a family: its `# HELP` and `# TYPE` lines. Its samples follow.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let kind = kind.name();
        let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// One sample of the family started last: `name{k="v",…} value`.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl Display) {
        self.text.push_str(name);
        for (i, (k, v)) in labels.iter().enumerate() {
            let open = if i == 0 { '{' } else { ',' };
            let _ = write!(self.text, "{open}{k}=\"{}\"", label_value(v));
        }
        if !labels.is_empty() {
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {value}");
    }

    /// A family of one unlabelled sample.
    pub fn single(&mut self, name: &str, kind: Kind, help: &str, value: impl Display) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }

    /// A family whose samples differ in one label: `(label value, value)` pairs, in order.
    pub fn by_label<L: AsRef<str>, V: Display>(
        &mut self,
        name: &str,
        kind: Kind,
        help: &str,
        label: &str,
        samples: impl IntoIterator<Item = (L, V)>,
    ) {
        self.family(name, kind, help);
        for (l, v) in samples {
            self.sample(name, &[(label, l.as_ref())], v);
        }
    }

    /// A histogram family: `counts[i]` observations fell in bucket `i` (at most `bounds[i]`, not
    /// cumulated), `counts[bounds.len()]` above the last bound; `sum` is their total.
    pub fn histogram(
        &mut self,
        name: &str,
        help: &str,
        bounds: &[f64],
        counts: &[u64],
        sum: impl Display,
    ) {
        self.family(name, Kind::Histogram, help);
        let bucket = format!("{name}_bucket");
        let mut cum = 0;
        for (le, n) in bounds.iter().zip(counts) {
            cum += n;
            self.sample(&bucket, &[("le", &le.to_string())], cum);
        }
        cum += counts.get(bounds.len()).copied().unwrap_or(0);
        self.sample(&bucket, &[("le", "+Inf")], cum);
        self.sample(&format!("{name}_sum"), &[], sum);
        self.sample(&format!("{name}_count"), &[], cum);
    }

    /// The text written.
    pub fn finish(self) -> String {
        self.text
    }
}

/// A label value: backslash, double quote and newline escaped.
fn label_value(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_text_starts_with_the_build_info() {
        let t = Exposition::new("donor").finish();
        assert_eq!(
            t,
            format!(
                "# HELP farmem_build_info Always 1: the farmem component serving these metrics \
                 and its version.\n# TYPE farmem_build_info gauge\n\
                 farmem_build_info{{component=\"donor\",version=\"{}\"}} 1\n",
                env!("CARGO_PKG_VERSION")
            )
        );
    }

    #[test]
    fn families_and_samples_are_written_in_the_text_format() {
        let mut e = Exposition::default();
        e.single("a_bytes", Kind::Gauge, "Bytes.", 7);
        e.family("b_total", Kind::Counter, "Bs, by kind.");
        e.sample("b_total", &[("kind", "x"), ("pid", "42")], 3);
        e.sample(
            "b_total",
            &[("kind", "y\"\\\nz")],
            format_args!("{:.3}", 1.5),
        );
        e.by_label("c", Kind::Gauge, "Cs.", "tenant", [("t1", 1), ("t2", 2)]);
        assert_eq!(
            e.finish(),
            "# HELP a_bytes Bytes.\n# TYPE a_bytes gauge\na_bytes 7\n\
             # HELP b_total Bs, by kind.\n# TYPE b_total counter\n\
             b_total{kind=\"x\",pid=\"42\"} 3\n\
             b_total{kind=\"y\\\"\\\\\\nz\"} 1.500\n\
             # HELP c Cs.\n# TYPE c gauge\nc{tenant=\"t1\"} 1\nc{tenant=\"t2\"} 2\n"
        );
    }

    #[test]
    fn a_histogram_has_cumulative_buckets_ending_in_inf_and_its_count() {
        let mut e = Exposition::default();
        e.histogram("t_seconds", "Time.", &[5e-6, 1e-3], &[1, 0, 2], "0.5");
        assert_eq!(
            e.finish(),
            "# HELP t_seconds Time.\n# TYPE t_seconds histogram\n\
             t_seconds_bucket{le=\"0.000005\"} 1\n\
             t_seconds_bucket{le=\"0.001\"} 1\n\
             t_seconds_bucket{le=\"+Inf\"} 3\n\
             t_seconds_sum 0.5\n\
             t_seconds_count 3\n"
        );
    }
}
