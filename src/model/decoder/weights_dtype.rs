//! The weight types a model's linear layers can be loaded as: the file's own (the default), or a
//! deliberate conversion named by `--weights-dtype`.

use std::str::FromStr;

use candle_core::quantized::GgmlDType;

/// The type linear weights are converted to when a model is loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WeightsDtype {
    /// Keep the file's own type (a Q4_1 GGUF stays Q4_1; safetensors keep F32/F16/BF16).
    #[default]
    AsIs,
    /// Keep weights the file already quantized (a Q4_1 GGUF stays Q4_1, on our 4-bit kernel)
    /// and convert float ones (F32, F16, BF16) to Q8_0: the file's own numbers where its
    /// publisher chose a quantization, the fast 8-bit kernel where it did not. The default
    /// model steps 1.6–1.8x faster as-is than converted to Q8_0, on exactly its weights.
    /// On a GPU, f16 (`Decoder::load_on`: candle's quantized kernels there are not
    /// batch-invariant).
    Auto,
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    /// Q4_1 (the default model's own type: loaded as it is, no weight is re-rounded).
    Q4_1,
    /// Q4_K; rows whose length is not a multiple of 256 fall back to Q4_0.
    Q4K,
}

impl WeightsDtype {
    pub const NAMES: &'static [&'static str] = &[
        "as-is", "auto", "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q4k",
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::AsIs => "as-is",
            Self::Auto => "auto",
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::BF16 => "bf16",
            Self::Q8_0 => "q8_0",
            Self::Q4_0 => "q4_0",
            Self::Q4_1 => "q4_1",
            Self::Q4K => "q4k",
        }
    }

    /// The ggml type a weight of type `src` with rows of `k` values ends up as.
    pub fn target(self, src: GgmlDType, k: usize) -> GgmlDType {
        let want = match self {
            Self::AsIs => src,
            Self::Auto => match src {
                GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => GgmlDType::Q8_0,
                quantized => quantized,
            },
            Self::F32 => GgmlDType::F32,
            Self::F16 => GgmlDType::F16,
            Self::BF16 => GgmlDType::BF16,
            Self::Q8_0 => GgmlDType::Q8_0,
            Self::Q4_0 => GgmlDType::Q4_0,
            Self::Q4_1 => GgmlDType::Q4_1,
            Self::Q4K => GgmlDType::Q4K,
        };
        if k.is_multiple_of(want.block_size()) {
            want
        } else if want == GgmlDType::Q4K && k.is_multiple_of(GgmlDType::Q4_0.block_size()) {
            GgmlDType::Q4_0
        } else {
            GgmlDType::F32
        }
    }
}

impl std::fmt::Display for WeightsDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for WeightsDtype {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "as-is" | "asis" | "as_is" | "native" => Self::AsIs,
            "auto" => Self::Auto,
            "f32" => Self::F32,
            "f16" => Self::F16,
            "bf16" => Self::BF16,
            "q8_0" | "q8" => Self::Q8_0,
            "q4_0" => Self::Q4_0,
            "q4_1" => Self::Q4_1,
            "q4k" | "q4_k" => Self::Q4K,
            other => {
                return Err(format!(
                    "unknown weights dtype '{other}' (expected one of {})",
                    Self::NAMES.join(", ")
                ))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{GgmlDType, WeightsDtype};

    #[test]
    fn auto_keeps_quantized_weights_and_converts_float_ones_to_q8_0() {
        let auto: WeightsDtype = "auto".parse().unwrap();
        assert_eq!(auto, WeightsDtype::Auto);
        for q in [GgmlDType::Q4_1, GgmlDType::Q8_0, GgmlDType::Q4K] {
            assert_eq!(auto.target(q, 768), q);
        }
        for f in [GgmlDType::F32, GgmlDType::F16, GgmlDType::BF16] {
            assert_eq!(auto.target(f, 768), GgmlDType::Q8_0);
        }
        // Rows that no 32-value block fits stay f32, as for an explicit q8_0.
        assert_eq!(auto.target(GgmlDType::F16, 40), GgmlDType::F32);
        assert_eq!(
            WeightsDtype::AsIs.target(GgmlDType::F16, 576),
            GgmlDType::F16
        );
    }
}
