//! Working with a far slab's copies on the runtime's shared core: reading one far page from
//! the first copy that answers ([`failover`]), and copying a whole slab to a new donor
//! ([`slabcopy`], for re-replication and migration). Above the shared core, which the far
//! side ([`crate::far`]) is below.

pub(crate) mod failover;
pub(crate) mod slabcopy;
