//! The library's settings: the [`RunSettings`] `farmem run` puts in the environment.
//!
//! `farmem run` passes its options as one JSON value in [`RUN_SETTINGS_VAR`] (the type and its
//! encoding: `farmem_contract::run_settings`). The constructor reads it once with
//! [`take_from_env`]. With a tree directory (what `farmem run` gives) both stay in the
//! environment, so every program the process execs is under farmem too; without one the
//! variable is removed and `LD_PRELOAD` restored to what it was before `farmem run`.

use std::ffi::OsString;

pub use farmem_contract::run_settings::{RunSettings, RunSettingsError, RUN_SETTINGS_VAR};

/// Reads the settings from the environment; without a tree directory, removes them and this
/// library from what the program (and anything it execs) sees. `Ok(None)`: the library was
/// preloaded without `farmem run`.
pub fn take_from_env() -> Result<Option<RunSettings>, RunSettingsError> {
    let Some(value) = std::env::var_os(RUN_SETTINGS_VAR) else {
        return Ok(None);
    };
    let settings = decode(value)?;
    if settings.tree_dir.is_some() {
        // The whole process tree is under farmem: what this process execs inherits both.
        return Ok(Some(settings));
    }
    std::env::remove_var(RUN_SETTINGS_VAR);
    match settings.orig_ld_preload.as_deref() {
        None | Some("") => std::env::remove_var("LD_PRELOAD"),
        Some(orig) => std::env::set_var("LD_PRELOAD", orig),
    }
    Ok(Some(settings))
}

/// Decodes the variable's value (which JSON requires to be UTF-8).
fn decode(value: OsString) -> Result<RunSettings, RunSettingsError> {
    let text = value.into_string().unwrap_or_else(|raw| {
        // Not UTF-8: let the JSON reader name the problem.
        String::from_utf8_lossy(raw.as_encoded_bytes()).into_owned()
    });
    RunSettings::decode(&text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use farmem_contract::run_settings::RUN_SETTINGS_VERSION;

    #[test]
    fn the_settings_of_farmem_run_decode() {
        let s = RunSettings {
            version: RUN_SETTINGS_VERSION,
            local_mem_bytes: 256 << 20,
            donors: vec!["127.0.0.1:7000".into()],
            token_file: None,
            evict: None,
            prefetch: None,
            prefetch_install: None,
            seal: farmem_contract::SealMode::Auto,
            tier: farmem_contract::TierMode::Off,
            replicas: None,
            backup_file: None,
            heal_rate_bytes: None,
            over_budget: farmem_contract::OverBudget::Allow,
            stats_file: None,
            tree_dir: None,
            record_trace: None,
            mmap_threshold_bytes: 256 << 10,
            heap_reserve_bytes: 256 << 30,
            allocator_only: false,
            farmem_bin: None,
            orig_ld_preload: None,
        };
        assert_eq!(decode(s.encode().unwrap().into()).unwrap(), s);
        let e = decode("1GiB".into()).unwrap_err();
        assert!(e.to_string().contains(RUN_SETTINGS_VAR), "{e}");
    }
}
