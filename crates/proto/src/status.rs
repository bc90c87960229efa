//! Response status codes: every response says explicitly whether it succeeded and, if not, why.

use std::fmt;

/// The outcome of a request, carried in every response header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Status {
    /// The request succeeded.
    Ok = 0,
    /// The frame's protocol version is not one the donor speaks.
    BadVersion = 1,
    /// HELLO presented a missing or wrong auth token.
    AuthFailed = 2,
    /// A request other than HELLO arrived before a successful HELLO.
    NotAuthenticated = 3,
    /// The opcode is not a known request.
    UnknownRequest = 4,
    /// The payload does not match its request's layout.
    Malformed = 5,
    /// A page batch is empty or longer than [`crate::MAX_BATCH_PAGES`].
    BatchTooLarge = 6,
    /// The slab does not exist, was freed, or belongs to another client.
    NoSuchSlab = 7,
    /// A page index lies outside its slab.
    PageOutOfRange = 8,
    /// The client's quota does not allow another slab.
    QuotaExceeded = 9,
    /// The donor has no capacity left for another slab.
    CapacityExhausted = 10,
    /// The donor failed internally (for example, it could not map memory).
    Internal = 11,
    /// The donor is shutting down.
    ShuttingDown = 12,
    /// The donor serves as many connections as it can; this one was closed.
    DonorFull = 13,
    /// The donor's host is short of memory: the donor lends no more slabs for now.
    MemoryPressure = 14,
    /// AUTH asked to attach to a client id the donor does not know (register it instead).
    UnknownClient = 15,
    /// AUTH asked to register a client id that is already registered (attach with its key).
    ClientIdTaken = 16,
}

impl Status {
    /// Every status, in code order.
    pub const ALL: [Status; 17] = [
        Status::Ok,
        Status::BadVersion,
        Status::AuthFailed,
        Status::NotAuthenticated,
        Status::UnknownRequest,
        Status::Malformed,
        Status::BatchTooLarge,
        Status::NoSuchSlab,
        Status::PageOutOfRange,
        Status::QuotaExceeded,
        Status::CapacityExhausted,
        Status::Internal,
        Status::ShuttingDown,
        Status::DonorFull,
        Status::MemoryPressure,
        Status::UnknownClient,
        Status::ClientIdTaken,
    ];

    /// The status with wire code `code`, if it is one.
    pub fn from_code(code: u16) -> Option<Status> {
        Status::ALL.get(usize::from(code)).copied()
    }

    /// The wire code.
    pub fn code(self) -> u16 {
        self as u16
    }

    /// A short, stable, lower-case name (used in logs and metrics labels).
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::BadVersion => "bad_version",
            Status::AuthFailed => "auth_failed",
            Status::NotAuthenticated => "not_authenticated",
            Status::UnknownRequest => "unknown_request",
            Status::Malformed => "malformed",
            Status::BatchTooLarge => "batch_too_large",
            Status::NoSuchSlab => "no_such_slab",
            Status::PageOutOfRange => "page_out_of_range",
            Status::QuotaExceeded => "quota_exceeded",
            Status::CapacityExhausted => "capacity_exhausted",
            Status::Internal => "internal",
            Status::ShuttingDown => "shutting_down",
            Status::DonorFull => "donor_full",
            Status::MemoryPressure => "memory_pressure",
            Status::UnknownClient => "unknown_client",
            Status::ClientIdTaken => "client_id_taken",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_unknown_codes_are_rejected() {
        for s in Status::ALL {
            assert_eq!(Status::from_code(s.code()), Some(s));
        }
        assert_eq!(Status::from_code(17), None);
        assert_eq!(Status::from_code(u16::MAX), None);
    }
}
