//! The donor's default limits and timeouts, shared by the server, its connections and the
//! connection slots.

use std::time::Duration;

/// Default of [`DonorConfig::max_connections`]: most connections served at once; more are
/// answered with a "donor full" error frame and closed. Of these, `min(`[`MAX_UNAUTHENTICATED`]`,
/// max_connections / 4)` are kept for connections logging in; the rest are the authenticated
/// pool that tenants share (`slots`).
pub const MAX_CONNECTIONS: usize = 1024;
/// Refused, evicted and failed unauthenticated connections are logged in full at most
/// [`REFUSALS_LOGGED_PER_INTERVAL`] times per this interval; the rest are counted.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// See [`REFUSAL_LOG_INTERVAL`].
pub const REFUSALS_LOGGED_PER_INTERVAL: u64 = 16;
/// Default of [`DonorConfig::hello_timeout`]: how long a new connection may take, in total, to
/// complete the handshake (HELLO and AUTH) before it is closed.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(3);
/// Default of [`DonorConfig::stall_timeout`]: how long an authenticated client may pause inside
/// a request before its connection is closed.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a response may wait for a client that does not read before its connection is closed.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
