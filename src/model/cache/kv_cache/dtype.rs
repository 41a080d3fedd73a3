//! The KV cache's element type: f16 (the default, half the reads and the memory) or f32.

use std::str::FromStr;

/// Element type of a KV cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvDtype {
    /// Exactly the projections' values.
    #[default]
    F32,
    /// Rounded to half precision (to nearest, ties to even) when appended.
    F16,
}

impl KvDtype {
    pub fn size_of(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
        }
    }
}

impl FromStr for KvDtype {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(KvDtype::F32),
            "f16" => Ok(KvDtype::F16),
            _ => Err(format!("unknown KV cache type {s:?} (expected f32 or f16)")),
        }
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
        })
    }
}
