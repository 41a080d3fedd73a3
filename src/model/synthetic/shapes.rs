//! The named Llama shapes a synthetic model can take: the default model's and the seeds'
//! (Llama-3.2-1B and -3B, Llama-3.1-8B), with the default model's 49,152-token vocabulary.

/// A Llama's sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub name: &'static str,
    pub hidden: usize,
    pub layers: usize,
    pub ffn: usize,
    pub heads: usize,
    pub kv_heads: usize,
    /// The output head is the embedding.
    pub tied: bool,
}

pub const SHAPES: [Shape; 4] = [
    Shape {
        name: "135m",
        hidden: 576,
        layers: 30,
        ffn: 1536,
        heads: 9,
        kv_heads: 3,
        tied: true,
    },
    Shape {
        name: "1b",
        hidden: 2048,
        layers: 16,
        ffn: 8192,
        heads: 32,
        kv_heads: 8,
        tied: true,
    },
    Shape {
        name: "3b",
        hidden: 3072,
        layers: 28,
        ffn: 8192,
        heads: 24,
        kv_heads: 8,
        tied: true,
    },
    Shape {
        name: "8b",
        hidden: 4096,
        layers: 32,
        ffn: 14336,
        heads: 32,
        kv_heads: 8,
        tied: false,
    },
];

impl Shape {
    /// The shape called `name` (case-insensitive), or a message naming the ones there are.
    pub fn named(name: &str) -> Result<Shape, String> {
        SHAPES
            .iter()
            .find(|s| s.name.eq_ignore_ascii_case(name))
            .copied()
            .ok_or_else(|| {
                let names: Vec<&str> = SHAPES.iter().map(|s| s.name).collect();
                format!(
                    "unknown shape '{name}' (expected one of {})",
                    names.join(", ")
                )
            })
    }

    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }
}
