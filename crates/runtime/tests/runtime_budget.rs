//! The budget changes while the runtime runs (a process tree's coordinator moves it between
//! processes): lowered, resident pages come down to it at once and the data stays; raised, the
//! program keeps more pages local.

use std::time::Duration;

use farmem_testkit::runtime::{config, start, wait_for_stats};

const MIB: usize = 1 << 20;
const PAGE: usize = 4096;

#[test]
fn a_lowered_budget_is_enforced_at_once_and_a_raised_one_is_used() {
    let rt = start(config(16 * MIB, Vec::new()));
    let region = rt.map(12 * MIB).expect("map");
    let pages = region.len() / PAGE;
    // SAFETY: the region is ours, `len` bytes long, and no other reference to it exists.
    let mem = unsafe { std::slice::from_raw_parts_mut(region.as_ptr(), region.len()) };
    for p in 0..pages {
        mem[p * PAGE] = (p % 251) as u8 + 1;
    }
    let before = rt.usage();
    assert!(before.used_pages >= pages as u64, "{before:?}");
    assert_eq!(before.evicted_pages, 0, "12 MiB fit a 16 MiB budget");

    // Lowered to 4 MiB: the evictor brings resident pages down without any fault.
    let set = rt.set_budget_pages((4 * MIB / PAGE) as u64);
    assert_eq!(set, (4 * MIB / PAGE) as u64);
    let s = wait_for_stats(
        &rt,
        Duration::from_secs(20),
        Duration::from_millis(10),
        |s| s.resident_pages <= s.budget_pages,
    );
    assert!(s.resident_pages <= s.budget_pages, "{s:?}");
    assert!(rt.usage().evicted_pages > 0, "{s:?}");
    for p in 0..pages {
        assert_eq!(mem[p * PAGE], (p % 251) as u8 + 1, "page {p}");
    }
    let fetched = rt.usage().fetched_pages;
    assert!(fetched > 0, "reading every page back fetched none");

    // Raised again: a second pass fits and fetches at most what was evicted before it.
    rt.set_budget_pages((16 * MIB / PAGE) as u64);
    for p in 0..pages {
        assert_eq!(mem[p * PAGE], (p % 251) as u8 + 1, "page {p}");
    }
    let after_first = rt.usage().fetched_pages;
    for p in 0..pages {
        assert_eq!(mem[p * PAGE], (p % 251) as u8 + 1, "page {p}");
    }
    assert_eq!(
        rt.usage().fetched_pages,
        after_first,
        "with the budget raised every page stays local"
    );
    // The least budget is 16 pages.
    assert_eq!(rt.set_budget_pages(0), 16);
}
