//! Raw userfaultfd ABI: the `repr(C)` structs, ioctl numbers and flag bits of
//! `include/uapi/linux/userfaultfd.h`, written out here because UFFDIO_MOVE and UFFDIO_POISON
//! are newer than the definitions most crates carry.
//!
//! Every struct has a compile-time size assertion: the ioctl numbers encode the struct size,
//! so a wrong layout would be rejected by the kernel (or worse, misread) at run time.

/// The userfaultfd API version (`UFFD_API`).
pub const UFFD_API: u64 = 0xAA;
/// The ioctl type byte of every UFFDIO_* request.
const UFFDIO: u32 = 0xAA;

const IOC_NONE: u32 = 0;
const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;

/// `_IOC(dir, type, nr, size)` as the asm-generic encoding used by x86-64 and arm64.
const fn ioc(dir: u32, ty: u32, nr: u32, size: usize) -> u64 {
    ((dir << 30) | ((size as u32) << 16) | (ty << 8) | nr) as u64
}

/// `_IOWR`.
const fn iowr(nr: u32, size: usize) -> u64 {
    ioc(IOC_READ | IOC_WRITE, UFFDIO, nr, size)
}

/// `_IOR`.
const fn ior(nr: u32, size: usize) -> u64 {
    ioc(IOC_READ, UFFDIO, nr, size)
}

/// `/dev/userfaultfd` ioctl creating a new userfaultfd: `_IO(0xAA, 0x00)`.
pub const USERFAULTFD_IOC_NEW: u64 = ioc(IOC_NONE, 0xAA, 0x00, 0);

pub const UFFDIO_REGISTER: u64 = iowr(0x00, std::mem::size_of::<UffdioRegister>());
pub const UFFDIO_UNREGISTER: u64 = ior(0x01, std::mem::size_of::<UffdioRange>());
pub const UFFDIO_WAKE: u64 = ior(0x02, std::mem::size_of::<UffdioRange>());
pub const UFFDIO_COPY: u64 = iowr(0x03, std::mem::size_of::<UffdioCopy>());
pub const UFFDIO_ZEROPAGE: u64 = iowr(0x04, std::mem::size_of::<UffdioZeropage>());
pub const UFFDIO_MOVE: u64 = iowr(0x05, std::mem::size_of::<UffdioMove>());
pub const UFFDIO_WRITEPROTECT: u64 = iowr(0x06, std::mem::size_of::<UffdioWriteprotect>());
pub const UFFDIO_POISON: u64 = iowr(0x08, std::mem::size_of::<UffdioPoison>());
pub const UFFDIO_API: u64 = iowr(0x3F, std::mem::size_of::<UffdioApi>());

// Event kinds (`uffd_msg.event`).
pub const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
pub const UFFD_EVENT_FORK: u8 = 0x13;
pub const UFFD_EVENT_REMAP: u8 = 0x14;
pub const UFFD_EVENT_REMOVE: u8 = 0x15;
pub const UFFD_EVENT_UNMAP: u8 = 0x16;

// Page fault flags (`uffd_msg.arg.pagefault.flags`).
pub const UFFD_PAGEFAULT_FLAG_WRITE: u64 = 1 << 0;
pub const UFFD_PAGEFAULT_FLAG_WP: u64 = 1 << 1;
pub const UFFD_PAGEFAULT_FLAG_MINOR: u64 = 1 << 2;

// Register modes.
pub const UFFDIO_REGISTER_MODE_MISSING: u64 = 1 << 0;
pub const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;

// Per-ioctl mode bits.
pub const UFFDIO_COPY_MODE_DONTWAKE: u64 = 1 << 0;
pub const UFFDIO_COPY_MODE_WP: u64 = 1 << 1;
pub const UFFDIO_ZEROPAGE_MODE_DONTWAKE: u64 = 1 << 0;
pub const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1 << 0;
pub const UFFDIO_WRITEPROTECT_MODE_DONTWAKE: u64 = 1 << 1;
pub const UFFDIO_MOVE_MODE_DONTWAKE: u64 = 1 << 0;
pub const UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES: u64 = 1 << 1;
pub const UFFDIO_POISON_MODE_DONTWAKE: u64 = 1 << 0;

/// `struct uffdio_api`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioApi {
    pub api: u64,
    pub features: u64,
    pub ioctls: u64,
}

/// `struct uffdio_range`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioRange {
    pub start: u64,
    pub len: u64,
}

/// `struct uffdio_register`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioRegister {
    pub range: UffdioRange,
    pub mode: u64,
    pub ioctls: u64,
}

/// `struct uffdio_copy`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioCopy {
    pub dst: u64,
    pub src: u64,
    pub len: u64,
    pub mode: u64,
    pub copy: i64,
}

/// `struct uffdio_zeropage`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioZeropage {
    pub range: UffdioRange,
    pub mode: u64,
    pub zeropage: i64,
}

/// `struct uffdio_writeprotect`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioWriteprotect {
    pub range: UffdioRange,
    pub mode: u64,
}

/// `struct uffdio_move`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioMove {
    pub dst: u64,
    pub src: u64,
    pub len: u64,
    pub mode: u64,
    pub moved: i64,
}

/// `struct uffdio_poison`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioPoison {
    pub range: UffdioRange,
    pub mode: u64,
    pub updated: i64,
}

/// `struct uffd_msg` (packed in C; every field here is naturally aligned, so `repr(C)` gives
/// the same 32-byte layout). The union `arg` is kept as raw words and decoded by event kind.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdMsg {
    pub event: u8,
    pub reserved1: u8,
    pub reserved2: u16,
    pub reserved3: u32,
    /// The 24 bytes of `arg`: pagefault {flags, address, ptid}, fork {ufd}, remap
    /// {from, to, len}, remove/unmap {start, end}.
    pub arg: [u64; 3],
}

const _: () = assert!(std::mem::size_of::<UffdioApi>() == 24);
const _: () = assert!(std::mem::size_of::<UffdioRange>() == 16);
const _: () = assert!(std::mem::size_of::<UffdioRegister>() == 32);
const _: () = assert!(std::mem::size_of::<UffdioCopy>() == 40);
const _: () = assert!(std::mem::size_of::<UffdioZeropage>() == 32);
const _: () = assert!(std::mem::size_of::<UffdioWriteprotect>() == 24);
const _: () = assert!(std::mem::size_of::<UffdioMove>() == 40);
const _: () = assert!(std::mem::size_of::<UffdioPoison>() == 32);
const _: () = assert!(std::mem::size_of::<UffdMsg>() == 32);
// The numbers the kernel headers give (checked once by hand against linux/userfaultfd.h).
const _: () = assert!(UFFDIO_API == 0xC018_AA3F);
const _: () = assert!(UFFDIO_REGISTER == 0xC020_AA00);
const _: () = assert!(UFFDIO_UNREGISTER == 0x8010_AA01);
const _: () = assert!(UFFDIO_WAKE == 0x8010_AA02);
const _: () = assert!(UFFDIO_COPY == 0xC028_AA03);
const _: () = assert!(USERFAULTFD_IOC_NEW == 0xAA00);
