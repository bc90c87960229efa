//! The far address space's parts, below the far side's connections: far page numbers
//! ([`farpages`]), a far slab's copies on donors ([`replicas`]) and their pieces of donor slabs
//! ([`pack`]), far slabs held in memory ([`memslabs`]), and the seals of the pages sent
//! ([`seal`]). None of them talks to a donor or a node; the far side (`far/`) does.

pub(crate) mod farpages;
pub(crate) mod memslabs;
pub(crate) mod pack;
pub(crate) mod replicas;
pub(crate) mod seal;
