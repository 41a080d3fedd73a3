//! What the attention kernels share, so that the scalar definitions and the vector kernels
//! agree bit for bit: the rows they read ([`KvRows`]: f32, f16, bf16 or q8_0), the fixed eight-lane
//! reduction ([`lane_sum`], and [`reduce_eight_keys`] for eight keys in registers); the
//! softmax exponential is `crate::model::kernels::fast_exp`'s; `accumulate_values` written
//! once for the AVX2 and AVX-512 widths; the prefetch of the rows a kernel reads next
//! (`prefetch_row`); and whether the vector paths may run on this CPU. A leaf: it imports no
//! kernel.

/// How a [`KvRows`] stores its elements.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum KvForm {
    F32,
    /// IEEE half precision: the vector paths widen it as they load, by one instruction.
    F16,
    /// bfloat16 (f32's upper half): its own arithmetic, on bf16 pairs (`bf16_pairs`).
    Bf16,
    /// Signed bytes, each 32 of them (from the view's first row) with one f32 scale: an
    /// element is `scale · q`, exact in f32 (see [`Q8Rows`]).
    Q8,
}

impl KvForm {
    /// Bytes an element takes where it is stored (a q8_0 block's scale apart).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(super) const fn element_bytes(self) -> usize {
        match self {
            KvForm::F32 => 4,
            KvForm::F16 | KvForm::Bf16 => 2,
            KvForm::Q8 => 1,
        }
    }
}

/// A layer's cached keys or values as attention reads them, token-major: element `i` (counted
/// from the view's start) widened to f32. Every form widens exactly, so the arithmetic on
/// widened elements, and its bits, are those of f32 rows holding the same numbers.
pub trait KvRows: Copy + Send + Sync {
    const FORM: KvForm;
    /// Elements from the view's start.
    fn elements(self) -> usize;
    /// The view from element `from` on.
    fn skip(self, from: usize) -> Self;
    /// Element `i` as f32.
    fn get(self, i: usize) -> f32;
    /// Where element 0 is stored: f32, f16 bits or i8, as `FORM` says.
    fn base(self) -> *const u8;
    /// The q8 scale of element `i` (0 for other forms).
    ///
    /// # Safety
    /// `i` is inside the view.
    unsafe fn scale(self, i: usize) -> f32;
    /// Where the q8 scale of the view's first block is stored (null for other forms): element
    /// `i`'s scale is at `i / 32` from it when the view starts at a block, as every view
    /// attention reads does.
    fn scale_base(self) -> *const f32;
}

macro_rules! float_rows {
    ($t:ty, $form:ident, $widen:expr) => {
        impl KvRows for &[$t] {
            const FORM: KvForm = KvForm::$form;
            #[inline]
            fn elements(self) -> usize {
                self.len()
            }
            #[inline]
            fn skip(self, from: usize) -> Self {
                &self[from..]
            }
            #[inline]
            fn get(self, i: usize) -> f32 {
                $widen(self[i])
            }
            #[inline]
            fn base(self) -> *const u8 {
                self.as_ptr().cast()
            }
            #[inline]
            unsafe fn scale(self, _: usize) -> f32 {
                0.0
            }
            #[inline]
            fn scale_base(self) -> *const f32 {
                std::ptr::null()
            }
        }
    };
}
float_rows!(f32, F32, |x: f32| x);
float_rows!(half::f16, F16, |x: half::f16| x.to_f32());
float_rows!(half::bf16, Bf16, |x: half::bf16| x.to_f32());

/// A q8_0 cache's keys or values: `quants[i]` scaled by `scales[i / 32]` (indices from the
/// buffer's first element), viewed from element `start`.
#[derive(Clone, Copy, Debug)]
pub struct Q8Rows<'a> {
    quants: &'a [i8],
    scales: &'a [f32],
    start: usize,
}

impl<'a> Q8Rows<'a> {
    /// Elements per scale.
    pub const BLOCK: usize = 32;

    /// The whole buffer; `scales` covers every element (one per started block of 32).
    pub fn new(quants: &'a [i8], scales: &'a [f32]) -> Self {
        assert!(quants.len().div_ceil(Self::BLOCK) <= scales.len());
        Self {
            quants,
            scales,
            start: 0,
        }
    }
}

impl KvRows for Q8Rows<'_> {
    const FORM: KvForm = KvForm::Q8;
    #[inline]
    fn elements(self) -> usize {
        self.quants.len() - self.start
    }
    #[inline]
    fn skip(self, from: usize) -> Self {
        assert!(from <= self.elements());
        Self {
            start: self.start + from,
            ..self
        }
    }
    #[inline]
    fn get(self, i: usize) -> f32 {
        let at = self.start + i;
        f32::from(self.quants[at]) * self.scales[at / Self::BLOCK]
    }
    #[inline]
    fn base(self) -> *const u8 {
        // In bounds: `skip` keeps `start` at most the length.
        self.quants.as_ptr().wrapping_add(self.start).cast()
    }
    #[inline]
    unsafe fn scale(self, i: usize) -> f32 {
        *self.scales.get_unchecked((self.start + i) / Self::BLOCK)
    }
    #[inline]
    fn scale_base(self) -> *const f32 {
        debug_assert!(self.start.is_multiple_of(Self::BLOCK));
        // In bounds or one past: `new` checked the scales cover every started block.
        self.scales.as_ptr().wrapping_add(self.start / Self::BLOCK)
    }
}

/// Whether the AVX-512 attention kernels may run: the f16 kernel's switch
/// (`TANDEM_DISABLE_AVX512=1` turns both off).
#[cfg(target_arch = "x86_64")]
pub(super) fn wide_available() -> bool {
    crate::model::kernels::float_gemm::wide_available()
}

/// Whether the AVX2 attention kernels may run (AVX2, FMA and F16C; `TANDEM_DISABLE_AVX2=1`
/// turns them off, and every other vector path with them).
#[cfg(target_arch = "x86_64")]
pub(super) fn simd_available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        crate::model::kernels::packed_gemm::enabled("TANDEM_DISABLE_AVX2", || {
            is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
        })
    })
}

/// How many rows ahead the kernels ask for the key or value rows they will read. Without it a
/// deep context's step waited on memory for each row: with it a 1-token step took 12-15% less
/// time at depth 8184 and 17% less at 2048 (f16 cache, SmolLM2, the two forms interleaved in
/// one process). On Sapphire Rapids 8, 16, 32 and 64 rows ahead were timed, 16 and 32 the
/// best; on Zen 5, 64 and 32 beat 16 by 2-8% and 1-5% at depths 2048 and 8184 (128 gained less,
/// 8 lost): 32 is the best both machines share. A row there takes about 20 ns, a memory access
/// several times that.
#[cfg(target_arch = "x86_64")]
pub(super) const PREFETCH_ROWS: usize = 32;

/// Asks for the `dim` elements of `rows` from element `i` to be brought into L1. A prefetch
/// never faults, so `i` may lie past the view's end (the next chunk's rows, usually).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn prefetch_row<K: KvRows>(rows: K, i: usize, dim: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let bytes = K::FORM.element_bytes();
    let p = rows.base().wrapping_add(i * bytes).cast::<i8>();
    for line in (0..dim * bytes).step_by(64) {
        // SAFETY: a prefetch reads nothing a program can see and never faults, whatever the
        // address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(line)) };
    }
}

/// The fixed reduction of eight lanes: `((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7))`.
#[inline]
pub(super) fn lane_sum(a: &[f32; 8]) -> f32 {
    ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]))
}

/// The end of the vector softmaxes: the eight-lane sum of the whole blocks of eight (`lanes`)
/// reduced by [`lane_sum`], then the keys after them (`tail`) turned into weights and added one
/// by one, as the scalar definition does.
#[inline]
pub(super) fn softmax_tail(lanes: &[f32; 8], tail: &mut [f32], max: f32) -> f32 {
    let mut sum = lane_sum(lanes);
    for s in tail {
        *s = crate::model::kernels::fast_exp::softmax_exp(*s - max);
        sum += *s;
    }
    sum
}

/// Eight keys' eight-lane partial sums reduced to their eight scores, in key order, pairing
/// the lanes as [`lane_sum`] does.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) unsafe fn reduce_eight_keys(
    a: [std::arch::x86_64::__m256; 8],
) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // x_i = a_i + a_(i+4) for two accumulators at once: [A.x0..x3, B.x0..x3].
    let fold = |a: __m256, b: __m256| {
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(a, b),
            _mm256_permute2f128_ps::<0x31>(a, b),
        )
    };
    // hadd pairs (x0 + x1), (x2 + x3) within each key, then their sums: lanes come out as
    // keys [0, 2, 4, 6, 1, 3, 5, 7], put back in order by one permute.
    let h0 = _mm256_hadd_ps(fold(a[0], a[1]), fold(a[2], a[3]));
    let h1 = _mm256_hadd_ps(fold(a[4], a[5]), fold(a[6], a[7]));
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    _mm256_permutevar8x32_ps(_mm256_hadd_ps(h0, h1), order)
}

/// `accumulate_values` for one vector width (AVX2's 8 lanes, AVX-512's 16): each 4-register
/// block of the even and odd value sums takes the weighted value rows two at a time, the same
/// fused multiply-adds in the same order at either width (and as the scalar definition), so the
/// results are the same bits. `$load(rows, i)` reads one register from element `i` as f32.
macro_rules! accumulate_values_at_width {
    ($(#[$doc:meta])* $features:literal, $vec:ty, $w:literal, $loadu:ident, $storeu:ident,
     $set1:ident, $fmadd:ident, $load:ident) => {
        $(#[$doc])*
        #[target_feature(enable = $features)]
        pub(super) unsafe fn accumulate_values<K: KvRows>(
            weights: &[f32],
            values: K,
            stride: usize,
            offset: usize,
            acc: &mut [f32],
        ) {
            const BLOCK: usize = 4 * $w;
            let dim = acc.len() / 2;
            let n = weights.len();
            for block in 0..dim / BLOCK {
                let vp = offset + block * BLOCK;
                let ep = acc.as_mut_ptr().add(block * BLOCK);
                let op = acc.as_mut_ptr().add(dim + block * BLOCK);
                let mut even: [$vec; 4] = std::array::from_fn(|r| $loadu(ep.add(r * $w)));
                let mut odd: [$vec; 4] = std::array::from_fn(|r| $loadu(op.add(r * $w)));
                let mut j = 0;
                while j + 2 <= n {
                    let (we, wo) = ($set1(weights[j]), $set1(weights[j + 1]));
                    let (ve, vo) = (vp + j * stride, vp + (j + 1) * stride);
                    prefetch_row(values, ve + PREFETCH_ROWS * stride, BLOCK);
                    prefetch_row(values, vo + PREFETCH_ROWS * stride, BLOCK);
                    for r in 0..4 {
                        even[r] = $fmadd(we, $load(values, ve + r * $w), even[r]);
                        odd[r] = $fmadd(wo, $load(values, vo + r * $w), odd[r]);
                    }
                    j += 2;
                }
                if j < n {
                    let we = $set1(weights[j]);
                    let ve = vp + j * stride;
                    for (r, e) in even.iter_mut().enumerate() {
                        *e = $fmadd(we, $load(values, ve + r * $w), *e);
                    }
                }
                for r in 0..4 {
                    $storeu(ep.add(r * $w), even[r]);
                    $storeu(op.add(r * $w), odd[r]);
                }
            }
        }
    };
}
pub(super) use accumulate_values_at_width;

/// Calls `$group!(m, M)` for the units `0..$units` in runs of `M` = 4 from `m = 0` on, the
/// last run of what is left (1 to 4): the transposed-key kernels score four queries at a time.
#[cfg(target_arch = "x86_64")]
macro_rules! in_fours {
    ($units:expr, $group:ident) => {{
        let units = $units;
        let mut m = 0;
        while m < units {
            match units - m {
                1 => $group!(m, 1),
                2 => $group!(m, 2),
                3 => $group!(m, 3),
                _ => $group!(m, 4),
            }
            m += (units - m).min(4);
        }
    }};
}
#[cfg(target_arch = "x86_64")]
pub(super) use in_fours;
