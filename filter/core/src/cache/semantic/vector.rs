//! Embedding vectors as the index keeps them: normalised, then quantised to
//! one signed byte per dimension, and compared by cosine similarity.
//!
//! Quantisation: for a unit vector `v` with largest magnitude `m`, the step is
//! `s = m / 127` and `q_i = round(v_i / s)`, so each component is off by at
//! most `s / 2` and the whole vector by `e ≤ √d · s / 2`. Cosine similarity is
//! scale-free, so the stored `q` needs no scale: `cos(a, q) = a·q / |q|`, and
//! for a unit query `a` it is off from the exact `a·v` by at most `2e` (the
//! dot product moves by at most `e`, the norm of `q·s` by at most `e`). Real
//! rounding errors are independent, so the typical error is far smaller; the
//! unit tests check both.

/// Quantisation levels on each side of zero.
const LEVELS: f32 = 127.0;

/// A vector scaled to length 1; `None` when it has no direction (all zeros)
/// or a value that is not a finite number.
pub fn normalise(v: &[f32]) -> Option<Vec<f32>> {
    if v.is_empty() || v.iter().any(|x| !x.is_finite()) {
        return None;
    }
    let norm = v
        .iter()
        .map(|x| f64::from(*x) * f64::from(*x))
        .sum::<f64>()
        .sqrt();
    if norm == 0.0 || !norm.is_finite() {
        return None;
    }
    Some(v.iter().map(|x| (f64::from(*x) / norm) as f32).collect())
}

/// A unit vector quantised to `i8`, with the length of the quantised vector
/// (so a scan needs one multiply-add per dimension).
#[derive(Debug, Clone, PartialEq)]
pub struct Quantised {
    /// One signed byte per dimension.
    pub values: Vec<i8>,
    /// `|values|`, as integers.
    pub norm: f32,
}

/// Quantises a unit vector (see the module's note).
pub fn quantise(unit: &[f32]) -> Quantised {
    let max = unit.iter().fold(0f32, |m, x| m.max(x.abs()));
    let step = if max > 0.0 { max / LEVELS } else { 1.0 };
    let values: Vec<i8> = unit
        .iter()
        .map(|x| (x / step).round().clamp(-LEVELS, LEVELS) as i8)
        .collect();
    Quantised {
        norm: norm_i8(&values),
        values,
    }
}

/// The length of a quantised vector.
pub fn norm_i8(values: &[i8]) -> f32 {
    let sq: i64 = values.iter().map(|q| i64::from(*q) * i64::from(*q)).sum();
    (sq as f64).sqrt() as f32
}

/// Cosine similarity of a unit query and a stored vector (`values` read as
/// `i8`, of length `norm`), clamped to `[-1, 1]`; `None` when the lengths
/// differ or the stored vector is all zeros.
pub fn similarity(query: &[f32], values: &[u8], norm: f32) -> Option<f32> {
    if query.len() != values.len() || norm.is_nan() || norm <= 0.0 {
        return None;
    }
    Some((dot(query, values) / norm).clamp(-1.0, 1.0))
}

/// `query · values` (values read as `i8`) over eight independent sums, which
/// the compiler can keep in vector registers: the scan's whole cost.
fn dot(query: &[f32], values: &[u8]) -> f32 {
    const LANES: usize = 8;
    let mut acc = [0f32; LANES];
    let (qs, vs) = (query.chunks_exact(LANES), values.chunks_exact(LANES));
    let tail: f32 = qs
        .remainder()
        .iter()
        .zip(vs.remainder())
        .map(|(a, q)| a * f32::from(*q as i8))
        .sum();
    for (q, v) in qs.zip(vs) {
        for ((acc, a), b) in acc.iter_mut().zip(q).zip(v) {
            *acc += a * f32::from(*b as i8);
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// A similarity in thousandths, `0..=1000` (negative ones are 0), for the
/// response header and the histogram.
pub fn permille(similarity: f32) -> u64 {
    (similarity.clamp(0.0, 1.0) * 1000.0).round() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic pseudo-random unit vectors.
    fn random_unit(seed: u64, d: usize) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let v: Vec<f32> = (0..d)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
            })
            .collect();
        normalise(&v).unwrap()
    }

    fn bytes(q: &Quantised) -> Vec<u8> {
        q.values.iter().map(|v| *v as u8).collect()
    }

    fn exact(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    #[test]
    fn normalise_refuses_what_has_no_direction() {
        assert_eq!(normalise(&[]), None);
        assert_eq!(normalise(&[0.0, 0.0]), None);
        assert_eq!(normalise(&[1.0, f32::NAN]), None);
        assert_eq!(normalise(&[f32::INFINITY]), None);
        let u = normalise(&[3.0, 4.0]).unwrap();
        assert!((u[0] - 0.6).abs() < 1e-6 && (u[1] - 0.8).abs() < 1e-6);
        // Huge values do not overflow the norm.
        let u = normalise(&[f32::MAX, f32::MAX]).unwrap();
        assert!((u[0] - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-6);
    }

    #[test]
    fn a_vector_is_most_similar_to_itself() {
        for d in [1, 2, 8, 384, 1536] {
            let v = random_unit(d as u64, d);
            let q = quantise(&v);
            let s = similarity(&v, &bytes(&q), q.norm).unwrap();
            assert!(s > 0.999, "{d}: {s}");
            let neg: Vec<f32> = v.iter().map(|x| -x).collect();
            assert!(similarity(&neg, &bytes(&q), q.norm).unwrap() < -0.999);
        }
    }

    #[test]
    fn quantisation_error_stays_within_its_bound() {
        let mut worst_typical = 0f32;
        for d in [8usize, 64, 384, 768, 1536, 3072] {
            for seed in 0..20u64 {
                let a = random_unit(seed * 7919 + 1, d);
                // Vectors near `a` and far from it.
                let b = random_unit(seed * 104_729 + 2, d);
                let near: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + 0.2 * y).collect();
                let near = normalise(&near).unwrap();
                for v in [near, b] {
                    let q = quantise(&v);
                    let m = v.iter().fold(0f32, |m, x| m.max(x.abs()));
                    let bound = 2.0 * (d as f32).sqrt() * (m / 127.0) / 2.0;
                    let got = similarity(&a, &bytes(&q), q.norm).unwrap();
                    let err = (got - exact(&a, &v)).abs();
                    assert!(err <= bound + 1e-5, "d={d} seed={seed}: {err} > {bound}");
                    worst_typical = worst_typical.max(err);
                }
            }
        }
        // In practice the error is far below the bound: well under the gap
        // between any two thresholds worth choosing.
        assert!(worst_typical < 0.005, "{worst_typical}");
    }

    #[test]
    fn mismatched_or_empty_vectors_do_not_compare() {
        let q = quantise(&[1.0, 0.0]);
        assert_eq!(similarity(&[1.0], &bytes(&q), q.norm), None);
        assert_eq!(similarity(&[1.0, 0.0], &[0, 0], 0.0), None);
        assert_eq!(similarity(&[1.0, 0.0], &[0, 0], f32::NAN), None);
        assert_eq!(quantise(&[0.0, 0.0]).norm, 0.0);
    }

    #[test]
    fn permille_is_clamped() {
        assert_eq!(permille(0.9504), 950);
        assert_eq!(permille(1.2), 1000);
        assert_eq!(permille(-0.5), 0);
        assert_eq!(permille(f32::NAN), 0);
    }
}
