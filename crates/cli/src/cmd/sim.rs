//! `farmem sim`: replays a page-access trace (recorded or generated) through prefetchers ×
//! eviction policies × cache sizes and prints one row per combination (table, JSON, SVG plot).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use farmem_policy::{evict, prefetch};
use farmem_sim::gen::{generate, GenSpec};
use farmem_sim::sim::{parse_cache, run_matrix, working_set, Latency};
use farmem_sim::{parse_pages, report, trace};

const LONG_ABOUT: &str = "\
Replays a page-access trace through prefetchers x eviction policies x cache sizes, as a cache \
simulator, and prints one row per combination.

The trace is a file (--trace; the runtime writes one with its --record-trace option) or generated \
(--gen SPEC over --wss pages, --length accesses, one access per microsecond of trace time):
  seq                    pages 0,1,2,... wrapping around the working set
  stride:K               0,K,2K,...; each pass starts one page further, so K passes touch every page
  interleave:T:K1,K2,... T threads, each with its own part of the working set and its own stride
  random                 uniform over the working set
  zipf:S                 Zipf popularity with exponent S, popular pages scattered
  phases                 four phases with strides +1, -3, +2, +7

Model: far memory holds every page of the trace; the cache starts empty; prefetched pages \
arrive before the next access (the best case for every prefetcher); timeliness is the trace \
time from a prefetch to the page's first use. AMAT = hit ratio x --hit-us + miss ratio x --miss-us.

Columns: faults; hit = hit ratio; prefetched = pages brought by the prefetcher; pf_hits = first \
uses of prefetched pages; acc = accuracy (pf_hits / prefetched); cov = coverage (pf_hits / \
(pf_hits + faults)); tl50_us, tl95_us = timeliness percentiles; pollution = prefetched pages \
evicted unused; amat_us.

Examples:
  farmem sim --gen stride:10 --cache 25%
  farmem sim --gen interleave:4:3,5,7,11 --prefetch leap,leap-process --json
  farmem sim --trace app.fmtrace --cache 1GiB,2GiB --plot hit.svg";

/// Simulate prefetchers and eviction policies on a page-access trace.
#[derive(clap::Args, Debug)]
#[command(after_long_help = LONG_ABOUT)]
pub struct SimArgs {
    /// Trace file to replay (farmem trace format).
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with = "gen",
        required_unless_present = "gen"
    )]
    trace: Option<PathBuf>,
    /// Generate the trace: seq, stride:K, interleave:T:K1,K2,..., random, zipf:S, phases.
    #[arg(long, value_name = "SPEC")]
    gen: Option<String>,
    /// Working set of the generated trace: pages (16384) or a size (64MiB). Default 16384 pages.
    #[arg(long, value_name = "PAGES_OR_SIZE")]
    wss: Option<String>,
    /// Accesses in the generated trace. Default 200000.
    #[arg(long, value_name = "N")]
    length: Option<u64>,
    /// Seed of the generated trace's random choices. Default 1.
    #[arg(long)]
    seed: Option<u64>,
    /// Prefetchers to compare, comma separated (default: all of leap, leap-process, leap-rows,
    /// none, next-n, stride, readahead).
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    prefetch: Vec<String>,
    /// Eviction policies, comma separated (default: all of fifo, clock, refault; each with Leap's eager
    /// eviction of prefetched pages).
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    evict: Vec<String>,
    /// Cache sizes, comma separated: a percentage of the working set (25%), pages (4096) or a
    /// size (16MiB).
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "SIZES",
        default_value = "10%,25%,50%,75%"
    )]
    cache: Vec<String>,
    /// Cost of an access served locally, µs (for the AMAT).
    #[arg(long, default_value_t = 0.1, value_name = "US")]
    hit_us: f64,
    /// Cost of an access that faults to far memory, µs (for the AMAT).
    #[arg(long, default_value_t = 35.0, value_name = "US")]
    miss_us: f64,
    /// Print the rows as a JSON list (keys: prefetcher, evict, cache_pages, accesses, faults,
    /// hit_ratio, prefetched, prefetch_hits, accuracy, coverage, pollution, amat_us).
    #[arg(long)]
    json: bool,
    /// Also draw hit ratio against cache size, one line per prefetcher, to this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Save the generated trace to this file (farmem trace format).
    #[arg(long, value_name = "FILE")]
    save_trace: Option<PathBuf>,
}

fn names(given: &[String], all: &[&str], kind: &str) -> anyhow::Result<Vec<String>> {
    if given.is_empty() {
        return Ok(all.iter().map(|s| s.to_string()).collect());
    }
    let mut out: Vec<String> = Vec::new();
    for n in given {
        let n = n.trim();
        if !all.contains(&n) {
            bail!("unknown {kind} {n:?}: choose among {}", all.join(", "));
        }
        if !out.iter().any(|o| o == n) {
            out.push(n.to_string());
        }
    }
    Ok(out)
}

/// Runs `farmem sim`.
pub fn run(args: SimArgs) -> anyhow::Result<ExitCode> {
    check_args(&args)?;
    let seed = args.seed.unwrap_or(1);
    let prefetchers = names(&args.prefetch, prefetch::NAMES, "prefetcher")?;
    let evicts = names(&args.evict, evict::NAMES, "eviction policy")?;
    let (records, source) = records(&args, seed)?;
    if records.is_empty() {
        bail!("the trace has no accesses: nothing to simulate");
    }
    let wss_pages = working_set(&records).len() as u64;
    let mut caches = Vec::with_capacity(args.cache.len());
    for c in &args.cache {
        let pages = parse_cache(c, wss_pages)?;
        if !caches.contains(&pages) {
            caches.push(pages);
        }
    }
    let latency = Latency {
        hit_us: args.hit_us,
        miss_us: args.miss_us,
    };
    let rows = run_matrix(&records, &prefetchers, &evicts, &caches, latency)?;

    if let Some(path) = &args.plot {
        let title = format!("hit ratio vs cache size: {source}");
        let svg = report::svg(&rows, &title);
        farmem_fds::files::replace(path, |w| w.write_all(svg.as_bytes()))
            .with_context(|| format!("cannot write the plot to {}", path.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        println!(
            "{source}: {} accesses, working set {wss_pages} pages; hit {} µs, miss {} µs",
            records.len(),
            args.hit_us,
            args.miss_us
        );
        print!("{}", report::table(&rows));
    }
    Ok(ExitCode::SUCCESS)
}

/// The latencies, and no generator flag with `--trace`.
fn check_args(args: &SimArgs) -> anyhow::Result<()> {
    if !(args.hit_us >= 0.0
        && args.miss_us >= 0.0
        && args.hit_us.is_finite()
        && args.miss_us.is_finite())
    {
        bail!("--hit-us and --miss-us must be finite and ≥ 0");
    }
    if args.trace.is_some() {
        for (given, flag) in [
            (args.wss.is_some(), "--wss"),
            (args.length.is_some(), "--length"),
            (args.seed.is_some(), "--seed"),
            (args.save_trace.is_some(), "--save-trace"),
        ] {
            if given {
                bail!("{flag} applies to a generated trace (--gen), not to --trace");
            }
        }
    }
    Ok(())
}

/// The accesses to simulate, read (`--trace`) or generated (`--gen`, saved with
/// `--save-trace`), and where they come from in words.
fn records(args: &SimArgs, seed: u64) -> anyhow::Result<(Vec<trace::Record>, String)> {
    Ok(match (&args.trace, &args.gen) {
        (Some(path), _) => {
            let recs = trace::read_trace(path)
                .with_context(|| format!("cannot use {} as a trace", path.display()))?;
            (recs, format!("trace {}", path.display()))
        }
        (None, Some(spec)) => {
            let gen = GenSpec::parse(spec)?;
            let wss = parse_pages(args.wss.as_deref().unwrap_or("16384")).context("--wss")?;
            let length = args.length.unwrap_or(200_000);
            if length == 0 {
                bail!("--length must be at least 1 access");
            }
            let recs = generate(&gen, wss, length, seed)?;
            if let Some(path) = &args.save_trace {
                trace::write_trace(path, &recs)
                    .with_context(|| format!("cannot save the trace to {}", path.display()))?;
            }
            (recs, format!("--gen {spec} over {wss} pages, seed {seed}"))
        }
        (None, None) => bail!("give a trace with --trace FILE or generate one with --gen SPEC"),
    })
}
