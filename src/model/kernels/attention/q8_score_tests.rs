//! q8_0 keys' integer scores: every path against the definition (`q8_dot`) bit for bit, the
//! definition against the exact dot product, and the whole attention call on a q8 cache: a
//! row's bits whichever call computes it, and its output close to f32 keys'.

use super::q8_query::Q8Queries;
use super::q8_scores::{q8_dot, run_scores, scaled_q8_dots};
use super::tests::{bits, noise, on_one_thread};
use super::{causal_attention, tree_attention, AttnShape, KvRows, Q8Rows};

/// A q8 cache of `n` elements: bytes over the whole range (±127 included), f16 scales of
/// several magnitudes.
struct Cache {
    quants: Vec<i8>,
    scales: Vec<f32>,
}

impl Cache {
    fn of(n: usize, k: usize) -> Self {
        let quants = (0..n)
            .map(|i| match i % 97 {
                0 => 127,
                1 => -127,
                _ => (noise(i * k + 1) * 254.0) as i8,
            })
            .collect();
        let scales = (0..n.div_ceil(32))
            .map(|b| half::f16::from_f32(0.002 + noise(b * k + 9).abs() * 0.03).to_f32())
            .collect();
        Self { quants, scales }
    }

    fn rows(&self) -> Q8Rows<'_> {
        Q8Rows::new(&self.quants, &self.scales)
    }
}

fn queries(len: usize, k: usize) -> (Vec<f32>, Q8Queries) {
    let q: Vec<f32> = (0..len).map(|i| 3.0 * noise(i * k + 5)).collect();
    let mut rounded = Q8Queries::default();
    rounded.quantize(&q);
    (q, rounded)
}

/// Scores by the definition, key by key.
fn defined(
    rounded: &Q8Queries,
    at: usize,
    dim: usize,
    keys: Q8Rows,
    stride: (usize, usize),
    n: usize,
) -> Vec<f32> {
    (0..n)
        .map(|j| q8_dot(rounded.query(at, dim), keys, j * stride.0 + stride.1) * 0.125)
        .collect()
}

/// Every path this CPU runs gives the definition's bits: the dispatching call, AVX2 and, on
/// AVX-512 VNNI, a chunk transposed for 1 to 11 queries (groups of 4 and what is left), at
/// head sizes 32 to 256 (96: a partial group of 16 words) and chunks of whole and partial
/// tiles of 16 keys.
#[test]
fn every_path_gives_the_definitions_bits() {
    for dim in [32, 64, 96, 128, 256] {
        for n in [1, 15, 16, 37, 64] {
            let (stride, offset) = (3 * dim, dim);
            let cache = Cache::of(n * stride, 7);
            let keys = cache.rows();
            let units = 11;
            let (_, rounded) = queries(units * dim, dim);
            let want: Vec<Vec<f32>> = (0..units)
                .map(|m| defined(&rounded, m * dim, dim, keys, (stride, offset), n))
                .collect();
            let mut got = vec![0f32; n];
            scaled_q8_dots(
                rounded.query(0, dim),
                keys,
                (stride, offset),
                0.125,
                &mut got,
            );
            assert_eq!(bits(&got), bits(&want[0]), "dispatched: {dim}, {n} keys");
            for count in [1, 3, 4, 8, 11] {
                let out_stride = n + 3;
                let mut out = vec![f32::NAN; count * out_stride];
                let query = |m: usize| rounded.query(m * dim, dim);
                let mut kt = Vec::new();
                let (rows, at) = (keys, (stride, offset));
                run_scores(
                    rows,
                    at,
                    n,
                    (count, &query),
                    0.125,
                    (&mut out, out_stride),
                    &mut kt,
                );
                for (m, want) in want.iter().enumerate().take(count) {
                    let row = &out[m * out_stride..][..out_stride];
                    assert_eq!(
                        bits(&row[..n]),
                        bits(want),
                        "run of {count}: unit {m}, {dim}, {n}"
                    );
                    assert!(row[n..].iter().all(|x| x.is_nan()), "wrote past {n}");
                }
            }
            #[cfg(target_arch = "x86_64")]
            if super::simd_available() {
                let mut avx2 = vec![0f32; n];
                let query = rounded.query(dim, dim);
                // SAFETY: AVX2 was checked; every key is inside the cache.
                unsafe {
                    super::q8_vnni::scaled_dots(query, keys, (stride, offset), 0.125, &mut avx2)
                };
                assert_eq!(bits(&avx2), bits(&want[1]), "avx2: {dim}, {n}");
            }
        }
    }
}

/// The VNNI kernels run on a CPU that has them (so the test above checked them).
#[cfg(target_arch = "x86_64")]
#[test]
fn the_vnni_path_runs_where_the_cpu_has_it() {
    let vnni = is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512bw");
    if vnni && super::wide_available() && std::env::var_os("TANDEM_DISABLE_VNNI").is_none() {
        assert_eq!(
            super::q8_vnni::Isa::best(),
            Some(super::q8_vnni::Isa::Avx512Vnni)
        );
    }
}

/// A query rounds to within half a step of each element, and the score is the exact dot
/// product of the rounded query with the key (computed in f64) up to f32 rounding: an error
/// far below the rounding of the query itself.
#[test]
fn the_definition_is_the_dot_product_of_the_rounded_query() {
    let dim = 128;
    let cache = Cache::of(40 * dim, 3);
    let keys = cache.rows();
    let (q, rounded) = queries(dim, 11);
    let query = rounded.query(0, dim);
    for b in 0..dim / 32 {
        let step = query.scales[b];
        for (i, (&x, &byte)) in q.iter().zip(query.quants).enumerate().skip(32 * b).take(32) {
            let back = f32::from(byte) * step;
            assert!((back - x).abs() <= 0.5 * step * 1.0001, "element {i}");
        }
        let sum: i32 = query.quants[32 * b..][..32]
            .iter()
            .map(|&x| i32::from(x))
            .sum();
        assert_eq!(query.sums[b], sum);
    }
    for j in 0..40 {
        let exact: f64 = (0..dim)
            .map(|i| {
                let x = f64::from(query.quants[i]) * f64::from(query.scales[i / 32]);
                x * f64::from(keys.get(j * dim + i))
            })
            .sum();
        let got = f64::from(q8_dot(query, keys, j * dim));
        assert!(
            (got - exact).abs() <= 1e-5 * (1.0 + exact.abs()),
            "key {j}: {got} against {exact}"
        );
    }
}

/// A query's elements round to the nearest step, ties to even, within ±127.
#[test]
fn query_elements_round_to_the_nearest_ties_to_even() {
    let mut q = vec![0f32; 32];
    // Largest magnitude 127: the scale is exactly 1.
    let cases = [
        (127.0, 127),
        (0.5, 0),
        (1.5, 2),
        (2.5, 2),
        (-0.5, 0),
        (-2.5, -2),
        (-3.5, -4),
        (126.49, 126),
        (-127.0, -127),
    ];
    for (i, &(x, _)) in cases.iter().enumerate() {
        q[i] = x;
    }
    let mut rounded = Q8Queries::default();
    rounded.quantize(&q);
    let query = rounded.query(0, 32);
    assert_eq!(query.scales[0], 1.0);
    for (i, &(x, want)) in cases.iter().enumerate() {
        assert_eq!(query.quants[i], want, "{x}");
    }
    let spread: Vec<f32> = (0..32).map(|i| 2.7 * noise(i + 400)).collect();
    rounded.quantize(&spread);
    let query = rounded.query(0, 32);
    for (i, &x) in spread.iter().enumerate() {
        let want = (x / query.scales[0]).round_ties_even().clamp(-127.0, 127.0) as i8;
        assert_eq!(query.quants[i], want, "{x}");
    }
}

/// A query of zeros scores 0 against every key; one holding a non-finite value scores NaN
/// (which the forward's finiteness check reports) on every path.
#[test]
fn zero_and_non_finite_queries() {
    let dim = 64;
    let cache = Cache::of(20 * dim, 5);
    let mut rounded = Q8Queries::default();
    let mut q = vec![0f32; dim];
    for non_finite in [false, true] {
        if non_finite {
            q[40] = f32::INFINITY;
        }
        rounded.quantize(&q);
        let mut got = vec![1f32; 20];
        let (keys, query) = (cache.rows(), rounded.query(0, dim));
        scaled_q8_dots(query, keys, (dim, 0), 0.125, &mut got);
        let want = |x: f32| if non_finite { x.is_nan() } else { x == 0.0 };
        assert!(got.iter().all(|&x| want(x)), "{got:?}");
    }
}

/// On a q8 cache a row's output has the same bits computed alone (a step at its position),
/// in a verification of several, in a prefill chunk, or as a token tree's chain, short of one
/// segment, past it and past the depth where a step's heads take turns along the cache rows;
/// and it stays close to the output over the same keys widened to f32
/// with the query unrounded.
#[test]
fn a_rows_bits_do_not_depend_on_the_call_that_computes_it() {
    let shape = AttnShape {
        num_heads: 9,
        num_kv_heads: 3,
        head_dim: 64,
    };
    let (q_dim, kv_dim) = (shape.q_dim(), shape.kv_dim());
    let total = 2300;
    let (keys, values) = (Cache::of(total * kv_dim, 3), Cache::of(total * kv_dim, 11));
    let wide = |c: &Cache| -> Vec<f32> { (0..total * kv_dim).map(|i| c.rows().get(i)).collect() };
    let (k32, v32) = (wide(&keys), wide(&values));
    let q_at = |pos: usize| -> Vec<f32> {
        (0..q_dim)
            .map(|i| 4.0 * noise(pos * q_dim + i + 77))
            .collect()
    };
    let call = |start: usize, n: usize| {
        let q: Vec<f32> = (start..start + n).flat_map(q_at).collect();
        let mut out = vec![0f32; n * q_dim];
        let kv = (start + n) * kv_dim;
        fn rows(c: &Cache, kv: usize) -> Q8Rows<'_> {
            Q8Rows::new(&c.quants[..kv], &c.scales[..kv / 32])
        }
        causal_attention(
            shape,
            &q,
            rows(&keys, kv),
            rows(&values, kv),
            (start, None),
            &mut out,
        );
        out
    };
    for (start, n) in [(150, 8), (0, 70), (505, 8), (1100, 8), (2250, 8), (2290, 2)] {
        let together = call(start, n);
        for i in 0..n {
            let alone = call(start + i, 1);
            assert_eq!(
                bits(&together[i * q_dim..][..q_dim]),
                bits(&alone),
                "start {start}, row {i} of {n}"
            );
            let one_thread = on_one_thread(|| call(start + i, 1));
            assert_eq!(
                bits(&one_thread),
                bits(&alone),
                "start {start}, row {i} on one thread"
            );
        }
        let q: Vec<f32> = (start..start + n).flat_map(q_at).collect();
        let paths: Vec<Vec<usize>> = (0..n).map(|i| (0..=i).collect()).collect();
        let mut tree = vec![0f32; n * q_dim];
        let (kr, vr) = (keys.rows(), values.rows());
        tree_attention(shape, &q, kr, vr, (start, None), &paths, &mut tree);
        assert_eq!(bits(&tree), bits(&together), "tree: start {start}, {n} new");
        let mut f32_keys = vec![0f32; n * q_dim];
        let kv = (start + n) * kv_dim;
        causal_attention(
            shape,
            &q,
            &k32[..kv],
            &v32[..kv],
            (start, None),
            &mut f32_keys,
        );
        let worst = f32_keys
            .iter()
            .zip(&together)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let size = f32_keys.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(
            worst <= 0.02 * size,
            "start {start}: {worst} against outputs up to {size}"
        );
    }
}
