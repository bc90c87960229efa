//! The config target's body: `farmem`'s size, duration and tenants-file parsers (the CLI's own
//! source files, included by path) over arbitrary text. The CLI's tenants module replays the
//! corpus through the same parsers on stable.
#[path = "../../crates/cli/src/cmd/tenants.rs"]
#[allow(dead_code)]
mod tenants;
#[path = "../../crates/cli/src/cmd/units.rs"]
#[allow(dead_code)]
mod units;

/// Parses `data` (lossily as UTF-8) as a size, a duration and a tenants file.
pub fn parse_config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = units::parse_size(&text);
    let _ = units::parse_duration(&text);
    let _ = tenants::parse_tenants(&text);
}
