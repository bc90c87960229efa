//! Finding and checking the program `farmem run` is asked to run: the command on PATH, its kind
//! (a dynamically linked program of this machine, a script), and what the loader would refuse.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// COMMAND cannot be run: `farmem run` exits 127 (not found) or 126 (not executable), as
/// shells, `env` and `timeout` do, so scripts can tell it from a program that failed.
#[derive(Debug)]
pub struct CommandError {
    pub exit_code: u8,
    message: String,
}

impl std::fmt::Display for CommandError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CommandError {}

pub(super) fn command_error(exit_code: u8, message: String) -> anyhow::Error {
    anyhow::Error::new(CommandError { exit_code, message })
}

/// Finds COMMAND like execvp would: a name with a `/` as is, otherwise the first executable
/// match in PATH.
pub fn resolve_command(cmd: &OsStr, path_var: Option<&OsStr>) -> anyhow::Result<PathBuf> {
    let p = Path::new(cmd);
    if cmd.as_encoded_bytes().contains(&b'/') {
        return match runnable(p) {
            Runnable::Yes => Ok(p.to_path_buf()),
            Runnable::Missing => Err(command_error(
                127,
                format!("COMMAND not found: {} does not exist", p.display()),
            )),
            Runnable::No(why) => Err(command_error(
                126,
                format!("COMMAND {}: {why}", p.display()),
            )),
        };
    }
    let path_var = path_var.unwrap_or(OsStr::new("/usr/local/bin:/usr/bin:/bin"));
    // A file found on PATH that this user may not run is named (the shell says "Permission
    // denied", exit 126), unless a later directory has one that runs.
    let mut refused = None;
    for dir in std::env::split_paths(path_var) {
        let cand = dir.join(p);
        match runnable(&cand) {
            Runnable::Yes => return Ok(cand),
            Runnable::No(why) => {
                refused.get_or_insert((cand, why));
            }
            Runnable::Missing => {}
        }
    }
    if let Some((cand, why)) = refused {
        return Err(command_error(
            126,
            format!("COMMAND {}: {why}", cand.display()),
        ));
    }
    Err(command_error(
        127,
        format!(
            "COMMAND not found: no executable {:?} in PATH ({})",
            cmd,
            path_var.to_string_lossy()
        ),
    ))
}

/// Whether this user can run the file at a path, and if not, why.
pub(super) enum Runnable {
    Yes,
    Missing,
    No(String),
}

/// Tells "does not exist" from "cannot be reached" (a folder on the way this user may not
/// search) from "not a file" from "not executable by this user": a program the user could not
/// run was reported as not existing.
pub(super) fn runnable(p: &Path) -> Runnable {
    let meta = match std::fs::metadata(p) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Runnable::Missing,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Runnable::No(format!(
                "cannot be reached by this user ({e}): a folder on its path is not searchable \
                 for it; run as a user who may, or give the folders o+x"
            ))
        }
        Err(e) => return Runnable::No(format!("cannot be read ({e})")),
    };
    if !meta.is_file() {
        return Runnable::No("is not an executable file (a directory or a device)".into());
    }
    // No x bit at all first: access(X_OK) refuses that to root too, and "not executable by
    // this user" would send root looking at users.
    if meta.permissions().mode() & 0o111 == 0 {
        return Runnable::No("is not an executable file (no x bit: chmod +x it)".into());
    }
    match nix::unistd::access(p, nix::unistd::AccessFlags::X_OK) {
        Ok(()) => Runnable::Yes,
        Err(e) => Runnable::No(format!(
            "is not executable by this user ({e}; mode {:04o}, owner uid {}): chmod it, or run \
             as a user who may",
            meta.permissions().mode() & 0o7777,
            std::os::unix::fs::MetadataExt::uid(&meta)
        )),
    }
}

/// What kind of executable a file is, as far as LD_PRELOAD is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecKind {
    /// A dynamically linked ELF program for this machine: LD_PRELOAD works.
    Dynamic,
    /// A statically linked ELF program (no PT_INTERP): LD_PRELOAD cannot reach it.
    Static,
    /// An ELF program for another class or machine than farmem's library.
    ForeignElf { class64: bool, machine: u16 },
    /// A `#!` script with its interpreter (and optional argument).
    Script {
        interpreter: PathBuf,
        arg: Option<String>,
    },
    /// Neither ELF nor script.
    Unknown,
}

pub(super) const EM_X86_64: u16 = 62;
pub(super) const EM_AARCH64: u16 = 183;
pub(super) const PT_INTERP: u32 = 3;

pub(super) fn native_machine() -> u16 {
    if cfg!(target_arch = "aarch64") {
        EM_AARCH64
    } else {
        EM_X86_64
    }
}

/// Classifies an executable from its first bytes and program headers.
pub fn classify_executable(path: &Path) -> anyhow::Result<ExecKind> {
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(classify_bytes(&data))
}

/// [`classify_executable`] on the file's contents.
pub fn classify_bytes(data: &[u8]) -> ExecKind {
    if let Some(rest) = data.strip_prefix(b"#!") {
        let line = rest.split(|&b| b == b'\n').next().unwrap_or(&[]);
        let line = String::from_utf8_lossy(line);
        let mut parts = line.trim().splitn(2, [' ', '\t']);
        let interpreter = PathBuf::from(parts.next().unwrap_or(""));
        let arg = parts
            .next()
            .map(|a| a.trim().to_string())
            .filter(|a| !a.is_empty());
        return ExecKind::Script { interpreter, arg };
    }
    if data.len() < 64 || &data[..4] != b"\x7fELF" {
        return ExecKind::Unknown;
    }
    let class64 = data[4] == 2;
    let le = data[5] == 1;
    let u16_at = |o: usize| u16::from_le_bytes([data[o], data[o + 1]]);
    let machine = if le { u16_at(18) } else { 0 };
    if !class64 || !le || machine != native_machine() {
        return ExecKind::ForeignElf { class64, machine };
    }
    let phoff = u64::from_le_bytes(data[32..40].try_into().expect("8 bytes")) as usize;
    let phentsize = u16_at(54) as usize;
    let phnum = u16_at(56) as usize;
    for i in 0..phnum {
        let o = phoff + i * phentsize;
        if o + 4 > data.len() {
            break;
        }
        if u32::from_le_bytes(data[o..o + 4].try_into().expect("4 bytes")) == PT_INTERP {
            return ExecKind::Dynamic;
        }
    }
    ExecKind::Static
}

/// Checks that LD_PRELOAD will reach the program; follows `#!` interpreters.
/// Refuses a set-user-ID or set-group-ID program that would change this user's ids: the
/// kernel runs it in secure-execution mode, where the dynamic loader ignores the library's path
/// in `LD_PRELOAD` (and the library, loaded some other way, stays inactive), so it would run
/// without farmem. File capabilities are not looked at.
pub(super) fn check_not_secure_exec(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    let mode = meta.mode();
    let which = if mode & libc::S_ISUID != 0 && meta.uid() != nix::unistd::getuid().as_raw() {
        "set-user-ID"
    } else if mode & libc::S_ISGID != 0 && meta.gid() != nix::unistd::getgid().as_raw() {
        "set-group-ID"
    } else {
        return Ok(());
    };
    bail!(
        "{} is {which}: it runs with other rights than yours, where the dynamic loader ignores \
         LD_PRELOAD, so farmem cannot page its memory (run it without farmem)",
        path.display()
    )
}

pub(super) fn check_preloadable(path: &Path) -> anyhow::Result<()> {
    let mut cur = path.to_path_buf();
    for _ in 0..4 {
        match classify_executable(&cur)? {
            ExecKind::Dynamic => return check_not_secure_exec(&cur),
            ExecKind::Static => bail!(
                "{} is statically linked: LD_PRELOAD cannot reach it, so farmem cannot page its \
                 memory (rebuild it dynamically linked, or use farmem's C API)",
                cur.display()
            ),
            ExecKind::ForeignElf { class64, machine } => {
                return Err(command_error(
                    126,
                    format!(
                        "{} is an ELF program for another machine ({}-bit, e_machine \
                         {machine}); farmem's preload library is 64-bit for this machine",
                        cur.display(),
                        if class64 { 64 } else { 32 }
                    ),
                ))
            }
            ExecKind::Unknown => {
                return Err(command_error(
                    126,
                    format!(
                        "{} is neither an ELF program nor a #! script; farmem cannot run it",
                        cur.display()
                    ),
                ))
            }
            ExecKind::Script { interpreter, arg } => {
                let name = interpreter
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned());
                // Every process of the tree is under farmem, so a script's interpreter and
                // what it starts are too; `#!/usr/bin/env NAME` is followed to NAME on PATH
                // (when it cannot be found there, env itself reports it).
                cur = match (name.as_deref(), arg.as_deref()) {
                    (Some("env"), Some(prog)) if !prog.starts_with('-') => {
                        match resolve_command(OsStr::new(prog), std::env::var_os("PATH").as_deref())
                        {
                            Ok(p) => p,
                            Err(_) => return Ok(()),
                        }
                    }
                    _ => interpreter,
                };
            }
        }
    }
    bail!("{}: too many nested #! interpreters", path.display())
}
