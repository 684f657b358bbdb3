//! How sizes and times read in tables and on axes: binary sizes the way
//! nccl-tests users write them (8 B, 1 KiB, 64 MiB), times in the unit that
//! keeps three significant figures.

pub use parbench::units::bytes;

/// Beyond the records' largest figure nothing a table shows is a
/// measurement: a figure computed past it (a ratio to a tiny baseline) is
/// shown in exponent form, so it cannot widen a table by hundreds of
/// digits.
const EXPONENT_FROM: f64 = parbench::results::FIGURE_MAX;

/// Microseconds shown in us, ms or s, whichever keeps the number readable.
pub fn micros(us: f64) -> String {
    if !us.is_finite() {
        return "-".into();
    }
    let a = us.abs();
    if a >= EXPONENT_FROM {
        format!("{:.2e} s", us / 1e6)
    } else if a >= 1e6 {
        format!("{:.3} s", us / 1e6)
    } else if a >= 1e3 {
        format!("{:.3} ms", us / 1e3)
    } else if a >= 100.0 {
        format!("{us:.0} us")
    } else if a >= 10.0 {
        format!("{us:.1} us")
    } else {
        format!("{us:.2} us")
    }
}

/// A number with up to three significant figures and no trailing zeros
/// (axis ticks: 1, 2.5, 10, 0.125).
pub fn short(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    if v == 0.0 {
        return "0".into();
    }
    // Below a millionth, three significant figures would be a row of zeros.
    if v.abs() >= EXPONENT_FROM || v.abs() < 1e-6 {
        return format!("{v:.2e}");
    }
    let digits = (2 - v.abs().log10().floor() as i32).max(0) as usize;
    let s = format!("{v:.digits$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// Microseconds for an axis tick: `1 us`, `250 us`, `2.5 ms`, `1 s`.
pub fn micros_tick(us: f64) -> String {
    let a = us.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1e6 {
        format!("{} s", short(us / 1e6))
    } else if a >= 1e3 {
        format!("{} ms", short(us / 1e3))
    } else {
        format!("{} us", short(us))
    }
}

/// A fraction as a percentage with one decimal.
pub fn percent(f: f64) -> String {
    let p = f * 100.0;
    if !p.is_finite() {
        "-".into()
    } else if p.abs() >= EXPONENT_FROM {
        format!("{p:.2e}%")
    } else {
        format!("{p:.1}%")
    }
}

/// A change as a signed percentage with one decimal: `+4.2%`.
pub fn signed_percent(f: f64) -> String {
    let p = f * 100.0;
    if p.is_finite() && p.abs() >= EXPONENT_FROM {
        format!("{p:+.2e}%")
    } else {
        format!("{p:+.1}%")
    }
}

/// A number with three significant figures (for GB/s and ratios).
pub fn sig3(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= EXPONENT_FROM {
        format!("{v:.2e}")
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_like_nccl_tests() {
        assert_eq!(bytes(8.0), "8 B");
        assert_eq!(bytes(1024.0), "1 KiB");
        assert_eq!(bytes(1048576.0), "1 MiB");
        assert_eq!(bytes(64.0 * 1048576.0), "64 MiB");
        assert_eq!(bytes(1.5 * 1048576.0), "1.50 MiB");
        assert_eq!(bytes(1000.0), "1000 B");
    }

    #[test]
    fn times_pick_their_unit() {
        assert_eq!(micros(1.234), "1.23 us");
        assert_eq!(micros(400.0), "400 us");
        assert_eq!(micros(6400.0), "6.400 ms");
        assert_eq!(percent(0.75), "75.0%");
        assert_eq!(sig3(0.4), "0.400");
        assert_eq!(micros_tick(1000.0), "1 ms");
        assert_eq!(micros_tick(2500.0), "2.5 ms");
        assert_eq!(micros_tick(10.0), "10 us");
        assert_eq!(short(12.5), "12.5");
        assert_eq!(short(0.125), "0.125");
    }

    #[test]
    fn a_figure_no_measurement_reaches_stays_short() {
        assert_eq!(sig3(1e300), "1.00e300");
        assert_eq!(short(-1e300), "-1.00e300");
        assert_eq!(short(1e-298), "1.00e-298");
        assert_eq!(micros(1e300), "1.00e294 s");
        assert_eq!(signed_percent(1e298), "+1.00e300%");
        assert_eq!(percent(1e298), "1.00e300%");
        assert_eq!(signed_percent(0.042), "+4.2%");
        // Real figures keep their digits.
        assert_eq!(sig3(2262410.0), "2262410");
        assert_eq!(micros(3.6e9), "3600.000 s");
    }
}
