//! Parsing of `farmem donor --tenants FILE`: TOML, one `[[tenant]]` table per tenant with
//! `name`, `token_file`, an optional `quota` (a size, see [`super::units`]) and an optional
//! `max_connections` (at least 1); unknown keys, duplicate or empty names, bad sizes and a
//! bound of 0 are errors. Pure (no file access), so it is fuzzed
//! (`fuzz/fuzz_targets/config.rs` includes this file).
use std::path::PathBuf;

use anyhow::bail;

use super::units::parse_size;

/// One `[[tenant]]` of a tenants file.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantEntry {
    name: String,
    token_file: PathBuf,
    quota: Option<String>,
    max_connections: Option<usize>,
}

/// A tenants file.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantsFile {
    tenant: Vec<TenantEntry>,
}

/// A tenant as parsed from a tenants file, before its token file is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantSpec {
    /// Its name.
    pub name: String,
    /// Its token file, as written in the file.
    pub token_file: PathBuf,
    /// Its quota in bytes, if any.
    pub quota_bytes: Option<u64>,
    /// Most connections its clients may hold together, if set.
    pub max_connections: Option<usize>,
}

/// Parses the text of a tenants file (TOML; unknown keys, duplicate or empty names, and bad
/// sizes are errors).
pub fn parse_tenants(text: &str) -> anyhow::Result<Vec<TenantSpec>> {
    let file: TenantsFile = toml::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))?;
    if file.tenant.is_empty() {
        bail!("no [[tenant]] given");
    }
    let mut out: Vec<TenantSpec> = Vec::new();
    for t in file.tenant {
        if t.name.trim().is_empty() {
            bail!("a tenant has an empty name");
        }
        if out.iter().any(|o| o.name == t.name) {
            bail!("two tenants are named {:?}", t.name);
        }
        let quota_bytes = t
            .quota
            .as_deref()
            .map(parse_size)
            .transpose()
            .map_err(|e| anyhow::anyhow!("tenant {:?}: quota: {e}", t.name))?;
        if t.max_connections == Some(0) {
            bail!(
                "tenant {:?}: max_connections = 0 would let none of its clients connect; give at least 1",
                t.name
            );
        }
        out.push(TenantSpec {
            name: t.name,
            token_file: t.token_file,
            quota_bytes,
            max_connections: t.max_connections,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenants_file_parses_and_mistakes_are_named() {
        let ok = "[[tenant]]\nname = \"a\"\ntoken_file = \"a.tok\"\nquota = \"1GiB\"\n\n[[tenant]]\nname = \"b\"\ntoken_file = \"/b.tok\"\n";
        let t = parse_tenants(ok).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].quota_bytes, Some(1 << 30));
        assert_eq!(t[1].quota_bytes, None);
        let err = |text: &str| parse_tenants(text).unwrap_err().to_string();
        assert!(
            err("[[tenant]]\nname = \"a\"\ntoken_file = \"x\"\nquotaa = \"1GiB\"\n")
                .contains("unknown field")
        );
        assert!(err("[[tenant]]\nname = \"a\"\ntoken_file = \"x\"\n[[tenant]]\nname = \"a\"\ntoken_file = \"y\"\n").contains("two tenants"));
        assert!(
            err("[[tenant]]\nname = \"a\"\ntoken_file = \"x\"\nquota = \"lots\"\n")
                .contains("quota")
        );
        assert!(err("tenant = []\n").contains("no [[tenant]]"));
        assert!(
            err("[[tenant]]\nname = \"a\"\ntoken_file = \"x\"\nmax_connections = 0\n")
                .contains("max_connections = 0")
        );
        let t =
            parse_tenants("[[tenant]]\nname = \"a\"\ntoken_file = \"x\"\nmax_connections = 7\n")
                .unwrap();
        assert_eq!(t[0].max_connections, Some(7));
    }

    /// Every file of the fuzz corpora of the config target goes through the parsers the
    /// fuzzer drives (`fuzz/fuzz_targets/config.rs`), on stable Rust.
    #[test]
    fn the_config_fuzz_corpus_replays() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/config");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).expect("fuzz/corpus/config exists") {
            let data = std::fs::read(e.unwrap().path()).unwrap();
            let text = String::from_utf8_lossy(&data);
            let _ = parse_size(&text);
            let _ = super::super::units::parse_duration(&text);
            let _ = parse_tenants(&text);
            n += 1;
        }
        assert!(n > 0, "the corpus is empty");
    }
}
