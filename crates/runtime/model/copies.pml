/*
 * A far slab's copies while a donor restarts and is taken back, for the spin model checker:
 * re-replication allocating a new copy and adding it to the slab (copies/slabcopy.rs:copy_slab,
 * and the tier's write-through, threads/tier.rs:write_through), the heal thread declaring the
 * donor restarted and taking it back (threads/heal.rs:declare_dead, readopt_restarted), and
 * the sender writing the slab (threads/send.rs:write_batch), all ordered by the copy gate
 * (far/mod.rs:Far::copy_gate, a reader-writer lock). Checked by crates/runtime/tests/page_model.rs.
 *
 * One donor, one far slab short of a copy there. A donor slab id is valid in the process of the
 * donor that gave it (an incarnation, `incarnation`); the runtime's pack (slabs/pack.rs) cuts
 * pieces from slabs of the incarnation it last registered with (`pack_of`), and forgets them
 * when it takes the donor back after a restart.
 *
 * Property: once the donor is taken back, no copy of the slab on it names a slab of an earlier
 * incarnation (assertion in the sender, which would write there: refused for good, or, had the
 * new process given that id again, another slab of ours overwritten).
 *
 * Configurations:
 *  (default)             the runtime's: the gate is held shared from the allocation until the
 *                        copy has joined the slab. No error.
 *  BUG_ALLOC_OUTSIDE_GATE the copy's piece is allocated before the gate is taken (as before
 *                        the fix): the donor restarts, is declared dead and taken back in
 *                        between, and the copy joins under the old incarnation's id.
 */

#define LIVE 0
#define DEAD 1

byte incarnation = 1;   /* the donor process now running */
byte registered = 1;    /* the incarnation the runtime registered with */
byte pack_of = 1;       /* the incarnation the runtime's pack cuts pieces from */
byte health = LIVE;     /* the runtime's view of the donor */
bool copy = false;      /* the slab has a copy on the donor */
byte copy_of = 0;       /* the incarnation whose slab id that copy names */

/* The copy gate: readers, and a writer. */
byte readers = 0;
bool writer = false;

inline read_lock()    { atomic { !writer -> readers++ } }
inline read_unlock()  { readers-- }
inline write_lock()   { atomic { !writer && readers == 0 -> writer = true } }
inline write_unlock() { writer = false }

/* The donor is killed and started again, empty, on the same address. */
active proctype Restart() {
    incarnation = 2
}

/* The heal thread: a request fails with "unknown client" once the donor restarted; the
 * donor is declared dead (its copies dropped) and then taken back: registered afresh, its
 * pack forgotten, once no slab names a copy there. */
active proctype Heal() {
    incarnation != registered;
    write_lock();
    health = DEAD;
    copy = false;
    write_unlock();
    do
    :: write_lock();
       if
       :: !copy ->
          pack_of = incarnation;
          registered = incarnation;
          health = LIVE;
          write_unlock();
          break
       :: else -> write_unlock()   /* tried again at the next probe */
       fi
    od
}

/* Re-replication: a new copy of the short slab on the donor, while it looks live. */
active proctype Copy() {
    byte piece;
    health == LIVE && !copy;
#ifdef BUG_ALLOC_OUTSIDE_GATE
    piece = pack_of;
    write_lock();
#else
    read_lock();
    piece = pack_of;
#endif
    if
    :: health == LIVE -> atomic { copy = true; copy_of = piece }   /* update_replicas: one step */
    :: else -> skip    /* the donor died meanwhile: the piece is released */
    fi;
#ifdef BUG_ALLOC_OUTSIDE_GATE
    write_unlock()
#else
    read_unlock()
#endif
}

/* The sender writes the slab's copies on live donors, under the gate held shared, again and
 * again (a valid end state anywhere in its loop). */
active proctype Send() {
end_send:
    do
    :: read_lock();
       /* The copies it would write to, looked up in one step (the replica table's lock). */
       assert(!(copy && health == LIVE && registered == incarnation) || copy_of == incarnation);
       read_unlock()
    od
}
