//! The `[speculation]` table: the drafter, its weight type, and the engine's live speculation
//! settings.
//!
//! Why it exists: the settings keys of `[speculation]` are exactly the admin API's
//! [`SpeculationKnobs`], so the table is read into that type and checked by its `apply`, the
//! rule every boundary shares, instead of through a mirror struct with rules of its own. The two
//! keys that are not live settings (`draft_model`, `draft_weights_dtype`) are taken out first and
//! parsed into their own types here, so a bad value fails at load with its key named.

use crate::draft::{DraftSpec, GreedyAcross};
use crate::engine::{SettingsError, SpeculationKnobs, SpeculationSettings};
use crate::model::{DeviceSpec, WeightsDtype};

use super::ConfigError;

/// Other names for speculation keys, accepted as aliases: those of the project's original
/// brief (and of the speculative-decoding papers' code it followed).
pub(super) const SPECULATION_ALIASES: [(&str, &str); 2] = [
    ("spec_length", "gamma"),
    ("use_speculative_decoding", "enabled"),
];

/// `[speculation]`, checked.
#[derive(Clone, Debug)]
pub struct SpeculationSection {
    /// The drafter (`speculation.draft_model`).
    pub draft_model: DraftSpec,
    /// Weight type of a draft model (`speculation.draft_weights_dtype`).
    pub draft_weights_dtype: WeightsDtype,
    /// Where a draft model runs (`speculation.draft_device`; `None`: the target's device).
    pub draft_device: Option<DeviceSpec>,
    /// A draft head's reduced vocabulary size (`speculation.draft_vocab`; 0: the whole one).
    pub draft_vocab: usize,
    /// A draft model's (or `self:K`'s) reduced vocabulary size, for the default model
    /// (`speculation.draft_model_vocab`; 0: the whole one).
    pub draft_model_vocab: usize,
    /// How a draft model of another vocabulary drafts for greedy requests
    /// (`speculation.cross_vocabulary`).
    pub cross_vocabulary: GreedyAcross,
    /// The live settings the engine starts with (`enabled`, `adaptive`, `gamma`, ...).
    pub settings: SpeculationSettings,
}

impl SpeculationSection {
    /// Reads the table (defaults already merged in); `gamma_limit` is `engine.max_gamma`.
    pub(super) fn from_table(
        mut table: toml::Table,
        gamma_limit: usize,
    ) -> Result<Self, ConfigError> {
        let draft_model = take_string(&mut table, "draft_model")?
            .parse::<DraftSpec>()
            .map_err(|e| ConfigError::invalid("speculation.draft_model", e))?;
        let draft_weights_dtype = take_string(&mut table, "draft_weights_dtype")?
            .parse::<WeightsDtype>()
            .map_err(|e| ConfigError::invalid("speculation.draft_weights_dtype", e))?;
        let draft_device = match take_string(&mut table, "draft_device")?.trim() {
            "" => None,
            d => Some(
                d.parse::<DeviceSpec>()
                    .map_err(|e| ConfigError::invalid("speculation.draft_device", e))?,
            ),
        };
        let cross_vocabulary = take_string(&mut table, "cross_vocabulary")?
            .parse::<GreedyAcross>()
            .map_err(|e| ConfigError::invalid("speculation.cross_vocabulary", e))?;
        let mut token_count = |key: &str| match table.remove(key) {
            Some(toml::Value::Integer(n)) if n >= 0 => Ok(n as usize),
            Some(other) => Err(ConfigError::invalid(
                format!("speculation.{key}"),
                format!("must be a token count >= 0 (0: the whole vocabulary), got {other}"),
            )),
            None => Ok(0),
        };
        let draft_vocab = token_count("draft_vocab")?;
        let draft_model_vocab = token_count("draft_model_vocab")?;
        let update: SpeculationKnobs = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::Parse(format!("[speculation] {e}")))?;
        let settings = update
            .apply(&SpeculationSettings::default(), gamma_limit)
            .map_err(settings_error)?;
        Ok(Self {
            draft_model,
            draft_weights_dtype,
            draft_device,
            draft_vocab,
            draft_model_vocab,
            cross_vocabulary,
            settings,
        })
    }
}

/// A settings error, with the key named as the config file spells it.
pub(super) fn settings_error(e: SettingsError) -> ConfigError {
    ConfigError::Invalid {
        key: format!("speculation.{}", e.key),
        reason: e.reason,
    }
}

fn take_string(table: &mut toml::Table, key: &'static str) -> Result<String, ConfigError> {
    match table.remove(key) {
        Some(toml::Value::String(s)) => Ok(s),
        Some(other) => Err(ConfigError::invalid(
            format!("speculation.{key}"),
            format!("must be a string, got {}", other.type_str()),
        )),
        None => Err(ConfigError::invalid(
            format!("speculation.{key}"),
            "is missing",
        )),
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use crate::draft::{DraftSpec, GreedyAcross, PromptLookup};
    use crate::model::WeightsDtype;
    use crate::sampling::SampledDrafts;

    #[test]
    fn settings_are_checked_by_the_engine_rules_and_name_the_key() {
        let e = Config::from_toml("[speculation]\ngamma = 0").unwrap_err();
        assert_eq!(
            e.to_string(),
            "config: speculation.gamma must be in 1..=32, got 0"
        );
        let e = Config::from_toml("[speculation]\nlenience = 1.5").unwrap_err();
        assert!(e.to_string().contains("speculation.lenience"), "{e}");
        // Quoted as written, not as the f32 it would be (0).
        let e = Config::from_toml("[speculation]\nlenience = 1e-300").unwrap_err();
        assert!(
            e.to_string().ends_with("got 1e-300 (0 as a 32-bit float)"),
            "{e}"
        );
        let e = Config::from_toml("[speculation]\nlenience_under_load = 0.0").unwrap_err();
        assert!(
            e.to_string().contains("speculation.lenience_under_load"),
            "{e}"
        );
        let e = Config::from_toml("[speculation]\ngamma_max = 9").unwrap_err();
        assert_eq!(
            e.to_string(),
            "config: speculation.gamma_max must be <= 8 (engine.max_gamma), got 9"
        );
        Config::from_toml("[speculation]\ngamma_max = 9\n[engine]\nmax_gamma = 9").unwrap();
        let e = Config::from_toml("[speculation]\ngamma_min = 5\ngamma_max = 3").unwrap_err();
        assert!(e.to_string().contains("speculation.gamma_min"), "{e}");
        for (text, key) in [
            (
                "use_egag = true\negag_threshold = 0.0",
                "speculation.egag_threshold",
            ),
            ("egag_ema_beta = 1.0", "speculation.egag_ema_beta"),
            ("draft_p_min = nan", "speculation.draft_p_min"),
            ("tree_nodes = 8", "speculation.tree_nodes"),
            ("tree_nodes = -1", "tree_nodes"),
            ("sampled_drafts = \"greedy\"", "speculation.sampled_drafts"),
            ("sampled_drafts = 1", "sampled_drafts"),
        ] {
            let e = Config::from_toml(&format!("[speculation]\n{text}")).unwrap_err();
            assert!(e.to_string().contains(key), "{text}: {e}");
        }
        let c = Config::from_toml("[speculation]\ntree_nodes = 7").unwrap();
        assert_eq!(c.speculation.settings.tree_nodes.get(), 7);
        assert_eq!(c.speculation.settings.sampled_drafts, SampledDrafts::Auto);
        let c = Config::from_toml("[speculation]\nsampled_drafts = \"likeliest\"").unwrap();
        assert_eq!(
            c.speculation.settings.sampled_drafts,
            SampledDrafts::Likeliest
        );
        let c = Config::from_toml("[speculation]\nuse_egag = true\negag_threshold = 0.25").unwrap();
        let g = c.speculation.settings.gate;
        assert!(g.use_egag && g.egag_threshold == 0.25 && g.egag_ema_beta == 0.5);
        let e = Config::from_toml("[speculation]\nbogus = 1").unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
        let e = Config::from_toml("[speculation]\ngamma = \"four\"").unwrap_err();
        assert!(e.to_string().contains("speculation"), "{e}");
    }

    #[test]
    fn adaptive_is_a_key_of_its_own_in_the_file() {
        // The file's defaults give `adaptive` too, so a `gamma` alone does not turn the
        // governor off here (a lone `--gamma` flag or admin API `gamma` does).
        let c = Config::from_toml("[speculation]\ngamma = 3").unwrap();
        let s = c.speculation.settings;
        assert_eq!((s.gamma.get(), s.adaptive), (3, true));
        let c = Config::from_toml("[speculation]\ngamma = 3\nadaptive = false").unwrap();
        let s = c.speculation.settings;
        assert_eq!((s.gamma.get(), s.adaptive), (3, false));
    }

    #[test]
    fn aliases_work_and_only_one_name_may_be_given() {
        let c = Config::from_toml(
            "[speculation]\nspec_length = 3\nuse_speculative_decoding = false\ndraft_model = \"default\"",
        )
        .unwrap();
        let s = c.speculation.settings;
        assert_eq!((s.gamma.get(), s.enabled), (3, false));
        assert_eq!(
            c.speculation.draft_model,
            DraftSpec::Model("default".into())
        );
        let e = Config::from_toml("[speculation]\nspec_length = 3\ngamma = 2").unwrap_err();
        assert!(e.to_string().contains("alias"), "{e}");
    }

    #[test]
    fn the_drafter_and_its_weights_are_parsed_at_load() {
        let e =
            Config::from_toml("[speculation]\ndraft_model = \"prompt-lookup:3-1\"").unwrap_err();
        assert!(
            e.to_string().contains("speculation.draft_model") && e.to_string().contains("n-gram"),
            "{e}"
        );
        let c = Config::from_toml("[speculation]\ndraft_model = \"prompt-lookup:2-4\"").unwrap();
        assert_eq!(
            c.speculation.draft_model,
            DraftSpec::PromptLookup(PromptLookup::new(2, 4))
        );
        let e = Config::from_toml("[speculation]\ndraft_model = \"self:0\"").unwrap_err();
        assert!(e.to_string().contains("speculation.draft_model"), "{e}");
        let c = Config::from_toml("[speculation]\ndraft_model = \"self:8\"").unwrap();
        assert_eq!(c.speculation.draft_model, DraftSpec::SelfLayers(8));
        let e = Config::from_toml("[speculation]\ndraft_model = \"\"").unwrap_err();
        assert!(e.to_string().contains("speculation.draft_model"), "{e}");
        let e = Config::from_toml("[speculation]\ndraft_model = 3").unwrap_err();
        assert!(e.to_string().contains("speculation.draft_model"), "{e}");
        let e = Config::from_toml("[speculation]\ndraft_weights_dtype = \"q3\"").unwrap_err();
        assert!(
            e.to_string().contains("speculation.draft_weights_dtype"),
            "{e}"
        );
        let c = Config::from_toml("[speculation]\ndraft_weights_dtype = \"q8_0\"").unwrap();
        assert_eq!(c.speculation.draft_weights_dtype, WeightsDtype::Q8_0);
    }

    #[test]
    fn how_a_drafter_of_another_vocabulary_drafts_greedily_is_read() {
        let c = Config::from_toml("").unwrap();
        assert_eq!(c.speculation.cross_vocabulary, GreedyAcross::StringLevel);
        let c = Config::from_toml("[speculation]\ncross_vocabulary = \"tli\"").unwrap();
        assert_eq!(c.speculation.cross_vocabulary, GreedyAcross::TokenLevel);
        let e = Config::from_toml("[speculation]\ncross_vocabulary = \"both\"").unwrap_err();
        assert!(
            e.to_string().contains("speculation.cross_vocabulary")
                && e.to_string().contains("slem"),
            "{e}"
        );
    }
}
