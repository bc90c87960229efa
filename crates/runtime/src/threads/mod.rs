//! The runtime's background work besides the fault thread and the evictor: the sender, the
//! prefetch thread, the heal thread (with migration off donors that want their memory back),
//! the tier thread, and the two pieces the fault thread and the evictor hand work to (release
//! events, dropping pages MOVE refuses).
//!
//! Each thread's decisions are kept apart from how it touches the runtime, so they can be
//! unit-tested on plain data or fakes; the loops themselves take [`crate::shared::Shared`].

pub(crate) mod backoff;
pub(crate) mod cow;
pub(crate) mod events;
pub(crate) mod heal;
pub(crate) mod heal_plan;
pub(crate) mod heal_rounds;
pub(crate) mod migrate;
pub(crate) mod prefetch;
pub(crate) mod prefetch_plan;
pub(crate) mod send;
pub(crate) mod send_rounds;
pub(crate) mod tier;
pub(crate) mod tier_rounds;
