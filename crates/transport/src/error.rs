//! The transport's one error type: every way talking to a donor can fail, each message saying
//! what failed and what to do about it.

use std::io;
use std::time::Duration;

use farmem_proto::{EncodeError, Status};

/// Why a request to a donor failed.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The donor address could not be parsed or resolved.
    #[error("{addr:?} is not a usable donor address ({reason}): give HOST:PORT, for example 127.0.0.1:7070")]
    BadAddress {
        /// The address as given.
        addr: String,
        /// Why it could not be used.
        reason: String,
    },
    /// The TCP connection could not be established.
    #[error("could not connect to donor {addr} (check that `farmem donor` is running and listening there)")]
    Connect {
        /// The donor address.
        addr: String,
        /// The last connect error.
        #[source]
        source: io::Error,
    },
    /// The donor answered HELLO with an error status (bad token, other protocol version, …).
    #[error("{}", refused_message(addr, *status, message))]
    Refused {
        /// The donor address.
        addr: String,
        /// The status the donor answered with.
        status: Status,
        /// The donor's explanation.
        message: String,
    },
    /// The donor did not answer in time. The connection is abandoned (the requests in flight on
    /// it fail with [`TransportError::Disconnected`]); the next request reconnects.
    #[error("donor {addr} did not answer {op} within {} ms: it is stalled, overloaded or unreachable; the connection was dropped and the next request reconnects", after.as_millis())]
    Timeout {
        /// The donor address.
        addr: String,
        /// The request that timed out.
        op: &'static str,
        /// The timeout that expired.
        after: Duration,
    },
    /// The connection broke while the request was in flight (or could not be sent). The request
    /// may or may not have been executed; the next request reconnects with the same client id.
    #[error("lost the connection to donor {addr} during {op}: {reason}; the next request reconnects (retry this one)")]
    Disconnected {
        /// The donor address.
        addr: String,
        /// The request that was in flight.
        op: &'static str,
        /// What happened to the connection.
        reason: String,
    },
    /// The donor no longer knows this client (it restarted, or dropped the client after its
    /// orphan grace): every slab this client had there is gone. The client does not register
    /// again on its own — slab ids handed out afresh could collide with the ones its user still
    /// holds — so every request to that donor fails this way.
    #[error("donor {addr} no longer knows this client (it restarted, or dropped it after its orphan grace): every slab this client had there is gone")]
    Forgotten {
        /// The donor address.
        addr: String,
    },
    /// The donor executed nothing and answered with an error status.
    #[error("donor {addr} refused {op}: {status}: {message}")]
    Status {
        /// The donor address.
        addr: String,
        /// The request.
        op: &'static str,
        /// The status the donor answered with.
        status: Status,
        /// The donor's explanation.
        message: String,
    },
    /// The donor sent something that is not valid farmem protocol. The connection is dropped.
    #[error("donor {addr} broke the protocol during {op}: {detail}; is the peer a farmem donor of the same version?")]
    Protocol {
        /// The donor address.
        addr: String,
        /// The request in flight.
        op: &'static str,
        /// What was wrong.
        detail: String,
    },
    /// The request breaks a protocol limit (batch size, page size, token length); nothing was
    /// sent.
    #[error("invalid {op} request (nothing was sent)")]
    Invalid {
        /// The request.
        op: &'static str,
        /// The limit it breaks.
        #[source]
        source: EncodeError,
    },
    /// The configured auth token is empty or longer than [`farmem_proto::MAX_TOKEN_LEN`];
    /// nothing was sent.
    #[error(
        "the auth token is {len} bytes; it must be 1 to {} bytes: fix the token file",
        farmem_proto::MAX_TOKEN_LEN
    )]
    TokenLength {
        /// Its length.
        len: usize,
    },
    /// `read_pages` was given an output buffer of the wrong size; nothing was sent.
    #[error("read_pages output buffer is {got} bytes but must be exactly {expected} (4096 per page asked for)")]
    OutputBuffer {
        /// The size needed.
        expected: usize,
        /// The size given.
        got: usize,
    },
}

impl TransportError {
    /// Whether the failure is about reaching the donor (connect, timeout, lost connection)
    /// rather than about the request itself: such requests may succeed when retried.
    pub fn is_connection_failure(&self) -> bool {
        matches!(
            self,
            TransportError::Connect { .. }
                | TransportError::Timeout { .. }
                | TransportError::Disconnected { .. }
        )
    }

    /// Whether the donor lost this client's slabs ([`TransportError::Forgotten`]).
    pub fn is_forgotten(&self) -> bool {
        matches!(self, TransportError::Forgotten { .. })
    }

    /// The status the donor answered with, for [`TransportError::Refused`] and
    /// [`TransportError::Status`].
    pub fn status(&self) -> Option<Status> {
        match self {
            TransportError::Refused { status, .. } | TransportError::Status { status, .. } => {
                Some(*status)
            }
            _ => None,
        }
    }
}

fn refused_message(addr: &str, status: Status, message: &str) -> String {
    match status {
        Status::AuthFailed if message.contains("reconnect key") => format!(
            "donor {addr} refused this client's reconnect key ({message}): another client holds that client id; use a fresh ClientConfig (a new random id and key)"
        ),
        Status::AuthFailed => format!(
            "donor {addr} refused the auth token ({message}): check --token-file on both sides"
        ),
        Status::BadVersion => format!(
            "donor {addr} speaks another protocol version ({message}): run the same farmem version on both sides"
        ),
        // The donor's message says which bound: every slot taken ("donor full: …"), or this
        // client id's or tenant's connections ("tenant T has N connections, its bound …").
        Status::DonorFull => format!("donor {addr} refused the connection: {message}"),
        Status::MemoryPressure => format!("donor {addr} lends no memory now: {message}"),
        _ => format!("donor {addr} refused the connection: {status}: {message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cause_is_attached_as_source_not_repeated() {
        use std::error::Error;
        let e = TransportError::Connect {
            addr: "127.0.0.1:1".into(),
            source: io::Error::from(io::ErrorKind::ConnectionRefused),
        };
        assert!(e.to_string().contains("farmem donor"), "{e}");
        assert!(!e.to_string().contains("refused"), "{e}");
        assert!(e.source().is_some());
    }

    #[test]
    fn messages_say_what_to_do() {
        let e = TransportError::Refused {
            addr: "127.0.0.1:7070".into(),
            status: Status::AuthFailed,
            message: "bad token".into(),
        };
        let s = e.to_string();
        assert!(
            s.contains("127.0.0.1:7070") && s.contains("--token-file"),
            "{s}"
        );
        assert_eq!(e.status(), Some(Status::AuthFailed));
        assert!(!e.is_connection_failure());

        let e = TransportError::Timeout {
            addr: "127.0.0.1:1".into(),
            op: "read_pages",
            after: Duration::from_millis(250),
        };
        let s = e.to_string();
        assert!(s.contains("250 ms") && s.contains("read_pages"), "{s}");
        assert!(e.is_connection_failure());
    }
}
