/*
 * farmem's page state machine and the protocol between the fault, evict, send, prefetch and
 * release paths, with the kernel's side of userfaultfd, for the spin model checker
 * (docs/decisions/0067-page-state-model-checked-with-spin.md). Checked by
 * crates/runtime/tests/page_model.rs:
 *
 *   spin -a [-DMACRO...] pages.pml && gcc -O2 -DSAFETY -DCOLLAPSE -o pan pan.c && ./pan -m200000
 *
 * Each step names the function of crates/runtime/src it stands for (file:function).
 *
 * Granularity. A critical section of the state lock (`Shared::state`) is one atomic step: each
 * holds at most one action the program or the kernel can see (one ioctl), and everything else
 * it touches is only touched under the lock (a Lipton reduction: taking the lock moves right,
 * letting it go moves left). A section the real code splits (a condvar wait, or a lock let go
 * and taken again) is split here too. Each ioctl is one step: its checks and its effect are
 * atomic in the kernel (mfill_atomic and move_pages hold ctx->map_changing_lock for read
 * throughout; userfaultfd_remove takes it for write to raise mmap_changing, kernel >= 6.8). A
 * CPU access of the program is one step. One section holds two: fault/zero.rs:serve_zero's
 * take-out (a MOVE) and its second install. Between them only the pending zap (a no-op on
 * the absent page: the same state as zapping before the serve) or a fault of the program on
 * the absent page (woken by the install and served later as served: the same as its access
 * after the install, but for a wake with no one waiting) could come; one Releaser raises no
 * other REMOVE meanwhile.
 *
 * Pages: 2 pages of one registered region; page p owns pool slot p (the slot allocator is not
 * modelled; its reuse rule is: a slot released stale is discarded before reuse). Far pages: 2
 * numbers handed out and reused (slabs/farpages.rs: FarPages::alloc/free), with a donor copy
 * each.
 *
 * Properties:
 *  (a) every value the program reads is the last it wrote, or zero once a DONTNEED of the
 *      page has begun (assertion in Prog);
 *  (b) a page the table calls resident is mapped, unless a REMOVE for it is not yet handled
 *      or it is zeroed (a zap still to come may take it: released_late below) (the Monitor
 *      process), and no fault meets a resident page that is not zeroed and not mapped
 *      (fault/mod.rs:serve_served -> state_lost, ResidentNotMapped, SIGBUS: asserted);
 *  (c) no thread is left blocked: a fault is always woken (spin's invalid end states: every
 *      process but the program's ends only at an `end` label, idle).
 *
 * Configurations (-D...), and what spin finds (tests/page_model.rs):
 *  NO_RELEASE      no thread of the program calls madvise(MADV_DONTNEED): the fault, evict,
 *                  send and prefetch protocol alone. No error.
 *  (default)       another thread releases one page with MADV_DONTNEED at any moment, with
 *                  the runtime's release fix (below) and assumption A1. No error (20 million
 *                  states; the test checks OPS=2, 2 million, to stay fast).
 *  RELEASE_APART   as the default, but no thread touches the page being released while its
 *                  madvise runs (a well-behaved program). No error, with or without A1.
 *  NO_PREFETCH     leaves the prefetch thread out. No error, with RELEASE_APART or not.
 *  READER          adds a second program thread that only reads (two faults on one page).
 *                  With NO_PREFETCH and OPS=1: no error. With OPS=3 spin meets an invalid
 *                  end state that is the model's bound, not the runtime's: duplicate fault
 *                  messages (a thread woken while its message is queued faults again) fill
 *                  the 4 places of `retry` (Queues::retry is unbounded) while mmap_changing
 *                  stays raised (the madvise thread not run since its REMOVE was read) and
 *                  every COPY fails EAGAIN. Larger queues or bounds do not finish in minutes.
 *  NO_A1           drops assumption A1 (below): shows what it rules out.
 * Smaller bounds for a larger configuration: OPS, MAXEV, MAXPF (macros below).
 *
 * The release fix (the runtime's; decision 0069). madvise lets the kernel zap the range once
 * its REMOVE is read; the runtime releases the page when it handles the event:
 *  - nothing installed between the read and the handling: the fault loop handles a batch's
 *    non-fault events first, then its faults (fault/rounds.rs:run: two passes, with
 *    FaultWorld::releases_handled between them); the fault thread reads under the read gate
 *    and, still under it, sets removes_unhandled if the batch holds a REMOVE
 *    (fault/mod.rs:read_events), cleared after the first pass (FaultThread::releases_handled);
 *    every install by another thread runs under the gate and is refused with EAGAIN while it
 *    is set (shared.rs:Shared::install_gated; here the prefetch thread's arrive_awaited and
 *    keep; fork/back.rs:bring_back is not modelled), and takes its EAGAIN path;
 *  - a page met where the table has none is one whose zap is pending: a zero install that
 *    fails EEXIST takes it out with a MOVE onto the pool's trash page (no event) and installs
 *    the zero page after all (fault/zero.rs:serve_zero -> take_out_unknown ->
 *    mm.rs:take_out_region_page);
 *  - late zap tolerated: a zero install marks the entry zeroed (pages/mod.rs:install_zero;
 *    kept while resident or Evicting, cleared by every other transition); a zeroed page
 *    found resident but not mapped is released (threads/events.rs:released_late), by a fault
 *    (fault/mod.rs:serve_served: then served again from q.retry, as a zero page) or by the
 *    evictor's commit of a MOVE that failed with ENOENT (evict/commit.rs:gone_released: its
 *    eviction settled, instead of commit_refused);
 *  - a release disowns its prefetch in flight (shared.rs:State::settle_released ->
 *    prefetch/mod.rs:Prefetch::released, for a released page that had a far page): the
 *    flight's far page becomes none and, if no fault waits on it, it is consumed;
 *    threads/prefetch.rs:arrive passes the flight's far page to arrive_awaited, so a waiting
 *    fault is woken to fault again and the copy is dropped.
 *
 * Assumptions on timing (the only ones besides the granularity above):
 *  A1  the evictor does not pick a page whose REMOVE has been read and whose zap is still to
 *      come (ghost condition in Evictor: !(rmread[p] && releasing[p])). Once its REMOVE is
 *      read the madvise thread is runnable in the kernel and zaps next. Without A1 (NO_A1)
 *      a zero page installed after the handling (for an access racing the madvise) can be
 *      evicted (no longer zeroed) before the zap: brought back (pool, fetch or prefetch)
 *      before the zap, the zap takes it: resident, not zeroed, not mapped (b: loud,
 *      ResidentNotMapped and SIGBUS); or written and evicted before the zap, which then misses
 *      it: the program reads, after its madvise returned, a value it wrote while the madvise
 *      ran (a: silent; only a program writing a page while it releases it can see it). Both
 *      need the madvise caller descheduled across an eviction (and a fetch) of the page. A
 *      program that does not touch a page while it releases it (RELEASE_APART) needs no A1.
 *
 * Bugs that can be switched on, each one edit away from the real code:
 *  BUG_NO_RELEASE_FIX       the runtime before decision 0069: one pass over a batch in order,
 *                           no read gate, no zeroed flag and no late release, no take-out on
 *                           EEXIST, no disowned prefetch. The default configuration finds a
 *                           fault served as a zero page after the release is handled and
 *                           before the zap (b); RELEASE_APART a prefetched page installed
 *                           before the release is handled surviving it (a).
 *  BUG_PREFETCH_ABA         only Prefetch::released left out: a prefetch issued before a
 *                           release arrives after the page was written, evicted to the same
 *                           (reused) far page and reclaimed, and installs the old data (a).
 *  BUG_ACK_ANY_GEN          the sender's acknowledgement ignores the staging generation
 *                           (pages/mod.rs:mark_sent): an older send marks a newer dirty
 *                           eviction sent; its data is lost once the slot is reclaimed.
 *  BUG_NO_WAIT_FOR_COMMIT   a fault on a page being evicted does not wait for the commit
 *                           (fault/mod.rs:wait_for_commit) and takes it for served: the MOVE
 *                           has taken the page, and the fault is failed as state lost (b);
 *                           or, for a zeroed page, released late (serve_served): the eviction
 *                           is dropped at its commit and the write the page held is lost (a).
 *  BUG_PREFETCH_NO_RECHECK  the prefetch thread keeps an arrived page without checking that
 *                           the entry is still Remote with the same far page
 *                           (threads/prefetch.rs:arrive): only a release changes such an
 *                           entry, and the release also disowns the flight: no error (the
 *                           recheck is a second defence).
 */

#ifndef OPS
#define OPS 3          /* accesses by the program thread */
#endif
#ifndef MAXEV
#define MAXEV 2        /* evictions (bounds the staging generations: they never wrap) */
#endif
#ifndef MAXPF
#define MAXPF 1        /* prefetch requests */
#endif

/* pages/state.rs: PageState */
#define EMPTY    0
#define RCLEAN   1
#define RDIRTY   2
#define RSEND    3
#define EVICTING 4
#define PUNSENT  5
#define PSENT    6
#define REMOTE   7
#define FETCHING 8
#define resident(s) ((s) == RCLEAN || (s) == RDIRTY || (s) == RSEND)
#define inpool(s)   ((s) == PUNSENT || (s) == PSENT)

mtype = { FAULT, WPFAULT, REMOVE };

/* ---- the runtime's page table (pages/state.rs: Entry), under the state lock ---- */
byte st[2];            /* Entry::state */
byte gen[2];           /* Entry::gen (PoolUnsent, ResidentSending) */
byte fid[2];           /* Entry::far: 0 = NO_FAR, else 1 or 2 */
bit  farused[3];       /* FarPages: far page numbers handed out */
byte sgen;             /* State::stage_gen */
bit  zeroed[2];        /* Entry::zeroed: resident since a zero install (kept while resident or
                        * Evicting) */
bit  rmunh;            /* Shared::removes_unhandled: a REMOVE read and not handled (set and read
                        * under Shared::read_gate) */

/* ---- the kernel ---- */
bit  pte[2];           /* the region's page table entry is present */
bit  wp[2];            /* its uffd-wp bit */
byte val[2];           /* the page's contents while present */
bit  slotp[2];         /* pool slot p holds a page */
byte slotv[2];         /* its contents */
byte changing;         /* the region userfaultfd's mmap_changing (REMOVE events not yet read) */
chan uq = [4] of { mtype, byte, bit };   /* the region userfaultfd's messages, in order */
bit  rmread[2];        /* the REMOVE event of the madvise in progress was read */

/* ---- donors ---- */
byte farv[3];          /* the donor copy of each far page */

/* ---- the prefetcher's in-flight table (prefetch/mod.rs: in_flight) ---- */
bit  pfl[2];           /* a request is in flight */
byte pffar[2];         /* its far page */
bit  pfcons[2];        /* consumed by a demand fault (prefetch/faults.rs:on_remote_fault) */
bit  pfwait[2];        /* a fault waits for it (prefetch/faults.rs:wait_for_prefetch) */

/* ---- the staging queue (State::staging): page, gen, far page, data ---- */
chan staged = [MAXEV] of { byte, byte, byte, byte };

/* ---- ghost state for the properties ---- */
byte logical[2];       /* what the program's memory holds: the last write, or 0 after a zap */
bit  releasing[2];     /* a DONTNEED of the page has begun and not finished */
bit  rmpending[2];     /* its REMOVE is queued or read but not yet handled by the runtime */
byte waitp = 255;      /* the page the program thread sleeps on in the kernel (255: none) */
#ifdef READER
byte waitr = 255;      /* the page the reader thread sleeps on */
#define waitr_not(p) (waitr != p)
#else
#define waitr_not(p) 1
#endif

/* The release fix (decision 0069), unless BUG_NO_RELEASE_FIX: a zero install marks the
 * entry zeroed (pages/mod.rs:install_zero); the read gate; the take-out on EEXIST; the
 * disowned prefetch (ABA_FIX, unless BUG_PREFETCH_ABA too). */
#ifdef BUG_NO_RELEASE_FIX
#define RELEASE_FIX 0
#define mark_zeroed(p) skip
#else
#define RELEASE_FIX 1
#define mark_zeroed(p) zeroed[p] = 1
#endif
#if defined(BUG_NO_RELEASE_FIX) || defined(BUG_PREFETCH_ABA)
#define ABA_FIX 0
#else
#define ABA_FIX 1
#endif

/* pages.release_range + State::settle_released for one page: its slot (slots.release_stale)
 * and far page (far_pages.free) freed, the entry Empty; for a page that had a far page,
 * Prefetch::released: the flight in flight stands for no far page, and is consumed unless a
 * fault waits on it */
inline release_page(p) {
  if :: inpool(st[p]) -> slotp[p] = 0 :: else -> skip fi;
  if
  :: fid[p] != 0 ->
     if
     :: ABA_FIX && pfl[p] ->
        pffar[p] = 0;
        if :: !pfcons[p] && !pfwait[p] -> pfcons[p] = 1 :: else -> skip fi
     :: else -> skip
     fi;
     farused[fid[p]] = 0
  :: else -> skip
  fi;
  st[p] = EMPTY; fid[p] = 0; gen[p] = 0; zeroed[p] = 0
}

/* RELEASE_APART: no thread touches a page while another releases it */
#ifdef RELEASE_APART
#define apart(p) (!releasing[p])
#else
#define apart(p) 1
#endif

/* the program's view: the last write, or zero once a DONTNEED has begun */
#define readable(p) (val[p] == logical[p] || (releasing[p] && val[p] == 0))

/* UFFDIO_WAKE, or the wake a COPY/ZEROPAGE/WRITEPROTECT without DONTWAKE does */
inline wake(p) {
  if :: waitp == p -> waitp = 255 :: else -> skip fi;
#ifdef READER
  if :: waitr == p -> waitr = 255 :: else -> skip fi;
#endif
  skip
}

/* slabs/farpages.rs: FarPages::alloc (any free number: the free list is LIFO, so a page
 * released and evicted again gets its old number back) */
inline far_alloc(p) {
  if
  :: !farused[1] -> farused[1] = 1; fid[p] = 1
  :: !farused[2] -> farused[2] = 1; fid[p] = 2
  fi
}

/* ================= the program ================= */

/* A thread of the program touching its memory: the CPU's access, or a userfaultfd fault that
 * queues a message and sleeps until woken (kernel: handle_userfault). Writes i at step i. */
proctype Prog() {
  byte i = 1, p;
  bit w;
  do
  :: i > OPS -> break
  :: i <= OPS ->
     if :: p = 0 :: p = 1 fi;
     if :: w = 0 :: w = 1 fi;
     do
     :: atomic { apart(p) && pte[p] && !(w && wp[p]) ->
          if
          :: w -> val[p] = i; logical[p] = i
          :: !w -> assert(readable(p))                     /* (a) */
          fi;
          break }
     :: atomic { apart(p) && !pte[p] -> waitp = p; uq!FAULT,p,w }; (waitp == 255)
     :: atomic { apart(p) && pte[p] && w && wp[p] -> waitp = p; uq!WPFAULT,p,w }; (waitp == 255)
     od;
     i++
  od
}

#ifdef READER
/* A second thread that only reads one page. */
proctype Reader() {
  byte p;
  if :: p = 0 :: p = 1 fi;
  do
  :: atomic { apart(p) && pte[p] -> assert(readable(p)); break }
  :: atomic { apart(p) && !pte[p] -> waitr = p; uq!FAULT,p,0 }; (waitr == 255)
  od
}
#endif

/* Another thread's madvise(MADV_DONTNEED) of one page (kernel: madvise_dontneed_free): REMOVE
 * queued and mmap_changing raised (userfaultfd_remove); the thread sleeps until the event is
 * read (userfaultfd_event_wait_completion), lowers mmap_changing, then zaps the page table
 * (madvise_dontneed_single_vma) and returns. */
proctype Releaser() {
  byte p;
  if :: p = 0 :: p = 1 fi;
  atomic {
#ifdef RELEASE_APART
    waitp != p && waitr_not(p) ->   /* not while a thread faults on it */
#endif
    releasing[p] = 1; rmpending[p] = 1; rmread[p] = 0; changing++; uq!REMOVE,p,0
  };
  rmread[p] == 1;
  changing--;
  atomic { pte[p] = 0; wp[p] = 0; val[p] = 0; logical[p] = 0; releasing[p] = 0 }
}

/* ================= the kernel's ioctls (r: the result) ================= */
#define OK     0
#define EAGAIN 1
#define EEXIST 2
#define ENOENT 3

/* UFFDIO_COPY (|WP) or UFFDIO_ZEROPAGE on the region's userfaultfd; wakes the page's waiters */
inline uffd_copy(p, data, wpbit) {
  if
  :: changing > 0 -> r = EAGAIN
  :: changing == 0 && pte[p] -> r = EEXIST
  :: changing == 0 && !pte[p] -> pte[p] = 1; val[p] = data; wp[p] = wpbit; r = OK; wake(p)
  fi
}

/* shared.rs:Shared::install_gated around a UFFDIO_COPY by a thread other than the fault
 * thread: EAGAIN while a REMOVE read is not handled */
inline gated_copy(p, data, wpbit) {
  if
  :: RELEASE_FIX && rmunh -> r = EAGAIN
  :: !(RELEASE_FIX && rmunh) -> uffd_copy(p, data, wpbit)
  fi
}

/* UFFDIO_MOVE slot -> region on the region's userfaultfd (crate::mm::move_from_pool) */
inline uffd_move_back(p) {
  if
  :: changing > 0 -> r = EAGAIN
  :: changing == 0 && pte[p] -> r = EEXIST
  :: changing == 0 && !pte[p] && !slotp[p] -> r = ENOENT
  :: changing == 0 && !pte[p] && slotp[p] ->
     pte[p] = 1; val[p] = slotv[p]; wp[p] = 0; slotp[p] = 0; r = OK
  fi
}

/* ================= the fault thread (fault/mod.rs, fault/rounds.rs) ================= */

/* Each serve_* below runs inside serve's critical section. */

/* fault/zero.rs:serve_zero: ZEROPAGE for a read, a COPY of zeros for a write */
inline serve_zero(p, w) {
  uffd_copy(p, 0, 0);
  if
  :: RELEASE_FIX && r == EEXIST ->
     /* a page where the table has none: one whose zap is pending (take_out_unknown ->
      * mm.rs:take_out_region_page: UFFDIO_MOVE onto the pool's trash page, on the pool's
      * userfaultfd, no event), then the zero page after all */
     pte[p] = 0; wp[p] = 0;
     uffd_copy(p, 0, 0)
  :: else -> skip
  fi;
  if
  :: r == EAGAIN -> retry!p,w,0                            /* q.retry */
  :: r == OK || r == EEXIST ->                             /* install_zero (no wake on EEXIST) */
     st[p] = RDIRTY; mark_zeroed(p)
  fi
}

/* fault/mod.rs:serve_served: another fault on the page served it, or its install will wake */
inline serve_served(p, w) {
  if
  :: st[p] == FETCHING -> skip
  :: st[p] != FETCHING && !pte[p] && RELEASE_FIX && zeroed[p] ->
     /* mincore: absent, after a zero install: a release the kernel applied after its event
      * was handled took it (threads/events.rs:released_late): released, and the fault
      * served again (q.retry), as a zero page */
     release_page(p);
     retry!p,w,0
  :: else ->
     /* mincore: a resident page not mapped is lost (state_lost: ResidentNotMapped, SIGBUS) */
     assert(pte[p]);                                       /* (b) */
     wake(p)
  fi
}

/* fault/mod.rs:serve_from_pool: a read fault COPYs the slot back write-protected, a write
 * fault MOVEs it back (DONTWAKE, then WAKE) */
inline serve_from_pool(p, w) {
  if
  :: !w -> uffd_copy(p, slotv[p], 1)
  :: w -> uffd_move_back(p)
  fi;
  if
  :: r == EAGAIN -> retry!p,w,0
  :: r == EEXIST -> wake(p)
  :: r == ENOENT -> assert(false)                          /* ThreadError::MoveBack */
  :: r == OK && !w ->
     slotp[p] = 0;                                         /* slots.release_stale */
     if :: st[p] == PSENT -> st[p] = RCLEAN :: else -> st[p] = RSEND fi   /* install_from_pool */
  :: r == OK && w -> wake(p); st[p] = RDIRTY
  fi
}

/* fault/mod.rs:serve_remote: wait for the prefetch in flight, else a demand read (the lock
 * is let go once it is submitted, and taken again for pf.on_remote_fault: orf) */
inline serve_remote(p, w) {
  st[p] = FETCHING;                                        /* pages.begin_fetch */
  if
  :: pfl[p] && !pfcons[p] && !pfwait[p] && pffar[p] == fid[p] ->
     pfwait[p] = 1                                         /* pf.wait_for_prefetch */
  :: else -> fetches!p,w,fid[p]; orf = 1                   /* ReplicaRead::start */
  fi
}

/* fault/mod.rs:serve_write_protect */
inline serve_write_protect(p, w) {
  if
  :: !resident(st[p]) -> wake(p)                           /* left meanwhile: fault again */
  :: resident(st[p]) && changing > 0 -> retry!p,w,1        /* WRITEPROTECT: EAGAIN */
  :: resident(st[p]) && changing == 0 ->
     wp[p] = 0; wake(p); st[p] = RDIRTY                    /* WRITEPROTECT off; mark_dirty */
  fi
}

#ifdef BUG_NO_WAIT_FOR_COMMIT
#define NO_WAIT_FOR_COMMIT 1
#else
#define NO_WAIT_FOR_COMMIT 0
#endif

/* fault/mod.rs:serve, one fault message. wait_for_commit (commit_cv.wait_for until the page
 * is not Evicting) is the guard: the lock is held once the page is not being evicted. */
inline serve(p, w, iswp) {
  atomic {
    if
    :: NO_WAIT_FOR_COMMIT && st[p] == EVICTING -> serve_served(p, w)
    :: else ->
       st[p] != EVICTING ->
       if
       :: iswp -> serve_write_protect(p, w)
       :: !iswp && st[p] == EMPTY -> serve_zero(p, w)
       :: !iswp && (resident(st[p]) || st[p] == FETCHING) -> serve_served(p, w)
       :: !iswp && inpool(st[p]) -> serve_from_pool(p, w)
       :: !iswp && st[p] == REMOTE -> serve_remote(p, w)
       fi
    fi
  };
  if
  :: orf ->                                                /* prefetch/faults.rs:on_remote_fault */
     atomic { if :: pfl[p] && !pfcons[p] -> pfcons[p] = 1 :: else -> skip fi; orf = 0 }
  :: else -> skip
  fi
}

/* fault/fetch.rs:install_fetched: a read fault's page write-protected */
inline install_fetched(p, w, d) {
  atomic {
    if
    :: st[p] != FETCHING -> retry!p,w,0                    /* released meanwhile */
    :: st[p] == FETCHING ->
       uffd_copy(p, d, !w);
       if
       :: r == EAGAIN -> installs!p,w,d
       :: r == OK || r == EEXIST ->                        /* no wake on EEXIST */
          if :: w -> st[p] = RDIRTY :: else -> st[p] = RCLEAN fi   /* pages.install_fetched */
       fi
    fi
  }
}

/* threads/events.rs:release (REMOVE). shared.rs:settle_evictions is the guard: the lock is
 * held once no eviction is half-done. */
inline release(p) {
  atomic {
    st[0] != EVICTING && st[1] != EVICTING ->
    release_page(p);                                       /* pages.release_range */
    rmpending[p] = 0
  }
}

chan retry = [4] of { byte, bit, bit };      /* Queues::retry: page, write, wp */
chan installs = [2] of { byte, bit, byte };  /* Queues::installs: page, write, data */
chan fetches = [2] of { byte, bit, byte };   /* Queues::fetches: page, write, far page */

/* fault/fetch.rs:complete_fetch: the donor's answer (read when the request is served) */
inline complete_fetches() {
  do
  :: fetches?p,w,f -> d = farv[f]; install_fetched(p, w, d)
  :: empty(fetches) -> break
  od
}

/* fault/mod.rs:FaultThread::serve_waiting: installs that met pending events, remote reads,
 * faults to serve again, remote reads */
inline serve_waiting() {
  n = len(installs);
  do :: n > 0 -> installs?p,w,d; install_fetched(p, w, d); n-- :: n == 0 -> break od;
  complete_fetches();
  n = len(retry);
  do :: n > 0 -> retry?p,w,x; serve(p, w, x); n-- :: n == 0 -> break od;
  complete_fetches()
}

proctype FaultThread() {
  mtype m;
  byte p, d, f, n, r;
  bit w, x, orf;
  chan batch = [4] of { mtype, byte, bit };   /* the faults read (all events: BUG_NO_RELEASE_FIX) */
  chan rels = [1] of { mtype, byte, bit };    /* the REMOVEs read */
end_idle:
  do
  :: /* rounds.rs:run -> fault/mod.rs:read_events: the events queued now, read under the read
      * gate, which also sets removes_unhandled if a REMOVE is among them (a REMOVE read lets
      * its madvise go on) */
     atomic {
       nempty(uq) ->
       do
       :: uq?m,p,w ->
          if
          :: m == REMOVE -> rmread[p] = 1;
             if :: RELEASE_FIX -> rels!m,p,w; rmunh = 1 :: else -> batch!m,p,w fi
          :: else -> batch!m,p,w
          fi;
          if :: empty(uq) -> break :: nempty(uq) -> skip fi
       od
     };
     /* first pass: the non-fault events, in order (handle_event) */
     do
     :: rels?m,p,w -> release(p)
     :: empty(rels) -> break
     od;
     /* FaultThread::releases_handled */
     rmunh = 0;
     /* second pass: the faults, in order (one pass over every event: BUG_NO_RELEASE_FIX) */
     do
     :: batch?m,p,w ->
        if
        :: m == REMOVE -> release(p)
        :: m == FAULT -> serve(p, w, 0)
        :: m == WPFAULT -> serve(p, w, 1)
        fi
     :: empty(batch) -> break
     od;
     serve_waiting();
     /* fault/mod.rs:FaultThread::handled (handled_seq: munmap is not modelled) */
     atomic { m = 0; p = 0; d = 0; f = 0; n = 0; r = 0; w = 0; x = 0 }
  :: /* a short sleep while faults wait to be served again (rounds.rs:sleep_for) */
     empty(uq) && (nempty(retry) || nempty(installs)) ->
     serve_waiting();
     atomic { m = 0; p = 0; d = 0; f = 0; n = 0; r = 0; w = 0; x = 0 }
  od
}

/* ================= the evictor (evict/mod.rs, moves.rs, commit.rs) ================= */

/* Assumption A1 (header): the madvise thread zaps before the evictor picks the page */
#ifdef NO_A1
#define pickable(q) resident(st[q])
#else
#define pickable(q) (resident(st[q]) && !(rmread[q] && releasing[q]))
#endif

proctype Evictor() {
  byte p, e = 0;
  bit clean, ok, zero, enoent;
end_idle:
  do
  :: /* evict_loop -> pick_victims, under the lock: the page becomes Evicting (A1: not a page
      * whose REMOVE is read and whose zap is still to come) */
     atomic {
       e < MAXEV && (pickable(0) || pickable(1)) ->
       if :: pickable(0) -> p = 0 :: pickable(1) -> p = 1 fi;
       clean = (st[p] == RCLEAN);                          /* pages.begin_eviction */
       st[p] = EVICTING;
       e++
     };
     /* moves.rs:move_victims: UFFDIO_MOVE region -> slot, on the pool's userfaultfd (its own
      * mmap_changing: a REMOVE pending on the region does not stop it); then
      * moves.rs:moved_anyway on an error (in its slot and gone from the region) */
     atomic {
       if
       :: !pte[p] -> ok = 0; enoent = 1                    /* ENOENT */
       :: pte[p] && slotp[p] -> ok = 0                     /* EEXIST */
       :: pte[p] && !slotp[p] ->
          slotp[p] = 1; slotv[p] = val[p]; pte[p] = 0; wp[p] = 0; ok = 1
       fi;
       if :: !ok && slotp[p] && !pte[p] -> ok = 1; enoent = 0 :: else -> skip fi;
       /* evict/mod.rs:move_and_read: the dirty all-zero pages (the slot is the evictor's) */
       zero = (ok && !clean && slotv[p] == 0)
     };
     /* commit.rs:commit, under the lock */
     atomic {
       if
       :: st[p] != EVICTING ->                             /* released meanwhile */
          if :: ok -> slotp[p] = 0 :: else -> skip fi      /* release_stale */
       :: st[p] == EVICTING && !ok && enoent && RELEASE_FIX && zeroed[p] ->
          /* gone_released -> threads/events.rs:released_late: gone after a zero install,
           * a release the kernel applied late took it: released, the eviction settled */
          release_page(p)
       :: st[p] == EVICTING && !ok && !(enoent && RELEASE_FIX && zeroed[p]) ->
          if :: clean -> st[p] = RCLEAN :: else -> st[p] = RDIRTY fi   /* commit_refused */
       :: st[p] == EVICTING && ok && clean -> st[p] = PSENT; zeroed[p] = 0   /* commit_clean */
       :: st[p] == EVICTING && ok && !clean && zero ->     /* commit_zero */
          if :: fid[p] != 0 -> farused[fid[p]] = 0 :: else -> skip fi;
          st[p] = EMPTY; fid[p] = 0; slotp[p] = 0; zeroed[p] = 0
       :: st[p] == EVICTING && ok && !clean && !zero ->    /* commit_dirty */
          if :: fid[p] == 0 -> far_alloc(p) :: else -> skip fi;   /* far_for_dirty */
          sgen++;
          gen[p] = sgen;
          st[p] = PUNSENT; zeroed[p] = 0;
          staged!p,sgen,fid[p],slotv[p]
       fi;
       p = 0; clean = 0; ok = 0; zero = 0; enoent = 0
     }
  :: /* slots.rs:reclaim (a slot is wanted): PoolSent -> Remote, its slot discarded */
     atomic {
       (st[0] == PSENT || st[1] == PSENT) ->
       if :: st[0] == PSENT -> p = 0 :: st[1] == PSENT -> p = 1 fi;
       st[p] = REMOTE; slotp[p] = 0;                       /* pages.reclaim; release_stale */
       p = 0
     }
  od
}

/* ================= the sender (threads/send.rs) ================= */

proctype Sender() {
  byte p, g, f, d;
end_idle:
  do
  :: /* next_batch: the oldest staged page, dropped unless still wanted (staged_live) */
     atomic {
       staged?p,g,f,d;
       if
       :: (st[p] == PUNSENT || st[p] == RSEND) && gen[p] == g -> skip
       :: else -> p = 0; g = 0; f = 0; d = 0
       fi
     };
     if
     :: g == 0 -> goto end_idle
     :: else -> skip
     fi;
     farv[f] = d;                                          /* WRITE_PAGES: the donor holds it */
     /* acknowledge_one -> pages.mark_sent, under the lock */
     atomic {
#ifdef BUG_ACK_ANY_GEN
       if
       :: st[p] == PUNSENT -> st[p] = PSENT
       :: st[p] == RSEND -> st[p] = RCLEAN
       :: else -> skip
       fi;
#else
       if
       :: st[p] == PUNSENT && gen[p] == g -> st[p] = PSENT
       :: st[p] == RSEND && gen[p] == g -> st[p] = RCLEAN
       :: else -> skip
       fi;
#endif
       p = 0; g = 0; f = 0; d = 0
     }
  od
}

/* ================= the prefetch thread (threads/prefetch.rs) ================= */

#ifndef NO_PREFETCH
proctype Prefetcher() {
  byte p, d, r, rf, k = 0;     /* rf: the request's far page (Req::far) */
  bit failed;
end_idle:
  do
  :: /* fault/mod.rs:feed -> pf.queue_fetches: a prediction for a page on its donor only
      * (made on the fault thread, state lock held) */
     atomic {
       k < MAXPF && ((st[0] == REMOTE && !pfl[0]) || (st[1] == REMOTE && !pfl[1])) ->
       if :: st[0] == REMOTE && !pfl[0] -> p = 0 :: st[1] == REMOTE && !pfl[1] -> p = 1 fi;
       pfl[p] = 1; pffar[p] = fid[p]; rf = fid[p]; pfcons[p] = 0; pfwait[p] = 0;
       k++
     };
     /* prefetch_loop: the batch on the wire; the donor reads its copy when it serves it,
      * unordered with the sender's writes on other connections; or the batch fails */
     if :: d = farv[rf]; failed = 0 :: failed = 1 fi;
     /* arrive, under the state lock; a fault waits: arrive_awaited with the flight's far page
      * (none once the page was released: Prefetch::released), else keep if still wanted (the
      * flight not consumed, with the request's far page) and still Remote on that far page */
     atomic {
       pfl[p] = 0;
       if
       :: pfwait[p] ->                                     /* arrive_awaited */
          pfwait[p] = 0;
          if
          :: !(st[p] == FETCHING && fid[p] == pffar[p]) -> skip   /* not ours: wake below */
          :: st[p] == FETCHING && fid[p] == pffar[p] && failed ->
             st[p] = REMOTE                                /* abandon_fetch */
          :: st[p] == FETCHING && fid[p] == pffar[p] && !failed ->
             gated_copy(p, d, 1);                          /* COPY|WP, install_gated */
             if
             :: r == OK || r == EEXIST ->
                st[p] = RCLEAN                             /* pages.install_fetched */
             :: r == EAGAIN -> st[p] = REMOTE              /* abandon_fetch */
             fi
          fi;
          wake(p)
       :: !pfwait[p] && failed -> skip
#ifdef BUG_PREFETCH_NO_RECHECK
       :: !pfwait[p] && !failed && !pfcons[p] && pffar[p] == rf ->
#else
       :: !pfwait[p] && !failed && !pfcons[p] && pffar[p] == rf && st[p] == REMOTE &&
          fid[p] == rf ->
#endif
          /* keep: in marker mode straight into the region (COPY|WP), else (or on EAGAIN) a
           * pool slot */
          if :: gated_copy(p, d, 1) :: r = EAGAIN fi;      /* install_gated */
          if
          :: r == OK -> st[p] = RCLEAN                     /* install_prefetched */
          :: r == EEXIST -> skip                           /* present: never overwritten */
          :: r == EAGAIN && !slotp[p] ->                   /* COPY into the slot (pool uffd) */
             slotp[p] = 1; slotv[p] = d; st[p] = PSENT     /* prefetch_to_pool */
          :: r == EAGAIN && slotp[p] -> skip               /* EEXIST: dropped */
          fi
       :: else -> skip                                     /* no longer wanted: dropped */
       fi;
       p = 0; d = 0; r = 0; rf = 0; failed = 0
     }
  od
}
#endif

/* (b): a page the table calls resident is mapped, unless its REMOVE is not yet handled or
 * it is zeroed (a late zap may still take it: released_late) */
proctype Monitor() {
end_watch:
  atomic {
    !((!resident(st[0]) || pte[0] || rmpending[0] || zeroed[0]) &&
      (!resident(st[1]) || pte[1] || rmpending[1] || zeroed[1])) ->
    assert(false)
  }
}

init {
  atomic {
    run Prog();
#ifdef READER
    run Reader();
#endif
#ifndef NO_RELEASE
    run Releaser();
#endif
    run FaultThread();
    run Evictor();
    run Sender();
#ifndef NO_PREFETCH
    run Prefetcher();
#endif
    run Monitor()
  }
}
