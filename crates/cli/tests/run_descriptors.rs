//! A program's own use of its descriptor table never takes farmem's descriptors from under
//! it: `dup2` onto every number, closing every number, `close_range`, `closefrom`, a child that
//! closes everything before `exec` (tests/c/fd_hostile.c), and a shell's `exec N>file`. Before,
//! the runtime's userfaultfd was the lowest free number (3 to 8): a program that `dup2`ed a file
//! onto it crashed at its next fault.
use farmem_testkit::run::*;

#[test]
fn a_program_that_closes_or_replaces_every_descriptor_keeps_its_far_pages() {
    let (o, s) = c_program_same_both_ways("fd_hostile", "96", "32MiB");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("ERROR"), "{}", text(&o));
    // Every dup2 onto a number of farmem's was refused (EBUSY), and only those.
    let refused: u32 = err
        .lines()
        .find_map(|l| l.strip_prefix("dup2 refused "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no refusal count: {}", text(&o)));
    assert!(
        (1..=16).contains(&refused),
        "{refused} dup2 calls refused: {}",
        text(&o)
    );
    assert_went_far_and_came_back(&s, 64 << 20);
}

#[test]
fn a_shell_redirecting_low_descriptors_runs_its_commands_under_farmem() {
    // `exec 3>`, `exec 4>`, ... `exec 9>` replace 3 to 9, which farmem's descriptors used to
    // hold; the commands after them still run paged (python3 fills and hashes 96 MiB at 32).
    let python = require_program("python3", "python3");
    let dir = Scratch::new("fd-shell");
    let out = dir.path("out");
    let script = format!(
        "for n in 3 4 5 6 7 8 9; do eval \"exec $n>{out}.$n\"; done; \
         {python} -c 'import hashlib; b = bytearray(range(256)) * (96 * 4096); \
         print(hashlib.sha256(b).hexdigest(), hashlib.sha256(b).hexdigest())'; echo done >&9",
        out = out.display(),
        python = python.display()
    );
    let o = farmem_run(&["--local-mem", "32MiB"], &["bash", "-c", &script]);
    assert!(o.status.success(), "{}", text(&o));
    let line = String::from_utf8_lossy(&o.stdout);
    let hashes: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(hashes.len(), 2, "{}", text(&o));
    assert_eq!(hashes[0], hashes[1], "{}", text(&o));
    assert_eq!(
        std::fs::read_to_string(format!("{}.9", out.display())).unwrap(),
        "done\n"
    );
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("ERROR"),
        "{}",
        text(&o)
    );
}
