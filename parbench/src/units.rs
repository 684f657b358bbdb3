//! Byte counts as people read them, with binary prefixes (what nccl-tests
//! users write: 8 B, 1 KiB, 64 MiB). One walk up the prefixes, two ways to
//! show the result: [`bytes`] for tables and axes (exact sizes without
//! decimals), [`bytes_text`] for messages (always one decimal, so that two
//! figures side by side read alike: "need 64.0 GiB, have 23.4 GiB").

const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

/// `n` in the largest binary unit that keeps it at least 1 (at most PiB),
/// and that unit's index in [`UNITS`].
fn scaled(n: f64) -> (f64, usize) {
    let mut v = n;
    let mut unit = 0;
    while v.abs() >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    (v, unit)
}

/// A byte count with a binary prefix: `8 B`, `1 KiB`, `1.50 MiB`, `64 MiB`;
/// `-` for a missing (non-finite) figure.
pub fn bytes(n: f64) -> String {
    if !n.is_finite() {
        return "-".into();
    }
    let (v, unit) = scaled(n);
    if v.abs() >= 1e6 {
        // Beyond a million PiB no buffer is: a broken figure, kept short.
        format!("{n:.2e} B")
    } else if unit == 0 || (v.fract()).abs() < 1e-9 {
        format!("{v:.0} {}", UNITS[unit])
    } else if v.abs() < 10.0 {
        format!("{v:.2} {}", UNITS[unit])
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// Bytes in a message: `512 B`, `64.0 KiB`, `2.5 GiB`, `2.3 TiB`.
pub fn bytes_text(b: u128) -> String {
    let (v, unit) = scaled(b as f64);
    if unit == 0 {
        format!("{b} B")
    } else if v >= 1e6 {
        format!("{:.2e} B", b as f64)
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// A number as a message quotes it: as written where that is short
/// (`0.5`, `400`), else in exponent form (`1e-300`, `1e30`), so that one
/// line stays one line whatever was typed.
pub fn number_text(v: f64) -> String {
    let plain = format!("{v}");
    if plain.len() <= 12 {
        plain
    } else {
        format!("{v:e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_numbers_stay_short() {
        assert_eq!(number_text(0.5), "0.5");
        assert_eq!(number_text(400.0), "400");
        assert_eq!(number_text(1e-300), "1e-300");
        assert_eq!(number_text(1e30), "1e30");
        assert_eq!(number_text(f64::INFINITY), "inf");
    }

    #[test]
    fn table_sizes_drop_the_decimals_of_exact_ones() {
        assert_eq!(bytes(8.0), "8 B");
        assert_eq!(bytes(8.0 * 1024.0), "8 KiB");
        assert_eq!(bytes(1.5 * 1048576.0), "1.50 MiB");
        assert_eq!(bytes(100.5 * 1048576.0), "100.5 MiB");
        assert_eq!(bytes(f64::NAN), "-");
        assert_eq!(bytes(1e300), "1.00e300 B");
        assert_eq!(bytes_text(u128::MAX), "3.40e38 B");
    }

    #[test]
    fn message_sizes_keep_one_decimal() {
        assert_eq!(bytes_text(1000), "1000 B");
        assert_eq!(bytes_text(1536), "1.5 KiB");
        assert_eq!(bytes_text(1 << 50), "1.0 PiB");
        assert_eq!(bytes_text(1 << 60), "1024.0 PiB");
    }
}
