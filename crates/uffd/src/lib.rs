//! farmem-uffd: every userfaultfd ioctl farmem uses, each as a small safe wrapper.
//!
//! This is the one crate of farmem that talks to userfaultfd directly. [`Uffd::open`] creates
//! a userfaultfd (through `/dev/userfaultfd`, falling back to the `userfaultfd(2)` system call),
//! probes which features the kernel offers, fails with an actionable error when a required one
//! is missing, and enables the required plus the available optional ones. The methods then map
//! one-to-one onto the ioctls: [`Uffd::register`], [`Uffd::unregister`], [`Uffd::copy`],
//! [`Uffd::zeropage`], [`Uffd::wake`], [`Uffd::writeprotect`], [`Uffd::move_pages`],
//! [`Uffd::poison`], and [`Uffd::read_events`] decodes the messages (page faults with the
//! faulting thread id, fork, remap, remove, unmap). [`floor::FaultFloor`] measures the cost
//! of one userfaultfd fault on this machine.
//!
//! # Design
//!
//! - The userfaultfd is never created with `UFFD_USER_MODE_ONLY`: in that mode the kernel
//!   answers faults taken inside system calls (`read(fd, evicted_buffer, n)`) with EFAULT
//!   instead of delivering them, which would break programs silently. Needs root or access to
//!   `/dev/userfaultfd`.
//! - The fd is created `O_NONBLOCK | O_CLOEXEC`; [`Uffd::wait_readable`] polls it.
//! - Outcomes the caller must act on are distinct error variants: [`UffdError::Exists`] (the
//!   page is already there: wake the waiter), [`UffdError::Again`] (the address space is
//!   changing: read pending events, then retry), and everything else as
//!   [`UffdError::Ioctl`] with the errno ([`UffdError::errno`]).
//! - Operations that only touch ranges registered with this userfaultfd are safe functions: the
//!   kernel refuses them elsewhere. [`Uffd::register`] and [`Uffd::move_pages`] are `unsafe`:
//!   the first hands a range of memory to the fault handler, the second takes pages away from
//!   an arbitrary source range; the caller promises that no Rust reference points into them.
//!
//! # Limitations
//!
//! Anonymous private memory only (no hugetlbfs/shmem modes, no MINOR faults, no CONTINUE).
//! x86-64/arm64 ioctl encoding.

pub mod floor;
pub mod sys;

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// The page size userfaultfd operations are done in here.
pub const PAGE_SIZE: usize = 4096;

/// A set of userfaultfd features (`UFFD_FEATURE_*` bits).
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Features(pub u64);

impl Features {
    pub const PAGEFAULT_FLAG_WP: Features = Features(1 << 0);
    pub const EVENT_FORK: Features = Features(1 << 1);
    pub const EVENT_REMAP: Features = Features(1 << 2);
    pub const EVENT_REMOVE: Features = Features(1 << 3);
    pub const EVENT_UNMAP: Features = Features(1 << 6);
    pub const SIGBUS: Features = Features(1 << 7);
    pub const THREAD_ID: Features = Features(1 << 8);
    pub const EXACT_ADDRESS: Features = Features(1 << 11);
    pub const WP_UNPOPULATED: Features = Features(1 << 13);
    pub const POISON: Features = Features(1 << 14);
    pub const WP_ASYNC: Features = Features(1 << 15);
    pub const MOVE: Features = Features(1 << 16);

    /// Every feature this crate knows, with its name and the first kernel that has it.
    pub const KNOWN: &'static [(Features, &'static str, &'static str)] = &[
        (
            Self::PAGEFAULT_FLAG_WP,
            "UFFD_FEATURE_PAGEFAULT_FLAG_WP",
            "5.7",
        ),
        (Self::EVENT_FORK, "UFFD_FEATURE_EVENT_FORK", "4.11"),
        (Self::EVENT_REMAP, "UFFD_FEATURE_EVENT_REMAP", "4.11"),
        (Self::EVENT_REMOVE, "UFFD_FEATURE_EVENT_REMOVE", "4.11"),
        (Self::EVENT_UNMAP, "UFFD_FEATURE_EVENT_UNMAP", "4.11"),
        (Self::SIGBUS, "UFFD_FEATURE_SIGBUS", "4.14"),
        (Self::THREAD_ID, "UFFD_FEATURE_THREAD_ID", "4.14"),
        (Self::EXACT_ADDRESS, "UFFD_FEATURE_EXACT_ADDRESS", "5.18"),
        (Self::WP_UNPOPULATED, "UFFD_FEATURE_WP_UNPOPULATED", "6.4"),
        (Self::POISON, "UFFD_FEATURE_POISON", "6.6"),
        (Self::WP_ASYNC, "UFFD_FEATURE_WP_ASYNC", "6.7"),
        (Self::MOVE, "UFFD_FEATURE_MOVE", "6.8"),
    ];

    /// No feature.
    pub const fn empty() -> Features {
        Features(0)
    }

    /// Whether every feature of `other` is in `self`.
    pub const fn contains(self, other: Features) -> bool {
        self.0 & other.0 == other.0
    }

    /// The names of the known features in this set.
    pub fn names(self) -> Vec<&'static str> {
        Self::KNOWN
            .iter()
            .filter(|(f, _, _)| self.contains(*f))
            .map(|(_, name, _)| *name)
            .collect()
    }
}

impl std::ops::BitOr for Features {
    type Output = Features;
    fn bitor(self, rhs: Features) -> Features {
        Features(self.0 | rhs.0)
    }
}

impl std::ops::BitAnd for Features {
    type Output = Features;
    fn bitand(self, rhs: Features) -> Features {
        Features(self.0 & rhs.0)
    }
}

impl std::fmt::Debug for Features {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Features({:#x} {:?})", self.0, self.names())
    }
}

/// What faults a registered range reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegisterMode {
    /// Report accesses to pages that are not present.
    pub missing: bool,
    /// Report writes to write-protected pages.
    pub wp: bool,
}

/// How UFFDIO_MOVE runs ([`Uffd::move_pages`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MoveMode {
    /// Leave the threads waiting on `dst` asleep (a later wake releases them, one for a batch).
    pub dont_wake: bool,
    /// Move what is there and skip holes in `src` instead of failing with ENOENT.
    pub allow_src_holes: bool,
}

impl MoveMode {
    /// Wake the waiting threads; fail on a hole.
    pub const WAKE: MoveMode = MoveMode {
        dont_wake: false,
        allow_src_holes: false,
    };
    /// Leave the waiting threads asleep; fail on a hole.
    pub const DONT_WAKE: MoveMode = MoveMode {
        dont_wake: true,
        allow_src_holes: false,
    };
}

/// Errors of userfaultfd operations; each names the failing step and what to do.
#[derive(Debug, thiserror::Error)]
pub enum UffdError {
    #[error(
        "userfaultfd is not available to this user: grant access to /dev/userfaultfd \
         (e.g. `setfacl -m u:$USER:rw /dev/userfaultfd`; in a container, pass a node this user \
         may open: --device with a node of a group, and --group-add), set \
         vm.unprivileged_userfaultfd=1, or run as root (farmem never uses the user-mode-only \
         mode, which cannot serve faults inside system calls); `farmem doctor` names each \
         missing grant"
    )]
    NoPermission {
        #[source]
        source: io::Error,
    },
    #[error(
        "userfaultfd is refused under the seccomp filter on this process (Seccomp: 2 in \
         /proc/self/status; a container engine's default profile blocks userfaultfd): run the \
         container with a seccomp profile that allows the userfaultfd system call (podman or \
         docker --security-opt seccomp=PROFILE.json), or give it the device (--device \
         /dev/userfaultfd) with a profile that allows its ioctl; outside a container, remove the \
         filter (systemd: SystemCallFilter= must allow userfaultfd)"
    )]
    Seccomp {
        #[source]
        source: io::Error,
    },
    #[error(
        "this kernel has no userfaultfd (farmem needs Linux >= 6.8 built with CONFIG_USERFAULTFD)"
    )]
    NotSupported {
        #[source]
        source: io::Error,
    },
    #[error("mapping {len_bytes} bytes of anonymous memory to register failed")]
    Map {
        len_bytes: usize,
        #[source]
        source: io::Error,
    },
    #[error("creating a userfaultfd failed")]
    Open {
        #[source]
        source: io::Error,
    },
    #[error("the userfaultfd API handshake (UFFDIO_API) failed")]
    Api {
        #[source]
        source: io::Error,
    },
    #[error(
        "this kernel's userfaultfd lacks {feature}, which farmem needs (added in Linux {kernel}); \
         run farmem on Linux >= {kernel}"
    )]
    MissingFeature {
        feature: &'static str,
        kernel: &'static str,
    },
    #[error("{op} at {addr:#x}: a page is already present there")]
    Exists { op: &'static str, addr: usize },
    #[error(
        "{op} at {addr:#x}: the address space is changing (userfaultfd events pending); \
         {done_bytes} bytes done — read the pending events, then retry"
    )]
    Again {
        op: &'static str,
        addr: usize,
        done_bytes: usize,
    },
    #[error("{op} at {addr:#x} (+{len:#x} bytes) failed")]
    Ioctl {
        op: &'static str,
        addr: usize,
        len: usize,
        #[source]
        source: io::Error,
    },
    #[error("reading userfaultfd events failed")]
    Read {
        #[source]
        source: io::Error,
    },
    #[error("polling the userfaultfd failed")]
    Poll {
        #[source]
        source: io::Error,
    },
    #[error("the kernel sent an unknown userfaultfd event {0:#x}")]
    UnknownEvent(u8),
}

impl UffdError {
    /// The errno of a failed ioctl, if this error carries one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            UffdError::Exists { .. } => Some(libc::EEXIST),
            UffdError::Again { .. } => Some(libc::EAGAIN),
            UffdError::Ioctl { source, .. }
            | UffdError::Map { source, .. }
            | UffdError::Open { source }
            | UffdError::Api { source }
            | UffdError::Read { source }
            | UffdError::Poll { source }
            | UffdError::NoPermission { source }
            | UffdError::NotSupported { source } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// A decoded userfaultfd message.
#[derive(Debug)]
pub enum Event {
    /// A thread touched a missing page (or wrote a write-protected one) in a registered range.
    Pagefault {
        /// The faulting address (page-aligned unless EXACT_ADDRESS was enabled).
        addr: usize,
        /// The access was a write.
        write: bool,
        /// The fault is a write to a write-protected page (not a missing page).
        wp: bool,
        /// The faulting thread id (with THREAD_ID; 0 otherwise).
        thread_id: u32,
    },
    /// The process forked and the child's copy of the registered ranges is served by this new
    /// userfaultfd (only with EVENT_FORK).
    Fork { child: OwnedFd },
    /// `mremap` moved `len` bytes from `from` to `to`.
    Remap { from: usize, to: usize, len: usize },
    /// `madvise(MADV_DONTNEED/MADV_REMOVE)` released `start..end`.
    Remove { start: usize, end: usize },
    /// `munmap` (or an mmap over it) unmapped `start..end`.
    Unmap { start: usize, end: usize },
}

/// An open userfaultfd after a successful API handshake.
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
    features: Features,
    available: Features,
}

fn errno() -> io::Error {
    io::Error::last_os_error()
}

/// Creates a bare userfaultfd (`O_CLOEXEC | O_NONBLOCK`, never user-mode-only).
fn create_fd() -> Result<OwnedFd, UffdError> {
    let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
    // SAFETY: open(2) with a NUL-terminated static path; the returned fd is checked.
    let dev = unsafe { libc::open(c"/dev/userfaultfd".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if dev >= 0 {
        // SAFETY: `dev` is a fresh fd we own; wrapping it closes it on every path.
        let dev = unsafe { OwnedFd::from_raw_fd(dev) };
        // SAFETY: USERFAULTFD_IOC_NEW takes the open flags as its integer argument and returns
        // a new fd; no memory is passed.
        let fd = unsafe {
            libc::ioctl(
                dev.as_raw_fd(),
                sys::USERFAULTFD_IOC_NEW as _,
                flags as libc::c_ulong,
            )
        };
        if fd < 0 {
            let e = errno();
            return Err(classify_open(e));
        }
        // SAFETY: `fd` is a new userfaultfd the kernel just returned to us.
        return Ok(farmem_fds::protect(unsafe { OwnedFd::from_raw_fd(fd) }));
    }
    let dev_err = errno();
    // No /dev/userfaultfd (or no access to it): try the system call, which root may use.
    // SAFETY: userfaultfd(2) takes only flags; the result is checked.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags as libc::c_long) };
    if fd < 0 {
        let e = errno();
        let refused = classify_open(e);
        if matches!(refused, UffdError::Seccomp { .. }) && filter_refuses_syscall() {
            return Err(refused);
        }
        if dev_err.raw_os_error() == Some(libc::EACCES)
            || dev_err.raw_os_error() == Some(libc::EPERM)
        {
            return Err(UffdError::NoPermission { source: dev_err });
        }
        return Err(refused);
    }
    // SAFETY: `fd` is a new userfaultfd the kernel just returned to us.
    Ok(farmem_fds::protect(unsafe {
        OwnedFd::from_raw_fd(fd as RawFd)
    }))
}

/// Whether a seccomp filter is on this process (`Seccomp: 2` in /proc/self/status): then a
/// refusal (EPERM, or ENOSYS for a syscall a profile does not know) is most likely the filter's.
fn under_seccomp_filter() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines().any(|l| {
            l.split_once(':')
                .is_some_and(|(k, v)| k == "Seccomp" && v.trim() == "2")
        })
    })
}

/// Whether the seccomp filter refuses the userfaultfd system call itself (else the refusal was
/// the kernel's own: vm.unprivileged_userfaultfd without CAP_SYS_PTRACE). Asked without
/// creating anything: a user-mode-only request, which the kernel always permits, with a flag it
/// rejects (EINVAL) before making a descriptor. EINVAL: the call reached the kernel.
fn filter_refuses_syscall() -> bool {
    const USER_MODE_ONLY: libc::c_long = 1;
    const NOT_A_FLAG: libc::c_long = 2;
    // SAFETY: userfaultfd(2) takes only flags; with an unknown flag it creates nothing.
    let r = unsafe { libc::syscall(libc::SYS_userfaultfd, USER_MODE_ONLY | NOT_A_FLAG) };
    if r >= 0 {
        // A kernel that took the flag after all: not refused. Close what it made.
        // SAFETY: `r` is a descriptor the kernel just returned to us.
        drop(unsafe { OwnedFd::from_raw_fd(r as RawFd) });
        return false;
    }
    errno().raw_os_error() != Some(libc::EINVAL)
}

fn classify_open(e: io::Error) -> UffdError {
    if matches!(e.raw_os_error(), Some(libc::EPERM) | Some(libc::ENOSYS)) && under_seccomp_filter()
    {
        return UffdError::Seccomp { source: e };
    }
    match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => UffdError::NoPermission { source: e },
        Some(libc::ENOSYS) | Some(libc::ENOENT) => UffdError::NotSupported { source: e },
        _ => UffdError::Open { source: e },
    }
}

/// UFFDIO_API on `fd`, asking for `features`; returns the features the kernel reports.
fn api(fd: &OwnedFd, features: Features) -> Result<Features, UffdError> {
    let mut a = sys::UffdioApi {
        api: sys::UFFD_API,
        features: features.0,
        ioctls: 0,
    };
    // SAFETY: UFFDIO_API reads and writes exactly one `struct uffdio_api`, which `a` is
    // (layout asserted in sys.rs); `a` lives across the call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), sys::UFFDIO_API as _, &mut a) };
    if r < 0 {
        return Err(UffdError::Api { source: errno() });
    }
    Ok(Features(a.features))
}

impl Uffd {
    /// Features the kernel offers (probed on a throw-away userfaultfd).
    pub fn probe() -> Result<Features, UffdError> {
        let fd = create_fd()?;
        api(&fd, Features::empty())
    }

    /// Opens a userfaultfd with every feature of `required` (an error naming the first missing
    /// one and the kernel that has it otherwise) and those of `optional` the kernel offers.
    pub fn open(required: Features, optional: Features) -> Result<Uffd, UffdError> {
        let available = Self::probe()?;
        for (f, name, kernel) in Features::KNOWN {
            if required.contains(*f) && !available.contains(*f) {
                return Err(UffdError::MissingFeature {
                    feature: name,
                    kernel,
                });
            }
        }
        if !available.contains(required) {
            return Err(UffdError::MissingFeature {
                feature: "an unnamed UFFD_FEATURE bit",
                kernel: "6.8",
            });
        }
        let want = required | (optional & available);
        let fd = create_fd()?;
        api(&fd, want)?;
        Ok(Uffd {
            fd,
            features: want,
            available,
        })
    }

    /// Features enabled on this userfaultfd.
    pub fn features(&self) -> Features {
        self.features
    }

    /// Features the kernel offers (a superset of [`Uffd::features`]).
    pub fn available_features(&self) -> Features {
        self.available
    }

    fn range_ioctl<T>(
        &self,
        op: &'static str,
        req: u64,
        arg: &mut T,
        addr: usize,
        len: usize,
    ) -> Result<(), UffdError> {
        // SAFETY: every caller passes the request number matching `T` (the struct whose size
        // the number encodes, asserted in sys.rs); `arg` is a valid exclusive reference that
        // outlives the call. The kernel only reads/writes that struct and operates on ranges
        // registered with this userfaultfd (or, for MOVE, a source the caller vouched for).
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), req as _, arg as *mut T) };
        if r < 0 {
            let e = errno();
            return Err(match e.raw_os_error() {
                Some(libc::EEXIST) => UffdError::Exists { op, addr },
                Some(libc::EAGAIN) => UffdError::Again {
                    op,
                    addr,
                    done_bytes: 0,
                },
                _ => UffdError::Ioctl {
                    op,
                    addr,
                    len,
                    source: e,
                },
            });
        }
        Ok(())
    }

    /// UFFDIO_REGISTER: from now on, faults in `addr..addr+len` are reported to this fd.
    /// Returns the bit set of ioctls the kernel allows on the range.
    ///
    /// # Safety
    ///
    /// `addr..addr+len` must be page-aligned private anonymous memory owned by the caller,
    /// with no Rust references into it that assume its pages stay present: after this call,
    /// missing pages are served only when this fd's reader answers, and the caller's other
    /// operations (MOVE) may take pages away.
    pub unsafe fn register(
        &self,
        addr: usize,
        len: usize,
        mode: RegisterMode,
    ) -> Result<u64, UffdError> {
        let mut m = 0;
        if mode.missing {
            m |= sys::UFFDIO_REGISTER_MODE_MISSING;
        }
        if mode.wp {
            m |= sys::UFFDIO_REGISTER_MODE_WP;
        }
        let mut r = sys::UffdioRegister {
            range: sys::UffdioRange {
                start: addr as u64,
                len: len as u64,
            },
            mode: m,
            ioctls: 0,
        };
        self.range_ioctl("UFFDIO_REGISTER", sys::UFFDIO_REGISTER, &mut r, addr, len)?;
        Ok(r.ioctls)
    }

    /// UFFDIO_UNREGISTER: stop reporting faults in the range; threads waiting there are woken.
    pub fn unregister(&self, addr: usize, len: usize) -> Result<(), UffdError> {
        let mut r = sys::UffdioRange {
            start: addr as u64,
            len: len as u64,
        };
        self.range_ioctl(
            "UFFDIO_UNREGISTER",
            sys::UFFDIO_UNREGISTER,
            &mut r,
            addr,
            len,
        )
    }

    /// UFFDIO_COPY: atomically fills the missing pages at `dst` with `src` (the kernel copies
    /// from our buffer) and wakes the waiters unless `dontwake`. With `wp` the new pages are
    /// write-protected (the range must be registered in WP mode).
    pub fn copy(&self, dst: usize, src: &[u8], dontwake: bool, wp: bool) -> Result<(), UffdError> {
        let mut c = sys::UffdioCopy {
            dst: dst as u64,
            src: src.as_ptr() as u64,
            len: src.len() as u64,
            mode: if dontwake {
                sys::UFFDIO_COPY_MODE_DONTWAKE
            } else {
                0
            } | if wp { sys::UFFDIO_COPY_MODE_WP } else { 0 },
            copy: 0,
        };
        match self.range_ioctl("UFFDIO_COPY", sys::UFFDIO_COPY, &mut c, dst, src.len()) {
            Err(UffdError::Again { op, addr, .. }) => Err(UffdError::Again {
                op,
                addr,
                done_bytes: c.copy.max(0) as usize,
            }),
            other => other,
        }
    }

    /// UFFDIO_ZEROPAGE: maps the shared zero page at the missing pages of the range.
    pub fn zeropage(&self, addr: usize, len: usize, dontwake: bool) -> Result<(), UffdError> {
        let mut z = sys::UffdioZeropage {
            range: sys::UffdioRange {
                start: addr as u64,
                len: len as u64,
            },
            mode: if dontwake {
                sys::UFFDIO_ZEROPAGE_MODE_DONTWAKE
            } else {
                0
            },
            zeropage: 0,
        };
        match self.range_ioctl("UFFDIO_ZEROPAGE", sys::UFFDIO_ZEROPAGE, &mut z, addr, len) {
            Err(UffdError::Again { op, addr, .. }) => Err(UffdError::Again {
                op,
                addr,
                done_bytes: z.zeropage.max(0) as usize,
            }),
            other => other,
        }
    }

    /// UFFDIO_WAKE: wakes the threads waiting on faults in the range.
    pub fn wake(&self, addr: usize, len: usize) -> Result<(), UffdError> {
        let mut r = sys::UffdioRange {
            start: addr as u64,
            len: len as u64,
        };
        self.range_ioctl("UFFDIO_WAKE", sys::UFFDIO_WAKE, &mut r, addr, len)
    }

    /// UFFDIO_WRITEPROTECT: sets (`protect`) or clears write protection on the range. Clearing
    /// it wakes the writers waiting there unless `dontwake`. Setting it never wakes anyone, and
    /// the kernel rejects WP together with DONTWAKE (EINVAL), so `dontwake` is ignored then.
    pub fn writeprotect(
        &self,
        addr: usize,
        len: usize,
        protect: bool,
        dontwake: bool,
    ) -> Result<(), UffdError> {
        let mut w = sys::UffdioWriteprotect {
            range: sys::UffdioRange {
                start: addr as u64,
                len: len as u64,
            },
            mode: if protect {
                sys::UFFDIO_WRITEPROTECT_MODE_WP
            } else {
                0
            } | if dontwake && !protect {
                sys::UFFDIO_WRITEPROTECT_MODE_DONTWAKE
            } else {
                0
            },
        };
        self.range_ioctl(
            "UFFDIO_WRITEPROTECT",
            sys::UFFDIO_WRITEPROTECT,
            &mut w,
            addr,
            len,
        )
    }

    /// UFFDIO_MOVE: moves the pages at `src..src+len` to the missing pages at `dst` (which must
    /// be registered with this userfaultfd) without copying; `src` is left empty. Returns the
    /// bytes moved (less than `len` only with [`MoveMode::allow_src_holes`]).
    ///
    /// # Safety
    ///
    /// `src..src+len` must be private anonymous memory of this process that no Rust reference
    /// expects to stay populated: its pages disappear from there.
    pub unsafe fn move_pages(
        &self,
        dst: usize,
        src: usize,
        len: usize,
        how: MoveMode,
    ) -> Result<usize, UffdError> {
        let mut m = sys::UffdioMove {
            dst: dst as u64,
            src: src as u64,
            len: len as u64,
            mode: if how.dont_wake {
                sys::UFFDIO_MOVE_MODE_DONTWAKE
            } else {
                0
            } | if how.allow_src_holes {
                sys::UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES
            } else {
                0
            },
            moved: 0,
        };
        match self.range_ioctl("UFFDIO_MOVE", sys::UFFDIO_MOVE, &mut m, dst, len) {
            Ok(()) => Ok(m.moved.max(0) as usize),
            Err(UffdError::Again { op, addr, .. }) => Err(UffdError::Again {
                op,
                addr,
                done_bytes: m.moved.max(0) as usize,
            }),
            Err(e) => Err(e),
        }
    }

    /// UFFDIO_POISON: marks the missing pages of the range poisoned: the waiting thread (and
    /// any later access) gets SIGBUS. Used when a page cannot be brought back.
    pub fn poison(&self, addr: usize, len: usize, dontwake: bool) -> Result<(), UffdError> {
        let mut p = sys::UffdioPoison {
            range: sys::UffdioRange {
                start: addr as u64,
                len: len as u64,
            },
            mode: if dontwake {
                sys::UFFDIO_POISON_MODE_DONTWAKE
            } else {
                0
            },
            updated: 0,
        };
        self.range_ioctl("UFFDIO_POISON", sys::UFFDIO_POISON, &mut p, addr, len)
    }

    /// Waits until events are pending or `timeout_ms` passes (-1: forever). Returns whether
    /// the fd is readable. Interrupted waits return `Ok(false)`.
    pub fn wait_readable(&self, timeout_ms: i32) -> Result<bool, UffdError> {
        let mut p = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, count 1; the struct outlives the call.
        let r = unsafe { libc::poll(&mut p, 1, timeout_ms) };
        if r < 0 {
            let e = errno();
            if e.raw_os_error() == Some(libc::EINTR) {
                return Ok(false);
            }
            return Err(UffdError::Poll { source: e });
        }
        Ok(r > 0 && p.revents & libc::POLLIN != 0)
    }

    /// Reads the pending messages (at most `out`'s spare capacity... up to 64 per call) without
    /// blocking, appending decoded events to `out`. Returns how many were read (0: none pending).
    pub fn read_events(&self, out: &mut Vec<Event>) -> Result<usize, UffdError> {
        const BATCH: usize = 64;
        let mut msgs = [sys::UffdMsg::default(); BATCH];
        // SAFETY: the buffer is `BATCH` initialized, plain-data `uffd_msg`s; the kernel writes
        // whole messages into at most the given byte count.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                msgs.as_mut_ptr().cast(),
                std::mem::size_of_val(&msgs),
            )
        };
        if n < 0 {
            let e = errno();
            if e.raw_os_error() == Some(libc::EAGAIN) || e.raw_os_error() == Some(libc::EINTR) {
                return Ok(0);
            }
            return Err(UffdError::Read { source: e });
        }
        let count = n as usize / std::mem::size_of::<sys::UffdMsg>();
        for m in &msgs[..count] {
            out.push(decode(m)?);
        }
        Ok(count)
    }
}

fn decode(m: &sys::UffdMsg) -> Result<Event, UffdError> {
    Ok(match m.event {
        sys::UFFD_EVENT_PAGEFAULT => Event::Pagefault {
            addr: m.arg[1] as usize,
            write: m.arg[0] & sys::UFFD_PAGEFAULT_FLAG_WRITE != 0,
            wp: m.arg[0] & sys::UFFD_PAGEFAULT_FLAG_WP != 0,
            thread_id: (m.arg[2] & 0xffff_ffff) as u32,
        },
        sys::UFFD_EVENT_FORK => {
            let fd = (m.arg[0] & 0xffff_ffff) as u32 as RawFd;
            // SAFETY: for a fork event the kernel installed a new fd in our table and passes
            // its number; nobody else owns it, so taking ownership here is sound.
            let child = unsafe { OwnedFd::from_raw_fd(fd) };
            Event::Fork { child }
        }
        sys::UFFD_EVENT_REMAP => Event::Remap {
            from: m.arg[0] as usize,
            to: m.arg[1] as usize,
            len: m.arg[2] as usize,
        },
        sys::UFFD_EVENT_REMOVE => Event::Remove {
            start: m.arg[0] as usize,
            end: m.arg[1] as usize,
        },
        sys::UFFD_EVENT_UNMAP => Event::Unmap {
            start: m.arg[0] as usize,
            end: m.arg[1] as usize,
        },
        other => return Err(UffdError::UnknownEvent(other)),
    })
}

impl AsFd for Uffd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for Uffd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feature_names_and_contains() {
        let f = Features::MOVE | Features::EVENT_REMOVE;
        assert!(f.contains(Features::MOVE));
        assert!(!f.contains(Features::POISON));
        assert_eq!(
            f.names(),
            vec!["UFFD_FEATURE_EVENT_REMOVE", "UFFD_FEATURE_MOVE"]
        );
    }

    #[test]
    fn decode_events() {
        let mut m = sys::UffdMsg {
            event: sys::UFFD_EVENT_PAGEFAULT,
            arg: [sys::UFFD_PAGEFAULT_FLAG_WRITE, 0x7000, 42],
            ..Default::default()
        };
        match decode(&m).unwrap() {
            Event::Pagefault {
                addr,
                write,
                wp,
                thread_id,
            } => assert_eq!((addr, write, wp, thread_id), (0x7000, true, false, 42)),
            e => panic!("wrong event {e:?}"),
        }
        m.event = sys::UFFD_EVENT_REMOVE;
        m.arg = [0x1000, 0x3000, 0];
        assert!(matches!(
            decode(&m).unwrap(),
            Event::Remove {
                start: 0x1000,
                end: 0x3000
            }
        ));
        m.event = 0x77;
        assert!(matches!(decode(&m), Err(UffdError::UnknownEvent(0x77))));
    }

    #[test]
    fn missing_feature_message_names_feature_and_kernel() {
        let e = UffdError::MissingFeature {
            feature: "UFFD_FEATURE_MOVE",
            kernel: "6.8",
        };
        let s = e.to_string();
        assert!(s.contains("UFFD_FEATURE_MOVE") && s.contains("6.8"), "{s}");
    }
}
