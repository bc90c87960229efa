//! farmem's metrics: one Prometheus text renderer ([`Exposition`]) and one scrape endpoint
//! ([`MetricsEndpoint`]), shared by the donor's and the node's `--metrics ADDR` and meant for
//! the runtime's live metrics too, so this crate depends on none of them: a server renders its
//! own figures into an [`Exposition`] and hands the endpoint a closure that does so.
//!
//! # Why hand-written, not `prometheus-client`
//! `prometheus-client` 0.26 (the Prometheus project's crate) was checked against what the
//! endpoints emit and scrapers and tests rely on; it does not fit without changing the output:
//! - histogram `le` labels are written Go-style (`5e-06`, `1e-05`) where ours are `0.000005`,
//!   `0.00001` (a tested series name: changing it breaks every dashboard built on it);
//! - floats are written shortest-round-trip, where the donor writes its uptime to 3 decimals and
//!   its service-time sum to 9;
//! - its model is a registry of its own metric types or collectors fed per scrape, where the
//!   donor counts in its own atomics (read by STATS too) and the node renders a snapshot: every
//!   family would be re-declared as a collector only to be formatted;
//! - it brings a derive macro (syn, quote) and two float/int formatting crates for what is here
//!   a hundred lines of `write!`.
//!
//! The endpoint is a tiny HTTP/1.1 responder rather than an HTTP framework for the same reason:
//! one `GET /metrics` answered per `Connection: close` connection is all a scraper needs, and no
//! farmem server has an async runtime to host a framework.
mod endpoint;
mod text;

pub use endpoint::{MetricsEndpoint, HEAD_LIMIT, SCRAPE_DEADLINE};
pub use text::{Exposition, Kind};
