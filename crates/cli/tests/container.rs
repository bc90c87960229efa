//! farmem in a container: podman (runtime runc, as root on the host) runs the image that
//! deploy/container/build-image.sh builds offline (Debian's libc files, farmem, its preload
//! library and farmem-demo, a program that writes 96 MiB and checks it), as its non-root user
//! `farmem`:
//!
//! (a) under podman's default seccomp profile, with the host's /dev/userfaultfd passed (mode
//!     0600, root's), `farmem run` exits 1 with one message naming the seccomp profile and
//!     the device, and the program does not start;
//! (b) under farmem's profile (deploy/kubernetes/seccomp/farmem.json) with a /dev/userfaultfd
//!     the user may open, the demo prints what it prints without farmem and its pages went far
//!     and came back; so it does without the device as root with CAP_SYS_PTRACE (the system
//!     call, Kubernetes' way) and with the device under the default profile (which allows its
//!     ioctl): the two ways the README gives;
//! (c) `farmem doctor` names each grant missing: the seccomp profile, the device's permission
//!     or the device itself, vm.unprivileged_userfaultfd as the host has it (read, never
//!     written), and passes where `farmem run` works.
//!
//! Every container runs with --rm, --pull=never, --network none, --runtime runc, a unique
//! name, and CONTAINERS_CONF naming a copy of deploy/container/containers.conf; the image (a
//! unique tag) and any container left behind are removed at the end, also when the test
//! fails. The host's /dev/userfaultfd is not changed: the device a user may open is a node of
//! our own, made with mknod in a directory only root may enter.

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use farmem_testkit::run::{
    assert_went_far_and_came_back, counter, output_within, read_stats, require_program, text,
    Scratch,
};

/// The group the device node of (b) is given to; the container's user gets it only through
/// --group-add, as the README says (any id other than the user's own 1000 would do).
const DEVICE_GID: u32 = 2718;

/// What the demo is run with: a third of its 96 MiB, so most of its pages go far.
const LOCAL_MEM: &str = "32MiB";

/// The repository's root.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// farmem's seccomp profile: the default container profile plus userfaultfd.
fn profile() -> PathBuf {
    let p = repo().join("deploy/kubernetes/seccomp/farmem.json");
    assert!(
        p.is_file(),
        "farmem's seccomp profile {} is missing",
        p.display()
    );
    p.canonicalize().unwrap()
}

/// The image built for this test and the containers run from it; removed on drop.
struct Podman {
    podman: PathBuf,
    conf: PathBuf,
    tag: String,
    names: std::cell::RefCell<Vec<String>>,
    prefix: String,
    dir: Scratch,
}

impl Podman {
    /// Checks the machine (fails, saying what to do, when it lacks podman or runc), then
    /// builds the image with deploy/container/build-image.sh under a unique tag.
    fn build() -> Podman {
        let podman = require_program("podman", "podman");
        require_program("runc", "runc");
        assert_eq!(
            std::fs::metadata("/proc/self").unwrap().uid(),
            0,
            "this test runs podman as root (run the tests as root, as .ci/run does)"
        );
        let dir = Scratch::new("container");
        let conf = dir.path("containers.conf");
        std::fs::copy(repo().join("deploy/container/containers.conf"), &conf).unwrap();
        let unique = dir
            .0
            .file_name()
            .unwrap()
            .to_string_lossy()
            .trim_start_matches("farmem-test-")
            .to_string();
        let p = Podman {
            podman,
            conf,
            tag: format!("localhost/farmem-test:{unique}"),
            names: Default::default(),
            prefix: format!("farmem-test-{unique}"),
            dir,
        };
        let script = repo().join("deploy/container/build-image.sh");
        let o = output_within(
            Command::new("bash")
                .arg(&script)
                .args(["--tag", &p.tag, "--farmem", env!("CARGO_BIN_EXE_farmem")])
                .arg("--preload")
                .arg(farmem_testkit::bins::preload_lib())
                .env("CONTAINERS_CONF", &p.conf),
            Duration::from_secs(300),
        );
        assert!(o.status.success(), "{}: {}", script.display(), text(&o));
        p
    }

    /// `podman run` of `argv` in a new container of the image with `opts`.
    fn run(&self, opts: &[&str], argv: &[&str]) -> Output {
        let name = format!("{}-{}", self.prefix, self.names.borrow().len());
        self.names.borrow_mut().push(name.clone());
        let mut cmd = Command::new(&self.podman);
        cmd.env("CONTAINERS_CONF", &self.conf)
            // --pull=never: the image is local; no registry is ever asked.
            .args(["run", "--rm", "--pull=never", "--runtime", "runc"])
            .args(["--network", "none"])
            .args(["--name", &name])
            .args(opts)
            .arg(&self.tag)
            .args(argv);
        output_within(&mut cmd, Duration::from_secs(180))
    }

    /// A /dev/userfaultfd for the container's user: a node of the host's device, mode 0660,
    /// group [`DEVICE_GID`], in a directory only root may enter (podman gives the container's
    /// node the owner and mode of the node passed to --device; the host's is 0600 root and
    /// stays so).
    fn user_device(&self) -> PathBuf {
        let host = std::fs::metadata("/dev/userfaultfd").unwrap_or_else(|e| {
            panic!("/dev/userfaultfd: {e}: farmem's tests need Linux >= 6.8 with the device")
        });
        assert!(
            host.file_type().is_char_device(),
            "/dev/userfaultfd is not a device"
        );
        let dev = self.dir.path("dev");
        std::fs::create_dir(&dev).unwrap();
        std::fs::set_permissions(&dev, std::fs::Permissions::from_mode(0o700)).unwrap();
        let node = dev.join("userfaultfd");
        let (major, minor) = (libc::major(host.rdev()), libc::minor(host.rdev()));
        let o = Command::new("mknod")
            .args(["-m", "0660"])
            .arg(&node)
            .args(["c", &major.to_string(), &minor.to_string()])
            .output()
            .unwrap();
        assert!(o.status.success(), "mknod: {}", text(&o));
        std::os::unix::fs::chown(&node, Some(0), Some(DEVICE_GID)).unwrap();
        node
    }

    /// A directory the container's user may write its stats file to, mounted at /out.
    fn out_dir(&self) -> PathBuf {
        let out = self.dir.path("out");
        std::fs::create_dir(&out).unwrap();
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o1777)).unwrap();
        out
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        // --rm removes each container when it exits; one left by a timeout is removed here.
        let names = self.names.borrow();
        if !names.is_empty() {
            let _ = Command::new(&self.podman)
                .env("CONTAINERS_CONF", &self.conf)
                .args(["rm", "--force", "--ignore"])
                .args(names.iter())
                .output();
        }
        let _ = Command::new(&self.podman)
            .env("CONTAINERS_CONF", &self.conf)
            .args(["rmi", "--force", &self.tag])
            .output();
    }
}

/// The line of check `name` in doctor's table ("{status:<7} {name:<32} {detail}").
fn line_of(o: &Output, name: &str) -> String {
    let out = String::from_utf8_lossy(&o.stdout);
    out.lines()
        .find(|l| l.get(8..).is_some_and(|r| r.starts_with(name)))
        .unwrap_or_else(|| panic!("no line for {name}: {}", text(o)))
        .to_string()
}

/// The demo under farmem printed `want`, and its pages went far and came back.
fn assert_paged(o: &Output, stats: &Path, want: &str) {
    assert!(o.status.success(), "{}", text(o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), want, "{}", text(o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.lines()
            .any(|l| l.starts_with("farmem: ") && l.contains(" faults")),
        "no summary line: {}",
        text(o)
    );
    let s = read_stats(stats);
    assert!(counter(&s, "faults") > 0, "{s}");
    assert_went_far_and_came_back(&s, 32 << 20);
}

#[test]
fn farmem_pages_a_program_in_a_container_and_names_what_the_container_lacks() {
    let started = Instant::now();
    let p = Podman::build();
    let built = started.elapsed();
    let user = ["--user", "farmem"];
    let run_demo = [
        "farmem",
        "run",
        "--local-mem",
        LOCAL_MEM,
        "--",
        "farmem-demo",
    ];
    let seccomp = format!("seccomp={}", profile().display());
    let sysctl: u8 = std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd")
        .expect("reading vm.unprivileged_userfaultfd")
        .trim()
        .parse()
        .unwrap();

    // What the demo prints without farmem.
    let plain = p.run(&user, &["farmem-demo"]);
    assert!(plain.status.success(), "{}", text(&plain));
    let want = String::from_utf8(plain.stdout.clone()).unwrap();
    assert!(
        want.contains("96 MiB written and read back, checksum"),
        "{want}"
    );

    // (a) The default profile, the host's node (0600 root): one message, the program not run.
    let host_device = ["--device", "/dev/userfaultfd"];
    let o = p.run(&[&user[..], &host_device[..]].concat(), &run_demo);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(o.stdout.is_empty(), "the program ran: {}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    // podman's own log lines (time="…" level=…, WARN[…]) are not farmem's words.
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("time=") && !l.starts_with("WARN["))
        .collect();
    assert_eq!(lines.len(), 1, "one message: {}", text(&o));
    for part in [
        "farmem: error: ",
        "seccomp",
        "--security-opt seccomp=",
        "--device /dev/userfaultfd",
    ] {
        assert!(lines[0].contains(part), "{part:?} missing: {}", lines[0]);
    }

    // (a') farmem's profile (the system call allowed), the host's node (0600 root), the
    // kernel refusing an unprivileged user the system call (vm.unprivileged_userfaultfd 0):
    // the device's permission is what is missing, not the filter's, and the message says so.
    if sysctl == 0 {
        let profile_only = ["--security-opt", seccomp.as_str()];
        let o = p.run(
            &[&user[..], &host_device[..], &profile_only[..]].concat(),
            &run_demo,
        );
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("userfaultfd is not available to this user")
                && err.contains("--group-add")
                && !err.contains("refused under the seccomp filter"),
            "{err}"
        );
    }

    // (b) farmem's profile and a device the user may open (through --group-add).
    let node = p.user_device();
    let device = format!("{}:/dev/userfaultfd", node.display());
    let out = p.out_dir();
    let gid = DEVICE_GID.to_string();
    let volume = format!("{}:/out", out.display());
    let granted = [
        "--security-opt",
        seccomp.as_str(),
        "--device",
        device.as_str(),
        "--group-add",
        gid.as_str(),
        "-v",
        volume.as_str(),
    ];
    let stats_demo = |file: &str| -> Vec<String> {
        let mut v: Vec<String> = run_demo[..4].iter().map(|s| s.to_string()).collect();
        v.extend(["--stats".into(), format!("/out/{file}"), "--".into()]);
        v.push("farmem-demo".into());
        v
    };
    let argv = stats_demo("profile-device.json");
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let o = p.run(&[&user[..], &granted[..]].concat(), &argv);
    assert_paged(&o, &out.join("profile-device.json"), &want);

    // The system call's way (no device): farmem's profile, root with CAP_SYS_PTRACE.
    let argv = stats_demo("profile-syscall.json");
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let syscall = [
        "--user",
        "0",
        "--cap-add",
        "SYS_PTRACE",
        "--security-opt",
        seccomp.as_str(),
        "-v",
        volume.as_str(),
    ];
    let o = p.run(&syscall, &argv);
    assert_paged(&o, &out.join("profile-syscall.json"), &want);

    // The device's way needs no profile of ours: the default one allows its open and ioctl.
    let argv = stats_demo("default-device.json");
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let device_only = [
        "--device",
        device.as_str(),
        "--group-add",
        gid.as_str(),
        "-v",
        volume.as_str(),
    ];
    let o = p.run(&[&user[..], &device_only[..]].concat(), &argv);
    assert_paged(&o, &out.join("default-device.json"), &want);

    // (c) doctor, default profile, the host's node: every grant missing is named with its fix.
    let o = p.run(
        &[&user[..], &host_device[..]].concat(),
        &["farmem", "doctor"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let dev = line_of(&o, "/dev/userfaultfd");
    assert!(dev.starts_with("FAILED "), "{dev}");
    assert!(
        dev.contains("mode 0600, uid 0 gid 0) but uid 1000 may not open it"),
        "{dev}"
    );
    assert!(dev.contains("--group-add GID"), "{dev}");
    let sec = line_of(&o, "seccomp");
    assert!(sec.starts_with("FAILED "), "{sec}");
    assert!(
        sec.contains("--security-opt seccomp=deploy/kubernetes/seccomp/farmem.json"),
        "{sec}"
    );
    let ctl = line_of(&o, "vm.unprivileged_userfaultfd");
    if sysctl == 0 {
        // The kernel refuses the system call to this user too: named, with both fixes.
        assert!(ctl.starts_with("FAILED "), "{ctl}");
        assert!(
            ctl.contains("0, and this process lacks CAP_SYS_PTRACE"),
            "{ctl}"
        );
        assert!(ctl.contains("--cap-add SYS_PTRACE"), "{ctl}");
        assert!(
            ctl.contains("vm.unprivileged_userfaultfd=1 on the host"),
            "{ctl}"
        );
        assert!(sec.contains("the filter may be what refuses it"), "{sec}");
    } else {
        assert!(
            ctl.starts_with("ok ") && ctl.contains("1: every user"),
            "{ctl}"
        );
        assert!(sec.contains("refuses the userfaultfd system call"), "{sec}");
    }

    // No device at all: its absence is named, with --device.
    let o = p.run(&user, &["farmem", "doctor"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let dev = line_of(&o, "/dev/userfaultfd");
    assert!(
        dev.starts_with("FAILED ") && dev.contains("no /dev/userfaultfd in this container"),
        "{dev}"
    );
    assert!(dev.contains("--device /dev/userfaultfd"), "{dev}");

    // Root with CAP_SYS_PTRACE, the default profile: the kernel would allow the system call,
    // so the filter is named for sure as what refuses it.
    let o = p.run(
        &["--user", "0", "--cap-add", "SYS_PTRACE"],
        &["farmem", "doctor"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let sec = line_of(&o, "seccomp");
    assert!(
        sec.starts_with("FAILED ")
            && sec.contains("refuses the userfaultfd system call, which the kernel would allow it"),
        "{sec}"
    );
    assert!(
        line_of(&o, "vm.unprivileged_userfaultfd").starts_with("ok "),
        "{}",
        text(&o)
    );

    // Where farmem run works, doctor passes.
    let o = p.run(&[&user[..], &granted[..]].concat(), &["farmem", "doctor"]);
    assert!(o.status.success(), "{}", text(&o));
    for name in [
        "userfaultfd ",
        "/dev/userfaultfd",
        "seccomp",
        "vm.unprivileged_userfaultfd",
    ] {
        let l = line_of(&o, name);
        assert!(l.starts_with("ok "), "{l}");
    }
    eprintln!(
        "container test: image built in {:.1} s, all in {:.1} s",
        built.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}
