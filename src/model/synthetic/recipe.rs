//! Which ggml type each weight of a Llama GGUF gets under a named recipe: one type for every
//! matrix, or llama.cpp's `Q4_K_M` and `Q5_K_M` mixes, whose rules this follows (for a Llama
//! without experts) so that a file made here holds the types a downloaded one does.

use std::str::FromStr;

use candle_core::quantized::GgmlDType;

use crate::model::load::weight_roles::WeightName;

/// A file's weight types, as `llama-quantize` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recipe {
    /// Every matrix this type (the output head: see [`Recipe::weight_type`]).
    Uniform(GgmlDType),
    /// `Q4_K_M` (`base` Q4_K) or `Q5_K_M` (Q5_K): the v projection and the down projection
    /// of the first and last eighth of the layers and every third one between in Q6_K.
    KMix { base: GgmlDType },
}

impl Recipe {
    pub const NAMES: &'static [&'static str] = &[
        "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k",
        "q4_k_m", "q5_k_m",
    ];

    /// The type of weight `name` whose rows hold `ncols` values, in a model of `layers`
    /// layers whose output head is its embedding when `tied`. As llama.cpp: norms stay f32;
    /// a quantized recipe's output head (or the tied embedding) is Q6_K unless the recipe is
    /// Q8_0; a type whose block does not divide the rows falls back (Q4_K to Q5_0, Q5_K to
    /// Q5_1, Q6_K to Q8_0, a 32-value type to f16).
    pub fn weight_type(
        self,
        name: WeightName,
        layers: usize,
        ncols: usize,
        tied: bool,
    ) -> GgmlDType {
        let base = match self {
            Self::Uniform(t) | Self::KMix { base: t } => t,
        };
        // llama.cpp's `use_more_bits`: the first and last eighth, and every third layer between.
        let more_bits =
            |l: usize| l < layers / 8 || l >= 7 * layers / 8 || (l - layers / 8) % 3 == 2;
        let float = matches!(base, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16);
        let want = match name {
            WeightName::AttnNorm(_) | WeightName::FfnNorm(_) | WeightName::OutputNorm => {
                return GgmlDType::F32
            }
            _ if float => base,
            WeightName::Output => Self::head_type(base),
            WeightName::Embed if tied => Self::head_type(base),
            WeightName::V(l) | WeightName::Down(l)
                if matches!(self, Self::KMix { .. }) && more_bits(l) =>
            {
                GgmlDType::Q6K
            }
            _ => base,
        };
        fallback(want, ncols)
    }

    fn head_type(base: GgmlDType) -> GgmlDType {
        if base == GgmlDType::Q8_0 {
            GgmlDType::Q8_0
        } else {
            GgmlDType::Q6K
        }
    }
}

/// llama.cpp's fallback for rows a type's block does not divide.
fn fallback(want: GgmlDType, ncols: usize) -> GgmlDType {
    if ncols.is_multiple_of(want.block_size()) {
        return want;
    }
    let next = match want {
        GgmlDType::Q4K => GgmlDType::Q5_0,
        GgmlDType::Q5K => GgmlDType::Q5_1,
        GgmlDType::Q6K => GgmlDType::Q8_0,
        _ => GgmlDType::F16,
    };
    if ncols.is_multiple_of(next.block_size()) {
        next
    } else {
        GgmlDType::F16
    }
}

impl FromStr for Recipe {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        use GgmlDType::*;
        Ok(match s.to_ascii_lowercase().replace('-', "_").as_str() {
            "f32" => Self::Uniform(F32),
            "f16" => Self::Uniform(F16),
            "bf16" => Self::Uniform(BF16),
            "q8_0" => Self::Uniform(Q8_0),
            "q4_0" => Self::Uniform(Q4_0),
            "q4_1" => Self::Uniform(Q4_1),
            "q5_0" => Self::Uniform(Q5_0),
            "q5_1" => Self::Uniform(Q5_1),
            "q4_k" | "q4_k_s" => Self::Uniform(Q4K),
            "q5_k" | "q5_k_s" => Self::Uniform(Q5K),
            "q6_k" => Self::Uniform(Q6K),
            "q4_k_m" => Self::KMix { base: Q4K },
            "q5_k_m" => Self::KMix { base: Q5K },
            other => {
                return Err(format!(
                    "unknown weight type '{other}' (expected one of {})",
                    Self::NAMES.join(", ")
                ))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_k_m_follows_llama_cpps_rules_at_the_1b_and_the_default_models_shapes() {
        let r: Recipe = "Q4_K_M".parse().unwrap();
        // 16 layers: layers 0, 1, 14, 15 and every third from 2 (4, 7, 10, 13) get Q6_K.
        let six: Vec<usize> = (0..16)
            .filter(|&l| r.weight_type(WeightName::V(l), 16, 2048, true) == GgmlDType::Q6K)
            .collect();
        assert_eq!(six, vec![0, 1, 4, 7, 10, 13, 14, 15]);
        assert_eq!(
            r.weight_type(WeightName::Down(4), 16, 8192, true),
            GgmlDType::Q6K
        );
        assert_eq!(
            r.weight_type(WeightName::Down(5), 16, 8192, true),
            GgmlDType::Q4K
        );
        assert_eq!(
            r.weight_type(WeightName::Q(4), 16, 2048, true),
            GgmlDType::Q4K
        );
        assert_eq!(
            r.weight_type(WeightName::Embed, 16, 2048, true),
            GgmlDType::Q6K
        );
        assert_eq!(
            r.weight_type(WeightName::Embed, 16, 2048, false),
            GgmlDType::Q4K
        );
        assert_eq!(
            r.weight_type(WeightName::AttnNorm(0), 16, 2048, true),
            GgmlDType::F32
        );
        // Rows of 576 (the default model): Q4_K falls back to Q5_0, Q6_K to Q8_0.
        assert_eq!(
            r.weight_type(WeightName::Q(3), 30, 576, true),
            GgmlDType::Q5_0
        );
        assert_eq!(
            r.weight_type(WeightName::V(0), 30, 576, true),
            GgmlDType::Q8_0
        );
        assert_eq!(
            r.weight_type(WeightName::Down(0), 30, 1536, true),
            GgmlDType::Q6K
        );
        assert_eq!(
            r.weight_type(WeightName::Embed, 30, 576, true),
            GgmlDType::Q8_0
        );
        let q8: Recipe = "q8_0".parse().unwrap();
        assert_eq!(
            q8.weight_type(WeightName::Output, 16, 2048, false),
            GgmlDType::Q8_0
        );
        let q41: Recipe = "q4_1".parse().unwrap();
        assert_eq!(
            q41.weight_type(WeightName::Output, 16, 2048, false),
            GgmlDType::Q6K
        );
        assert!("q3_k".parse::<Recipe>().is_err());
    }
}
