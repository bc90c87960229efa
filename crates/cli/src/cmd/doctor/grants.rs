//! `farmem doctor`'s grant checks: what a process needs to be given before farmem can create a
//! userfaultfd, each grant on its own line with how to give it.
//!
//! farmem creates its userfaultfds through `/dev/userfaultfd` when this process may open it,
//! else with the `userfaultfd` system call (crates/uffd). So a process needs one of two ways:
//!
//! - the device: `/dev/userfaultfd` present and open to this user (a container gets the node
//!   given to `--device`, with that node's owner and mode), and a seccomp filter that lets its
//!   ioctl through — the default profiles of podman, docker and containerd do;
//! - the system call: a seccomp filter that allows it (those default profiles refuse it;
//!   [`PROFILE`] is the default profile plus userfaultfd) and the kernel's leave: CAP_SYS_PTRACE
//!   in the host's user namespace, or `vm.unprivileged_userfaultfd = 1`.
//!
//! Three lines, one per grant: `/dev/userfaultfd`, `seccomp`, `vm.unprivileged_userfaultfd`. The
//! facts are read without changing anything: /proc/self/status, /proc/self/uid_map,
//! /proc/sys/vm/unprivileged_userfaultfd, and `/dev/userfaultfd` opened and closed (opening it
//! creates nothing; only its ioctl does); then combined with the outcome of the probe that
//! `farmem doctor` runs anyway ([`farmem_uffd::Uffd::probe`]).
//!
//! # Limitations
//!
//! A seccomp filter that refuses the system call is told for sure only when the kernel would
//! allow the call to this process (or the filter answered ENOSYS): when the kernel refuses it
//! too, both answer EPERM, and the line says the filter may be what refuses it.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use farmem_uffd::UffdError;

use super::{Check, Status};

/// farmem's seccomp profile: a container engine's default profile plus `userfaultfd`.
pub(super) const PROFILE: &str = "deploy/kubernetes/seccomp/farmem.json";

/// The device farmem opens first.
const DEVICE: &str = "/dev/userfaultfd";

/// The sysctl that lets processes without CAP_SYS_PTRACE use the system call.
const SYSCTL: &str = "vm.unprivileged_userfaultfd";

/// CAP_SYS_PTRACE's bit in the capability sets of /proc/self/status.
const CAP_SYS_PTRACE: u32 = 19;

/// `/dev/userfaultfd` as this process finds it.
#[derive(Debug)]
pub(super) enum Device {
    /// There, and this process opened it for reading and writing.
    Opens(Node),
    /// There, but opening it was refused (EACCES/EPERM).
    Denied(Node),
    /// No such file.
    Missing,
    /// Something else: not a character device, or opening it failed otherwise.
    Unusable(String),
}

/// The device node's identity and permissions.
#[derive(Debug, Clone, Copy)]
pub(super) struct Node {
    pub major: u32,
    pub minor: u32,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

impl std::fmt::Display for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "char {}:{}, mode {:04o}, uid {} gid {}",
            self.major,
            self.minor,
            self.mode & 0o7777,
            self.uid,
            self.gid
        )
    }
}

/// What the probe (creating a userfaultfd the way the runtime does) ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// A userfaultfd was created.
    Available,
    /// Refused to this process (by permissions or a seccomp filter), with the errno.
    Refused { errno: Option<i32> },
    /// Anything else (no userfaultfd in this kernel, a failed handshake): not about grants.
    Other,
}

impl Outcome {
    pub(super) fn of(probed: &Result<farmem_uffd::Features, UffdError>) -> Outcome {
        match probed {
            Ok(_) => Outcome::Available,
            Err(e @ (UffdError::Seccomp { .. } | UffdError::NoPermission { .. })) => {
                Outcome::Refused {
                    errno: std::error::Error::source(e)
                        .and_then(|s| s.downcast_ref::<io::Error>())
                        .and_then(io::Error::raw_os_error),
                }
            }
            Err(_) => Outcome::Other,
        }
    }
}

/// Where this process runs, for the wording of the fixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Place {
    Host,
    Container,
}

/// Everything the grant checks are decided from.
#[derive(Debug)]
pub(super) struct Facts {
    /// `Seccomp:` of /proc/self/status: 0 none, 1 strict, 2 filter.
    pub seccomp: u8,
    /// The effective uid.
    pub uid: u32,
    /// CAP_SYS_PTRACE is in the effective set.
    pub cap_sys_ptrace: bool,
    /// The process is in the host's user namespace (its capabilities are the kernel's test).
    pub host_user_ns: bool,
    /// `vm.unprivileged_userfaultfd`, if readable.
    pub sysctl: Option<u8>,
    pub device: Device,
    pub place: Place,
    pub outcome: Outcome,
}

impl Facts {
    /// Reads the facts of this process (read-only), with the probe's outcome.
    pub(super) fn read(outcome: Outcome) -> Facts {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let field = |key: &str| {
            status.lines().find_map(|l| {
                l.split_once(':')
                    .filter(|(k, _)| *k == key)
                    .map(|(_, v)| v.trim().to_string())
            })
        };
        let cap_eff = field("CapEff")
            .and_then(|v| u64::from_str_radix(&v, 16).ok())
            .unwrap_or(0);
        Facts {
            seccomp: field("Seccomp").and_then(|v| v.parse().ok()).unwrap_or(0),
            uid: field("Uid")
                .and_then(|v| v.split_whitespace().nth(1)?.parse().ok())
                .unwrap_or(u32::MAX),
            cap_sys_ptrace: cap_eff & (1 << CAP_SYS_PTRACE) != 0,
            host_user_ns: std::fs::read_to_string("/proc/self/uid_map")
                .is_ok_and(|m| is_identity_map(&m)),
            sysctl: std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd")
                .ok()
                .and_then(|v| v.trim().parse().ok()),
            device: read_device(Path::new(DEVICE)),
            place: place(),
            outcome,
        }
    }

    /// Whether the kernel lets this process use the system call (fs/userfaultfd.c,
    /// `userfaultfd_syscall_allowed`: the sysctl, or CAP_SYS_PTRACE in the host's namespace).
    fn kernel_allows_syscall(&self) -> bool {
        self.sysctl == Some(1) || (self.cap_sys_ptrace && self.host_user_ns)
    }

    fn filtered(&self) -> bool {
        self.seccomp != 0
    }

    fn device_opens(&self) -> bool {
        matches!(self.device, Device::Opens(_))
    }
}

/// A uid_map mapping every id to itself: the initial user namespace.
fn is_identity_map(map: &str) -> bool {
    let fields: Vec<&str> = map.split_whitespace().collect();
    fields == ["0", "0", "4294967295"]
}

/// `path` (the device) as this process finds it; opening it creates no userfaultfd.
fn read_device(path: &Path) -> Device {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Device::Missing,
        Err(e) => return Device::Unusable(format!("{}: {e}", path.display())),
    };
    if !meta.file_type().is_char_device() {
        return Device::Unusable(format!(
            "{} is not a character device (mode {:o}): it must be the kernel's userfaultfd device",
            path.display(),
            meta.mode()
        ));
    }
    let rdev = meta.rdev();
    let node = Node {
        major: libc::major(rdev),
        minor: libc::minor(rdev),
        mode: meta.mode(),
        uid: meta.uid(),
        gid: meta.gid(),
    };
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
    {
        Ok(_) => Device::Opens(node),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => Device::Denied(node),
        Err(e) => Device::Unusable(format!("opening {} ({node}) failed: {e}", path.display())),
    }
}

/// Whether this process runs in a container: the file podman leaves in its containers, the
/// variables podman and Kubernetes set, or docker's file with a container's cgroup (machines
/// built from a docker image keep /.dockerenv, as this project's do, so it is not enough alone).
fn place() -> Place {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let docker = Path::new("/.dockerenv").exists()
        && ["docker", "containerd", "kubepods", "libpod"]
            .iter()
            .any(|k| cgroup.contains(k));
    let marked = Path::new("/run/.containerenv").exists()
        || std::env::var_os("container").is_some()
        || std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
        || docker;
    if marked {
        Place::Container
    } else {
        Place::Host
    }
}

/// The three grant lines, or none when the probe failed for a reason no grant fixes.
pub(super) fn checks(f: &Facts) -> Vec<Check> {
    if f.outcome == Outcome::Other {
        return Vec::new();
    }
    vec![device(f), seccomp(f), sysctl(f)]
}

/// The `/dev/userfaultfd` line.
fn device(f: &Facts) -> Check {
    let name = DEVICE;
    let refused = f.outcome != Outcome::Available;
    match &f.device {
        Device::Opens(node) => Check::new(
            name,
            Status::Ok,
            format!("this user opens it ({node}): farmem creates its userfaultfds through it"),
        ),
        _ if !refused => Check::new(
            name,
            Status::Ok,
            format!(
                "{}; farmem uses the userfaultfd system call instead",
                device_state(f)
            ),
        ),
        Device::Missing => Check::new(name, Status::Failed, missing_device(f.place)),
        Device::Denied(node) => Check::new(name, Status::Failed, denied_device(f, node)),
        Device::Unusable(why) => Check::new(name, Status::Failed, why.clone()),
    }
}

/// The device's state in a few words, when farmem does without it.
fn device_state(f: &Facts) -> String {
    match &f.device {
        Device::Opens(node) => format!("this user opens it ({node})"),
        Device::Denied(node) => format!("here ({node}) but not open to uid {}", f.uid),
        Device::Missing => "not here".to_string(),
        Device::Unusable(why) => why.clone(),
    }
}

fn missing_device(place: Place) -> String {
    match place {
        Place::Container => format!(
            "no {DEVICE} in this container: pass the host's with --device {DEVICE} (podman, \
             docker; their default seccomp profiles allow its use) and, for a user other than \
             root, a node that user may open (--group-add); Kubernetes passes devices only \
             through a device plugin: without the device farmem needs the system call (the \
             seccomp and {SYSCTL} lines)"
        ),
        Place::Host => format!(
            "no {DEVICE} on this host (Linux >= 5.11 built with CONFIG_USERFAULTFD has it; \
             devtmpfs creates it; in a container: --device {DEVICE}): farmem needs the system \
             call instead (the seccomp and {SYSCTL} lines)"
        ),
    }
}

fn denied_device(f: &Facts, node: &Node) -> String {
    let uid = f.uid;
    let fix = match f.place {
        Place::Container => format!(
            "a container's node has the owner and mode of the node given to --device: give \
             that node to a group (mode 0660: a udev rule on the host, KERNEL==\"userfaultfd\", \
             GROUP=\"NAME\", MODE=\"0660\", or a node of its own: mknod -m 0660 PATH c {} {} \
             && chgrp GID PATH, passed as --device PATH:{DEVICE}) and run with --group-add GID; \
             or run farmem as root in the container",
            node.major, node.minor
        ),
        Place::Host => format!(
            "setfacl -m u:{uid}:rw {DEVICE}, or give it to a group (chgrp GROUP {DEVICE}; \
             chmod 0660 {DEVICE}; a udev rule keeps it across boots), or run as root (in a \
             container: --device with a node this user may open, and --group-add)"
        ),
    };
    format!("here ({node}) but uid {uid} may not open it: {fix}")
}

/// The `seccomp` line.
fn seccomp(f: &Facts) -> Check {
    let name = "seccomp";
    if !f.filtered() {
        return Check::new(name, Status::Ok, "no seccomp filter on this process");
    }
    let mode = format!("Seccomp: {} in /proc/self/status", f.seccomp);
    let refused = match f.outcome {
        Outcome::Refused { errno } => errno,
        _ => {
            let way = if f.device_opens() {
                format!("through {DEVICE}")
            } else {
                "with the system call".to_string()
            };
            return Check::new(
                name,
                Status::Ok,
                format!(
                    "a filter is on this process ({mode}) and lets farmem create its \
                     userfaultfds {way}"
                ),
            );
        }
    };
    let why = if f.device_opens() {
        // The device opened, so the refusal was its ioctl's: only a filter refuses that.
        format!(
            "the seccomp filter on this process ({mode}) refuses USERFAULTFD_IOC_NEW, the ioctl \
             that makes a userfaultfd from {DEVICE}: run it under a profile that allows ioctl \
             (the default profiles of podman, docker and containerd do), such as {PROFILE}"
        )
    } else if f.kernel_allows_syscall() {
        format!(
            "the seccomp filter on this process ({mode}) refuses the userfaultfd system call, \
             which the kernel would allow it ({}): {}",
            kernel_leave(f),
            profile_fix(f.place)
        )
    } else if refused == Some(libc::ENOSYS) {
        format!(
            "the seccomp filter on this process ({mode}) refuses the userfaultfd system call \
             (ENOSYS: only a filter answers that): {}",
            profile_fix(f.place)
        )
    } else {
        format!(
            "a filter is on this process ({mode}) and the userfaultfd system call was refused; \
             the kernel refuses it here too (the {SYSCTL} line), so the filter may be what \
             refuses it, as container engines' default profiles do. Without {DEVICE}, farmem \
             needs a filter that allows it: {}",
            profile_fix(f.place)
        )
    };
    Check::new(name, Status::Failed, why)
}

/// How to run under farmem's profile.
fn profile_fix(place: Place) -> String {
    match place {
        Place::Container => format!(
            "run the container under farmem's profile {PROFILE} (the default profile plus \
             userfaultfd): podman or docker run --security-opt seccomp={PROFILE}; Kubernetes: \
             copy it to /var/lib/kubelet/seccomp/farmem.json on each node and set \
             securityContext.seccompProfile {{type: Localhost, localhostProfile: farmem.json}}"
        ),
        Place::Host => format!(
            "let the filter allow userfaultfd (systemd: SystemCallFilter= must allow it; a \
             container engine's: --security-opt seccomp={PROFILE})"
        ),
    }
}

/// Why the kernel lets this process use the system call.
fn kernel_leave(f: &Facts) -> &'static str {
    if f.sysctl == Some(1) {
        "vm.unprivileged_userfaultfd = 1"
    } else {
        "it has CAP_SYS_PTRACE"
    }
}

/// The `vm.unprivileged_userfaultfd` line.
fn sysctl(f: &Facts) -> Check {
    let name = SYSCTL;
    let value = f.sysctl.map_or("unreadable".to_string(), |v| v.to_string());
    if f.device_opens() {
        return Check::new(
            name,
            Status::Ok,
            format!("{value}: not needed, farmem uses {DEVICE}"),
        );
    }
    if f.kernel_allows_syscall() {
        let why = if f.sysctl == Some(1) {
            "every user may create a userfaultfd with the system call".to_string()
        } else {
            "not needed, this process has CAP_SYS_PTRACE".to_string()
        };
        return Check::new(name, Status::Ok, format!("{value}: {why}"));
    }
    if f.outcome == Outcome::Available {
        return Check::new(
            name,
            Status::Ok,
            format!("{value}: this kernel lets this process create a userfaultfd"),
        );
    }
    let ns = if f.cap_sys_ptrace {
        " in the host's user namespace (it has it only in its own)"
    } else {
        ""
    };
    let fix = match f.place {
        Place::Container => format!(
            "give the container's root CAP_SYS_PTRACE (podman or docker --cap-add SYS_PTRACE; \
             Kubernetes securityContext.capabilities.add: [SYS_PTRACE]), or set {SYSCTL}=1 on \
             the host (sysctl -w; for every user of the host)"
        ),
        Place::Host => {
            format!("run farmem as root (CAP_SYS_PTRACE), or sysctl -w {SYSCTL}=1 (for every user)")
        }
    };
    Check::new(
        name,
        Status::Failed,
        format!(
            "{value}, and this process lacks CAP_SYS_PTRACE{ns}: the kernel refuses it the \
             userfaultfd system call, farmem's way without {DEVICE} (since Linux 5.11, 0 leaves \
             such processes only user-mode-only userfaultfds, which farmem never uses: they \
             cannot serve faults inside system calls): {fix}; {DEVICE} needs neither"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE: Node = Node {
        major: 10,
        minor: 257,
        mode: 0o20600,
        uid: 0,
        gid: 0,
    };

    /// A non-root user in a container under an engine's default profile, the host's node
    /// passed but 0600 root: what `farmem doctor` saw in the container test.
    fn container_user() -> Facts {
        Facts {
            seccomp: 2,
            uid: 1000,
            cap_sys_ptrace: false,
            host_user_ns: true,
            sysctl: Some(0),
            device: Device::Denied(NODE),
            place: Place::Container,
            outcome: Outcome::Refused {
                errno: Some(libc::EPERM),
            },
        }
    }

    fn line<'a>(checks: &'a [Check], name: &str) -> &'a Check {
        checks
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no {name} in {checks:?}"))
    }

    #[test]
    fn a_container_user_is_told_each_missing_grant() {
        let c = checks(&container_user());
        let dev = line(&c, DEVICE);
        assert_eq!(dev.status, Status::Failed, "{dev:?}");
        assert!(dev.detail.contains("uid 1000 may not open it"), "{dev:?}");
        assert!(dev.detail.contains("mode 0600, uid 0 gid 0"), "{dev:?}");
        assert!(dev.detail.contains("--group-add GID"), "{dev:?}");
        assert!(
            dev.detail.contains("mknod -m 0660 PATH c 10 257"),
            "{dev:?}"
        );
        let sec = line(&c, "seccomp");
        assert_eq!(sec.status, Status::Failed, "{sec:?}");
        assert!(sec.detail.contains("may be what refuses it"), "{sec:?}");
        assert!(
            sec.detail
                .contains(&format!("--security-opt seccomp={PROFILE}")),
            "{sec:?}"
        );
        let ctl = line(&c, SYSCTL);
        assert_eq!(ctl.status, Status::Failed, "{ctl:?}");
        assert!(
            ctl.detail
                .starts_with("0, and this process lacks CAP_SYS_PTRACE"),
            "{ctl:?}"
        );
        assert!(ctl.detail.contains("--cap-add SYS_PTRACE"), "{ctl:?}");
    }

    #[test]
    fn a_filter_is_named_for_sure_when_the_kernel_would_allow_the_call() {
        let f = Facts {
            uid: 0,
            cap_sys_ptrace: true,
            device: Device::Missing,
            ..container_user()
        };
        let c = checks(&f);
        let sec = line(&c, "seccomp");
        assert_eq!(sec.status, Status::Failed);
        assert!(
            sec.detail.contains("refuses the userfaultfd system call, which the kernel would allow it (it has CAP_SYS_PTRACE)"),
            "{sec:?}"
        );
        assert_eq!(line(&c, SYSCTL).status, Status::Ok);
        let dev = line(&c, DEVICE);
        assert!(
            dev.status == Status::Failed && dev.detail.contains("--device /dev/userfaultfd"),
            "{dev:?}"
        );
        // ENOSYS is only ever a filter's answer, whatever the kernel would say.
        let f = Facts {
            outcome: Outcome::Refused {
                errno: Some(libc::ENOSYS),
            },
            ..container_user()
        };
        let sec = line(&checks(&f), "seccomp").detail.clone();
        assert!(
            sec.contains("refuses the userfaultfd system call (ENOSYS"),
            "{sec}"
        );
    }

    #[test]
    fn capabilities_in_a_user_namespace_do_not_count() {
        let f = Facts {
            uid: 0,
            cap_sys_ptrace: true,
            host_user_ns: false,
            ..container_user()
        };
        let ctl = line(&checks(&f), SYSCTL).detail.clone();
        assert!(ctl.contains("in the host's user namespace"), "{ctl}");
    }

    #[test]
    fn a_refused_ioctl_on_an_open_device_is_the_filters() {
        let f = Facts {
            uid: 0,
            cap_sys_ptrace: true,
            device: Device::Opens(NODE),
            place: Place::Host,
            ..container_user()
        };
        let c = checks(&f);
        assert_eq!(line(&c, DEVICE).status, Status::Ok);
        let sec = line(&c, "seccomp");
        assert!(
            sec.status == Status::Failed && sec.detail.contains("refuses USERFAULTFD_IOC_NEW"),
            "{sec:?}"
        );
        assert!(line(&c, SYSCTL).detail.contains("not needed"));
    }

    #[test]
    fn all_is_ok_when_userfaultfd_is_available_either_way() {
        for (device, cap) in [(Device::Opens(NODE), false), (Device::Missing, true)] {
            let f = Facts {
                uid: 0,
                cap_sys_ptrace: cap,
                device,
                outcome: Outcome::Available,
                ..container_user()
            };
            for c in checks(&f) {
                assert_eq!(c.status, Status::Ok, "{c:?}");
            }
        }
        // A kernel without userfaultfd: no grant would help, so none is named.
        let f = Facts {
            outcome: Outcome::Other,
            ..container_user()
        };
        assert!(checks(&f).is_empty());
    }

    #[test]
    fn a_host_user_is_told_host_fixes() {
        let f = Facts {
            seccomp: 0,
            place: Place::Host,
            ..container_user()
        };
        let c = checks(&f);
        assert!(line(&c, DEVICE)
            .detail
            .contains("setfacl -m u:1000:rw /dev/userfaultfd"));
        assert_eq!(line(&c, "seccomp").status, Status::Ok);
        assert!(line(&c, SYSCTL)
            .detail
            .contains("sysctl -w vm.unprivileged_userfaultfd=1"));
    }

    #[test]
    fn this_processes_facts_and_the_device_are_read() {
        let f = Facts::read(Outcome::Available);
        assert_eq!(f.uid, std::fs::metadata("/proc/self").unwrap().uid());
        assert!(is_identity_map("         0          0 4294967295\n"));
        assert!(!is_identity_map("0 100000 65536\n"));
        assert!(matches!(
            read_device(Path::new("/nonexistent/userfaultfd")),
            Device::Missing
        ));
        match read_device(Path::new("/proc/self/status")) {
            Device::Unusable(why) => assert!(why.contains("not a character device"), "{why}"),
            d => panic!("{d:?}"),
        }
        // /dev/null is a character device anyone opens: its numbers and mode are read.
        match read_device(Path::new("/dev/null")) {
            Device::Opens(n) => {
                assert_eq!((n.major, n.minor), (1, 3));
                assert_eq!(n.mode & 0o777, 0o666);
            }
            d => panic!("{d:?}"),
        }
    }
}
