//! The checked number of alternative nodes a round may add beside its drafted chain.
//!
//! Why it exists: like γ and lenience, the knob arrives at several boundaries (the config
//! file, the admin API, a request, a bench mode) and its rule depends on the engine (a tree
//! holds its chain too, so it must stay below `engine.max_gamma`); one type checks it once, and
//! everything past the boundary holds a value that is already right.

use serde::Serialize;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct TreeNodes(usize);

impl TreeNodes {
    /// Chains only.
    pub const NONE: TreeNodes = TreeNodes(0);

    /// `n` alternative nodes, within an engine whose largest γ is `gamma_limit`.
    pub fn within(n: usize, gamma_limit: usize) -> Result<Self, String> {
        if n >= gamma_limit {
            return Err(format!(
                "must be < {gamma_limit} (engine.max_gamma: a tree holds its chain too), got {n}"
            ));
        }
        Ok(Self(n))
    }

    pub fn get(self) -> usize {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::TreeNodes;

    #[test]
    fn below_the_engines_largest_gamma() {
        assert_eq!(TreeNodes::within(7, 8).unwrap().get(), 7);
        assert_eq!(TreeNodes::within(0, 1).unwrap(), TreeNodes::NONE);
        let e = TreeNodes::within(8, 8).unwrap_err();
        assert!(e.contains("must be < 8"), "{e}");
    }
}
