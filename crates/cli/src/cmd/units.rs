//! Parsing of sizes (`64MiB`, `1GiB`, `4096`) and durations (`60s`, `500ms`, `2m`) given on the
//! command line, shared by every subcommand. Use them as clap value parsers:
//! `#[arg(long, value_parser = units::parse_size)]`.
//!
//! Sizes use binary units: `K`/`KiB`/`KB` = 1024 bytes, `M`/`MiB`/`MB` = 1024², `G`/`GiB`/`GB`
//! = 1024³, `T`/`TiB`/`TB` = 1024⁴ (case-insensitive); a number alone is bytes. A decimal
//! fraction is allowed when the result is a whole number of bytes (`1.5GiB`).
use std::time::Duration;

/// Parses a size in bytes. Errors say what was wrong and show a valid example.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let (num, unit) = number_and_unit(text);
    let mult: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => {
            return Err(format!(
                "bad size `{text}`: unknown unit `{other}`; use bytes or KiB, MiB, GiB, TiB (e.g. 64MiB)"
            ))
        }
    };
    scaled(num, mult).map_err(|why| format!("bad size `{text}`: {why} (e.g. 64MiB, 1GiB, 4096)"))
}

/// `1536` → `1.5 KiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// Parses a duration: a number with `ns`, `us`, `ms`, `s`, `m` or `h`; a number alone is seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let (num, unit) = number_and_unit(text);
    // Nanoseconds per unit.
    let ns_per_unit: u64 = match unit.as_str() {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "" | "s" | "sec" | "secs" => 1_000_000_000,
        "m" | "min" | "mins" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        other => {
            return Err(format!(
                "bad duration `{text}`: unknown unit `{other}`; use ms, s, m or h (e.g. 60s, 500ms)"
            ))
        }
    };
    scaled(num, ns_per_unit)
        .map(Duration::from_nanos)
        .map_err(|why| format!("bad duration `{text}`: {why} (e.g. 60s, 500ms, 2m)"))
}

/// Splits `  12.5 MiB ` into the number (`12.5`) and the unit, trimmed and lower-cased (`mib`).
fn number_and_unit(text: &str) -> (&str, String) {
    let t = text.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    (num, unit.trim().to_ascii_lowercase())
}

/// `num × mult`, exactly, where `num` is a decimal number with an optional fraction.
fn scaled(num: &str, mult: u64) -> Result<u64, String> {
    if num.is_empty() {
        return Err("no number".into());
    }
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty() || frac.contains('.') {
        return Err("not a number".into());
    }
    let too_big = || "too large".to_string();
    let int_v: u64 = if int.is_empty() {
        0
    } else {
        int.parse().map_err(|_| too_big())?
    };
    let mut total = int_v.checked_mul(mult).ok_or_else(too_big)?;
    if !frac.is_empty() {
        if frac.len() > 18 {
            return Err("too many decimal places".into());
        }
        let denom = 10u128.pow(frac.len() as u32);
        let f: u128 = frac.parse().map_err(|_| "not a number".to_string())?;
        let part = f * u128::from(mult);
        if !part.is_multiple_of(denom) {
            return Err("the fraction is not a whole number of units".into());
        }
        let part = u64::try_from(part / denom).map_err(|_| too_big())?;
        total = total.checked_add(part).ok_or_else(too_big)?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("1gb"), Ok(1 << 30));
        assert_eq!(parse_size(" 2 TiB "), Ok(2 << 40));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("512k"), Ok(512 << 10));
        assert_eq!(parse_size("0"), Ok(0));
    }

    #[test]
    fn bad_sizes_get_clear_errors() {
        for bad in [
            "",
            "MiB",
            "12XB",
            "1.2.3GiB",
            "-5MiB",
            "99999999999TiB",
            "1.3B",
            "abc",
        ] {
            let err = parse_size(bad).unwrap_err();
            assert!(err.contains("bad size"), "{bad}: {err}");
        }
        assert!(parse_size("12XB")
            .unwrap_err()
            .contains("unknown unit `xb`"));
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("60"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
    }

    #[test]
    fn bad_durations_get_clear_errors() {
        for bad in [
            "",
            "s",
            "5 parsecs",
            "1.2.3s",
            "-1s",
            "99999999999999999999h",
        ] {
            let err = parse_duration(bad).unwrap_err();
            assert!(err.contains("bad duration"), "{bad}: {err}");
        }
    }
}
