//! `farmem top`: one live view of a host — its node, every farmem program on it and the donors
//! they use — redrawn each second in the terminal, or printed once (`--once`, `--json`).
//!
//! # Design
//! `top` asks nothing new of the servers: the node answers STATS as for `farmem stats --node`,
//! programs are read from the stats files their processes already rewrite each second
//! ([`host`]), and a donor's round trip is a TCP connect `top` times itself (no token needed,
//! nothing logged by the donor). Fault rates need two writes of a program's stats, so `--once`
//! looks twice, at least 1.5 s apart.
mod host;
mod view;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use crossterm::{cursor, execute, queue, terminal};

use host::Watcher;
use view::SortBy;

/// How long `--once` waits between its two looks at least: a program rewrites its stats
/// about once a second, and a rate needs two writes.
const ONCE_AT_LEAST: Duration = Duration::from_millis(1500);

/// Arguments of `farmem top`.
#[derive(Args, Debug)]
pub struct TopArgs {
    /// The host's node (host tier) to show.
    #[arg(long, value_name = "PATH", default_value = farmem_node::DEFAULT_SOCKET_PATH)]
    pub node: PathBuf,
    /// Seconds between refreshes. Fault rates are measured between two writes of a
    /// program's stats (about once a second), so --once waits at least 1.5 s.
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0,
          value_parser = parse_interval)]
    pub interval: f64,
    /// Print one view and exit instead of refreshing (for scripts).
    #[arg(long)]
    pub once: bool,
    /// With --once: print the view as JSON (node, programs, donors).
    #[arg(long, requires = "once")]
    pub json: bool,
}

fn parse_interval(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if (0.1..=3600.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!(
            "{s} seconds is out of range: give 0.1 to 3600 seconds"
        ))
    }
}

/// Runs `farmem top`.
pub fn run(args: TopArgs) -> anyhow::Result<ExitCode> {
    let mut watcher = Watcher::new(args.node.clone());
    let interval = Duration::from_secs_f64(args.interval);
    if args.once {
        watcher.look();
        std::thread::sleep(interval.max(ONCE_AT_LEAST));
        let v = watcher.look();
        let mut out = std::io::stdout().lock();
        if args.json {
            serde_json::to_writer(&mut out, &v)?;
            writeln!(out)?;
        } else {
            for line in view::render(&v, SortBy::Resident, false) {
                writeln!(out, "{line}")?;
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    if !crossterm::tty::IsTty::is_tty(&std::io::stdout()) {
        anyhow::bail!(
            "farmem top needs a terminal to draw in; for scripts use `farmem top --once` \
             (with --json for the figures as JSON)"
        );
    }
    let screen = Screen::enter()?;
    let result = live(&mut watcher, interval);
    drop(screen);
    result.map(|()| ExitCode::SUCCESS)
}

/// Redraws until `q`, Esc or Ctrl-C.
fn live(watcher: &mut Watcher, interval: Duration) -> anyhow::Result<()> {
    let mut sort = SortBy::Resident;
    let mut v = watcher.look();
    let mut next = Instant::now() + interval;
    loop {
        draw(&v, sort)?;
        // Keys are answered at once; a look is taken when the interval is up.
        while let Some(wait) = next.checked_duration_since(Instant::now()) {
            if !event::poll(wait).context("reading the terminal")? {
                break;
            }
            if let Event::Key(k) = event::read().context("reading the terminal")? {
                if k.kind != KeyEventKind::Press {
                    continue;
                }
                match k.code {
                    KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                    KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => {
                        return Ok(())
                    }
                    KeyCode::Char('s') => sort = sort.next(),
                    KeyCode::Char('r') => sort = SortBy::Resident,
                    KeyCode::Char('f') => sort = SortBy::Faults,
                    KeyCode::Char('p') => sort = SortBy::Pid,
                    _ => continue,
                }
                draw(&v, sort)?;
            }
        }
        v = watcher.look();
        next = Instant::now() + interval;
    }
}

fn draw(v: &host::HostView, sort: SortBy) -> anyhow::Result<()> {
    let (cols, rows) = terminal::size().unwrap_or((80, 24));
    let mut out = std::io::stdout().lock();
    queue!(
        out,
        cursor::MoveTo(0, 0),
        terminal::Clear(terminal::ClearType::All)
    )?;
    for (i, line) in view::render(v, sort, true)
        .iter()
        .take(rows as usize)
        .enumerate()
    {
        let cut: String = line.chars().take(cols as usize).collect();
        queue!(out, cursor::MoveTo(0, i as u16))?;
        write!(out, "{cut}")?;
    }
    out.flush()?;
    Ok(())
}

/// The terminal in raw mode on its alternate screen, given back as it was when dropped (also
/// when drawing failed).
struct Screen;

impl Screen {
    fn enter() -> anyhow::Result<Screen> {
        terminal::enable_raw_mode().context("putting the terminal in raw mode")?;
        let screen = Screen;
        execute!(
            std::io::stdout(),
            terminal::EnterAlternateScreen,
            cursor::Hide
        )?;
        Ok(screen)
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = execute!(
            std::io::stdout(),
            cursor::Show,
            terminal::LeaveAlternateScreen
        );
        let _ = terminal::disable_raw_mode();
    }
}
