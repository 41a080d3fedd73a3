//! The packed weights of one K-quant format, as every kernel of it reads them.

/// One format's tiles: column tile `t`'s super-block `b` at `t · (k / 256) + b`, for an
/// `(n, k)` weight.
pub(crate) struct Grid<T> {
    pub(crate) tiles: Vec<T>,
    pub(crate) n: usize,
    pub(crate) k: usize,
}
