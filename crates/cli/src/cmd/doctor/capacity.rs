//! `farmem doctor`'s far-capacity check: what the donors given with `--donor` can hold for a
//! program, counted the way `farmem run` places pages — every far page on `--replicas` donors
//! (2 with two donors or more, as `farmem run` defaults), far slabs the size of the smallest
//! slab any donor hands out (`farmem_runtime`'s `Far::connect`) — against the far memory the
//! user expects to need (`--far-mem`).

use super::{Check, Status};
use crate::cmd::units::human_bytes;

/// What one donor that answered lends.
#[derive(Debug, Clone)]
pub(super) struct DonorFigures {
    pub addr: String,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub slab_bytes: u64,
}

impl DonorFigures {
    fn free_bytes(&self) -> u64 {
        self.capacity_bytes.saturating_sub(self.used_bytes)
    }
}

/// The name of the check's main line.
const CHECK_NAME: &str = "far capacity";

/// Slab sizes this many times apart get a note: the smallest sets every far slab's size.
const SLAB_SPREAD_NOTED: u64 = 16;

/// The "far capacity" checks for the donors that answered (`asked` were given).
pub(super) fn check(
    donors: &[DonorFigures],
    asked: usize,
    replicas: Option<u8>,
    far_mem: Option<u64>,
) -> Vec<Check> {
    let copies = usize::from(replicas.unwrap_or(if asked >= 2 { 2 } else { 1 }));
    if let Some(failed) = too_few(donors, asked, copies) {
        return vec![failed];
    }
    let mut out: Vec<Check> = donors.iter().filter_map(full).collect();
    out.extend(slab_spread(donors));
    out.push(room(donors, asked, copies, far_mem));
    out
}

/// Fewer donors than copies asked for, or none answering.
fn too_few(donors: &[DonorFigures], asked: usize, copies: usize) -> Option<Check> {
    if copies > asked {
        return Some(Check::new(
            CHECK_NAME,
            Status::Failed,
            format!(
                "--replicas {copies} needs {copies} donors, {asked} given: name more with --donor, \
                 or lower --replicas (farmem run refuses this too)"
            ),
        ));
    }
    donors.is_empty().then(|| {
        Check::new(
            CHECK_NAME,
            Status::Failed,
            format!("none of the {asked} donor(s) answered (see above)"),
        )
    })
}

/// A note for a donor with no room for a slab.
fn full(d: &DonorFigures) -> Option<Check> {
    (d.free_bytes() < d.slab_bytes).then(|| {
        Check::new(
            format!("donor {} room", d.addr),
            Status::Note,
            format!(
                "full: {} of {} used, no room for a slab of {}; it takes no new pages \
                 (raise its --capacity, or add donors)",
                human_bytes(d.used_bytes),
                human_bytes(d.capacity_bytes),
                human_bytes(d.slab_bytes)
            ),
        )
    })
}

/// A note when the donors' slab sizes are [`SLAB_SPREAD_NOTED`] times apart or more.
fn slab_spread(donors: &[DonorFigures]) -> Option<Check> {
    let smallest = donors.iter().map(|d| d.slab_bytes).min().unwrap_or(0);
    let largest = donors.iter().map(|d| d.slab_bytes).max().unwrap_or(0);
    if smallest == 0 || largest / smallest < SLAB_SPREAD_NOTED {
        return None;
    }
    let small = donors
        .iter()
        .find(|d| d.slab_bytes == smallest)
        .map_or("", |d| d.addr.as_str());
    Some(Check::new(
        "donor slab sizes",
        Status::Note,
        format!(
            "{small}'s slabs of {} set every far slab to that size ({}x more slabs to track \
             than {}): give the donors one --slab-size",
            human_bytes(smallest),
            largest / smallest,
            human_bytes(largest)
        ),
    ))
}

/// The room for far memory the donors have with `copies` copies, against `--far-mem`.
fn room(donors: &[DonorFigures], asked: usize, copies: usize, far_mem: Option<u64>) -> Check {
    let smallest = donors.iter().map(|d| d.slab_bytes).min().unwrap_or(0);
    // Each far page has `copies` copies on distinct donors: with free room f_i on each, the
    // most pages is bounded by total/copies and by what the others can pair with the largest.
    let mut free: Vec<u64> = donors.iter().map(DonorFigures::free_bytes).collect();
    free.sort_unstable();
    let room = replicated_room(&free, copies);
    let total: u64 = free.iter().sum();
    let mut detail = format!(
        "{} of {} donor(s) answer with {} free; {copies} {} of each far page: room for {} of \
         far memory (far slabs of {})",
        donors.len(),
        asked,
        human_bytes(total),
        if copies == 1 { "copy" } else { "copies" },
        human_bytes(room),
        human_bytes(smallest)
    );
    let status = match far_mem {
        Some(want) if room < want => {
            detail += &format!(
                ", less than --far-mem {}: add donors, raise their --capacity, or lower \
                 --replicas (farmem run would keep its budget only by sending the rest to a \
                 private node or --backup-file)",
                human_bytes(want)
            );
            Status::Failed
        }
        Some(want) => {
            detail += &format!(", enough for --far-mem {}", human_bytes(want));
            Status::Ok
        }
        None => Status::Ok,
    };
    Check::new(CHECK_NAME, status, detail)
}

/// Bytes of far memory `free` (each donor's free bytes) holds with `copies` copies of each
/// page on distinct donors: the largest x with sum(min(f_i, x)) >= copies * x.
fn replicated_room(free: &[u64], copies: usize) -> u64 {
    if copies == 0 || free.len() < copies {
        return 0;
    }
    let fits = |x: u64| {
        free.iter().map(|&f| u128::from(f.min(x))).sum::<u128>() >= copies as u128 * u128::from(x)
    };
    let (mut lo, mut hi) = (0u64, free.iter().sum::<u64>() / copies as u64);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;

    fn donor(addr: &str, cap_mib: u64, used_mib: u64, slab_mib: u64) -> DonorFigures {
        DonorFigures {
            addr: addr.into(),
            capacity_bytes: cap_mib << 20,
            used_bytes: used_mib << 20,
            slab_bytes: slab_mib << 20,
        }
    }

    #[test]
    fn room_with_copies_is_bounded_by_the_largest_donor() {
        let g = 1u64 << 30;
        assert_eq!(replicated_room(&[g, g, g], 2), 3 * g / 2);
        assert_eq!(replicated_room(&[g, g, g], 1), 3 * g);
        // A large donor cannot hold both copies of a page.
        assert_eq!(replicated_room(&[g, 10 * g], 2), g);
        assert_eq!(replicated_room(&[g], 2), 0);
        assert_eq!(replicated_room(&[0, 0], 2), 0);
    }

    #[test]
    fn too_little_room_fails_with_the_fix_and_enough_passes() {
        let ds = [donor("a:1", 1024, 0, 64), donor("b:1", 1024, 512, 64)];
        let c = check(&ds, 2, None, Some(1 << 30));
        let last = c.last().unwrap();
        assert_eq!(last.status, Status::Failed, "{last:?}");
        assert!(last.detail.contains("room for 512.0 MiB"), "{last:?}");
        assert!(last.detail.contains("lower --replicas"), "{last:?}");
        let c = check(&ds, 2, Some(1), Some(1 << 30));
        assert_eq!(c.last().unwrap().status, Status::Ok, "{c:?}");
    }

    #[test]
    fn full_donors_small_slabs_and_too_many_replicas_are_named() {
        let ds = [donor("a:1", 128, 128, 64), donor("b:1", 1024, 0, 1)];
        let c = check(&ds, 2, None, None);
        assert!(c
            .iter()
            .any(|x| x.name == "donor a:1 room" && x.detail.starts_with("full: 128.0 MiB")));
        assert!(c
            .iter()
            .any(|x| x.name == "donor slab sizes" && x.detail.contains("b:1's slabs of 1.0 MiB")));
        let c = check(&ds, 2, Some(3), None);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].status, Status::Failed);
        assert!(c[0].detail.contains("--replicas 3 needs 3 donors, 2 given"));
    }
}
