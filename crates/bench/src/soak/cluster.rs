//! The soak's cluster: a host tier (`farmem node` on a socket of its own) and donors each in a
//! network namespace of its own behind a veth link, sharing one random token — what a user
//! runs — and the failures injected into it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use anyhow::{anyhow, Context};
use farmem_node::child::{child_node_command, ChildNode};
use farmem_testkit::netns::{Host, HostDonor};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::failures::Kind;
use crate::netns::{bench_token, testkit_call};

/// Each donor's capacity, and what `capacity-lowered` lowers it to.
/// Two copies of every program's far memory fit on two donors, with room for the slabs a
/// killed run leaves for its orphan grace; committed only as written.
const DONOR_CAPACITY: &str = "2GiB";
const DONOR_CAPACITY_LOWERED: &str = "512MiB";
/// The node's capacity: small enough that the programs' far memory also reaches the donors.
const NODE_CAPACITY: &str = "256MiB";

pub(crate) struct Cluster {
    socket: PathBuf,
    node: Mutex<Option<ChildNode>>,
    /// Held (read) by a program from its start until its runtime is up, and (write) by a node
    /// kill until the new node listens: a program never starts against a dead node (it would
    /// fail at once, with a clear error, and test nothing).
    pub(crate) starting: RwLock<()>,
    donors: Vec<Mutex<HostDonor>>,
    addrs: Vec<SocketAddr>,
    capacity_files: Vec<PathBuf>,
    token_file: PathBuf,
}

impl Cluster {
    /// Starts the node and `donors` donors under `dir`.
    pub(crate) fn start(dir: &Path, donors: usize) -> anyhow::Result<Cluster> {
        let token = bench_token().map_err(|e| anyhow!(e))?;
        let mut ds = Vec::new();
        let mut capacity_files = Vec::new();
        for i in 0..donors {
            let cap = dir.join(format!("donor-{i}.capacity"));
            std::fs::write(&cap, DONOR_CAPACITY).context("writing a donor's capacity file")?;
            let cap_s = cap.to_string_lossy().into_owned();
            let args = ["--capacity-file", &cap_s, "--slab-size", "4MiB"];
            let d = catch(|| HostDonor::spawn_with_token(Host::new(), &args, token.clone()))
                .context("starting a donor in a network namespace of its own")?;
            ds.push(d);
            capacity_files.push(cap);
        }
        let token_file = ds[0].token_file();
        let c = Cluster {
            socket: dir.join("node.sock"),
            node: Mutex::new(None),
            starting: RwLock::new(()),
            addrs: ds.iter().map(HostDonor::addr).collect(),
            donors: ds.into_iter().map(Mutex::new).collect(),
            capacity_files,
            token_file,
        };
        *c.node.lock().unwrap() = Some(c.spawn_node()?);
        Ok(c)
    }

    fn spawn_node(&self) -> anyhow::Result<ChildNode> {
        // A killed node leaves its socket file behind.
        let _ = std::fs::remove_file(&self.socket);
        child_node_command(crate::farmem_bin()?, &self.socket)
            .arg("--capacity")
            .arg(NODE_CAPACITY)
            // Its warnings reach the soak's stderr; a line per client would drown them.
            .env("FARMEM_LOG", "warn")
            .spawn()
            .map_err(|e| anyhow!("starting farmem node on {}: {e}", self.socket.display()))
    }

    /// The donors' addresses, by index.
    pub(crate) fn donor_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// `farmem run`'s arguments for this cluster (before `--stats` and the program).
    pub(crate) fn run_args(&self, local_mem: &str) -> Vec<String> {
        let mut a = vec!["--node".into(), self.socket.display().to_string()];
        for d in &self.addrs {
            a.extend(["--donor".into(), d.to_string()]);
        }
        a.extend([
            "--token-file".into(),
            self.token_file.display().to_string(),
            "--local-mem".into(),
            local_mem.into(),
        ]);
        a
    }

    /// Injects `kind` into donor `i` (or the node), holds it for `hold`, then undoes it.
    pub(crate) fn inject(&self, kind: Kind, i: usize, hold: Duration) -> anyhow::Result<()> {
        if kind == Kind::NodeKill {
            return self.kill_node(hold);
        }
        let mut d = self.donors[i].lock().unwrap();
        match kind {
            Kind::DonorKill => {
                catch(|| d.crash())?;
                std::thread::sleep(hold);
                catch(|| d.restart())?;
            }
            Kind::DonorRestart => {
                catch(|| d.restart())?;
                std::thread::sleep(hold);
            }
            Kind::DonorStall => {
                catch(|| d.stall())?;
                std::thread::sleep(hold);
                catch(|| d.resume())?;
            }
            Kind::LinkDown => {
                catch(|| d.partition())?;
                std::thread::sleep(hold);
                catch(|| d.heal_link())?;
            }
            Kind::CapacityLowered => {
                let pid = d.pid().context("the donor is not running")?;
                self.set_capacity(i, pid, DONOR_CAPACITY_LOWERED)?;
                std::thread::sleep(hold);
                self.set_capacity(i, pid, DONOR_CAPACITY)?;
            }
            Kind::NodeKill => unreachable!("handled above"),
        }
        Ok(())
    }

    fn set_capacity(&self, i: usize, pid: u32, capacity: &str) -> anyhow::Result<()> {
        std::fs::write(&self.capacity_files[i], capacity).context("writing a capacity file")?;
        kill(Pid::from_raw(pid as i32), Signal::SIGHUP).context("SIGHUP to a donor")
    }

    fn kill_node(&self, hold: Duration) -> anyhow::Result<()> {
        let _no_starts = self.starting.write().unwrap();
        let mut node = self.node.lock().unwrap();
        if let Some(mut n) = node.take() {
            kill(Pid::from_raw(n.pid() as i32), Signal::SIGKILL).context("SIGKILL to the node")?;
            n.wait_timeout(Duration::from_secs(10))
                .context("reaping the killed node")?;
        }
        std::thread::sleep(hold);
        *node = Some(self.spawn_node()?);
        Ok(())
    }
}

/// [`testkit_call`], its message as an error.
fn catch<T>(f: impl FnOnce() -> T) -> anyhow::Result<T> {
    testkit_call(f).map_err(|why| anyhow!(why))
}
