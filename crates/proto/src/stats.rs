//! The donor's counters as carried by the STATS response.

use crate::DecodeError;

/// A donor's counters. On the wire: `n u16` followed by `n` u64 values in field order; a decoder
/// reads the fields it knows, ignores extra trailing values (a newer donor) and leaves missing
/// ones at zero (an older donor).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DonorStats {
    /// Lendable capacity, bytes.
    pub capacity_bytes: u64,
    /// Bytes in allocated slabs.
    pub used_bytes: u64,
    /// Bytes actually committed (pages written at least once).
    pub committed_bytes: u64,
    /// Slab size, bytes.
    pub slab_size_bytes: u64,
    /// Allocated slabs.
    pub slabs: u64,
    /// Connected clients.
    pub clients: u64,
    /// Requests served since start.
    pub requests_total: u64,
    /// Requests answered with an error status since start.
    pub errors_total: u64,
    /// Pages read since start.
    pub pages_read_total: u64,
    /// Pages written since start.
    pub pages_written_total: u64,
    /// Bytes received since start.
    pub bytes_in_total: u64,
    /// Bytes sent since start.
    pub bytes_out_total: u64,
    /// Median service time of a request, nanoseconds.
    pub service_p50_ns: u64,
    /// 99th percentile service time, nanoseconds.
    pub service_p99_ns: u64,
    /// Time since the donor started, milliseconds.
    pub uptime_ms: u64,
    /// Bytes the donor wants back now (lent beyond its capacity, plus the host's shortfall
    /// below `--keep-free`); 0 when it wants nothing back.
    pub reclaim_wanted_bytes: u64,
    /// Slabs clients gave back (freed) after the donor asked for them, since start.
    pub slabs_given_back_total: u64,
}

impl DonorStats {
    /// Number of fields on the wire.
    pub const FIELDS: usize = 17;

    /// The fields in wire order.
    pub fn to_array(&self) -> [u64; Self::FIELDS] {
        [
            self.capacity_bytes,
            self.used_bytes,
            self.committed_bytes,
            self.slab_size_bytes,
            self.slabs,
            self.clients,
            self.requests_total,
            self.errors_total,
            self.pages_read_total,
            self.pages_written_total,
            self.bytes_in_total,
            self.bytes_out_total,
            self.service_p50_ns,
            self.service_p99_ns,
            self.uptime_ms,
            self.reclaim_wanted_bytes,
            self.slabs_given_back_total,
        ]
    }

    fn from_array(v: [u64; Self::FIELDS]) -> DonorStats {
        DonorStats {
            capacity_bytes: v[0],
            used_bytes: v[1],
            committed_bytes: v[2],
            slab_size_bytes: v[3],
            slabs: v[4],
            clients: v[5],
            requests_total: v[6],
            errors_total: v[7],
            pages_read_total: v[8],
            pages_written_total: v[9],
            bytes_in_total: v[10],
            bytes_out_total: v[11],
            service_p50_ns: v[12],
            service_p99_ns: v[13],
            uptime_ms: v[14],
            reclaim_wanted_bytes: v[15],
            slabs_given_back_total: v[16],
        }
    }

    /// Decodes a STATS response payload.
    pub(crate) fn decode(payload: &[u8]) -> Result<DonorStats, DecodeError> {
        let Some(b) = payload.get(..2) else {
            return Err(DecodeError::Length {
                what: "stats response",
                expected: 2,
                got: payload.len(),
            });
        };
        let n = usize::from(u16::from_le_bytes([b[0], b[1]]));
        if payload.len() != 2 + n * 8 {
            return Err(DecodeError::Length {
                what: "stats response",
                expected: 2 + n * 8,
                got: payload.len(),
            });
        }
        let mut v = [0u64; Self::FIELDS];
        for (slot, chunk) in v.iter_mut().zip(payload[2..].chunks_exact(8)) {
            *slot = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        }
        Ok(DonorStats::from_array(v))
    }
}
