//! Serving a never-written page: a zero page on a read, a zeroed page on a write, and the
//! first-touch readahead that maps the never-written pages after it at once.

use farmem_uffd::UffdError;

use crate::pages::PageState;
use crate::prefetch::addr_of;
use crate::shared::{Shared, State};
use crate::stats::FaultKind;
use crate::sync::MutexGuard;
use farmem_proto::PAGE_SIZE;

use super::{FaultMsg, Queues};

/// A never-written page: a zero page (read) or a zeroed copy (write).
pub(super) fn serve_zero(
    sh: &Shared,
    mut st: MutexGuard<'_, State>,
    msg: FaultMsg,
    q: &mut Queues,
) {
    let r = if msg.write {
        sh.uffd.copy(msg.addr, &sh.zero, false, false)
    } else {
        sh.uffd.zeropage(msg.addr, PAGE_SIZE, false)
    };
    let r = match r {
        // A page is there although the table says none: one the program released, whose zap
        // the kernel has still to apply (its REMOVE is read; threads/events.rs). Its contents
        // are from before the release: taken out, and the zero page installed after all.
        Err(UffdError::Exists { .. }) => match take_out_unknown(sh, msg.addr) {
            true if msg.write => sh.uffd.copy(msg.addr, &sh.zero, false, false),
            true => sh.uffd.zeropage(msg.addr, PAGE_SIZE, false),
            false => r,
        },
        r => r,
    };
    match r {
        Ok(()) | Err(UffdError::Exists { .. }) => {
            st.pages.install_zero(msg.addr);
            if msg.write {
                zero_ahead(sh, &mut st, &msg, q);
            }
            sh.kick_evictor(&st);
            drop(st);
            sh.count_fault(FaultKind::Zero, msg.t0);
        }
        Err(UffdError::Again { .. }) => q.retry.push_back(msg),
        Err(err) => {
            drop(st);
            tracing::debug!("zero fault at {:#x}: {err}", msg.addr);
            let _ = sh.uffd.wake(msg.addr, PAGE_SIZE);
        }
    }
}

/// Takes out the page found at `addr` where the table has none; false if it could not be.
fn take_out_unknown(sh: &Shared, addr: usize) -> bool {
    match crate::mm::take_out_region_page(&sh.pool_uffd, &sh.pool, addr) {
        Ok(_) => {
            sh.stats.lock().s.released_pages_taken_out += 1;
            true
        }
        Err(e) => {
            tracing::warn!(
                "page {addr:#x}, released by the program, is still mapped and could not be \
                 taken out ({e}); it may keep its contents from before the release"
            );
            false
        }
    }
}

/// First-touch readahead ([`FirstTouch`]): after a write fault on a never-written page, maps
/// the never-written pages after it as zeroed, writable pages in one UFFDIO_COPY when the
/// thread is filling fresh memory in order, so its next writes take no fault. Only up to the
/// first page that is not `Empty` and below the evictor's high watermark; the pages count as
/// written (`ResidentDirty`: the program may write them without a fault), and one evicted
/// untouched is found all zero and dropped.
fn zero_ahead(sh: &Shared, st: &mut State, msg: &FaultMsg, q: &mut Queues) {
    if st.paused {
        return; // eviction is paused (fork): take no more room than asked for
    }
    let page = (msg.addr / PAGE_SIZE) as u64;
    let ahead = q.first_touch.on_first_touch(page, msg.thread);
    let ahead_len = (ahead.end - ahead.start) as usize;
    let room = sh.budget.high_water().saturating_sub(st.pages.resident());
    let mut n = 0usize;
    for p in ahead.take(room as usize) {
        let Some(a) = addr_of(p) else {
            break;
        };
        if st.pages.get(a).map(|e| e.state) != Some(PageState::Empty) || st.drops.contains(a) {
            break;
        }
        n += 1;
    }
    if n < ahead_len {
        q.first_touch.mapped_until(msg.thread, page + 1 + n as u64);
    }
    if n == 0 {
        return;
    }
    let start = msg.addr + PAGE_SIZE;
    let done = match sh.uffd.copy(start, &q.zeros[..n * PAGE_SIZE], false, false) {
        Ok(()) => n,
        Err(UffdError::Again { done_bytes, .. }) => done_bytes / PAGE_SIZE,
        Err(_) => 0,
    };
    for i in 0..done {
        st.pages.install_zero(start + i * PAGE_SIZE);
    }
    if done < n {
        q.first_touch
            .mapped_until(msg.thread, page + 1 + done as u64);
    }
    if done > 0 {
        sh.stats.lock().s.zero_installed_ahead += done as u64;
    }
}
