//! The median every part of parbench reports (pipeline steps, link
//! matrices, the report's curves and comparisons): written once so that
//! two tables never disagree on what "median" means.

/// The median of `v`, sorted in place: the middle value, or the mean of the
/// two middle ones for an even count; `None` for an empty slice.
pub fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The median of the finite values among `v` (a missing figure is NaN and
/// must not pull the curve); NaN when none is finite.
pub fn median_of_finite(v: impl IntoIterator<Item = f64>) -> f64 {
    let mut finite: Vec<f64> = v.into_iter().filter(|x| x.is_finite()).collect();
    median(&mut finite).unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), Some(2.5));
    }

    #[test]
    fn only_finite_values_count() {
        assert!(median_of_finite([f64::NAN, f64::INFINITY]).is_nan());
        assert_eq!(median_of_finite([f64::NAN, 5.0, 1.0, 3.0]), 3.0);
        assert_eq!(median_of_finite([2.0, f64::NAN, 4.0]), 3.0);
    }
}
