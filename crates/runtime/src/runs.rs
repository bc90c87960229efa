//! Runs of neighbouring items: the evictor and the copy-and-drop path hand the kernel one range
//! per run (one MOVE, one madvise, one write-protect), each a single TLB flush.

/// Runs among `n` items in order, as (first, end) indexes: item `k` continues the run of item
/// `k - 1` when `joins(k)`. Neighbouring pages go to the kernel as one range (one MOVE, one
/// madvise, one write-protect), each a single TLB flush.
pub(crate) fn runs(n: usize, joins: impl Fn(usize) -> bool) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < n {
        let mut j = i + 1;
        while j < n && joins(j) {
            j += 1;
        }
        out.push((i, j));
        i = j;
    }
    out
}
