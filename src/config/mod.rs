//! Configuration: a TOML file (the embedded `config/default.toml` unless one is given), checked
//! at start-up so a bad value fails with a message naming its key.

mod error;
mod load;
mod sections;
mod speculation;

pub use error::ConfigError;
pub use sections::{
    Config, GenerationDefaults, LoggingConfig, ModelConfig, RuntimeConfig, ServerConfig,
    DEFAULT_CONFIG,
};
pub use speculation::SpeculationSection;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::KvDtype;

    #[test]
    fn embedded_default_is_valid() {
        let c = Config::embedded();
        assert_eq!(c.model.path, "default");
        assert_eq!(c.model.context_length, 0, "the model's own maximum");
    }

    #[test]
    fn errors_name_the_key() {
        let e = Config::from_toml("[generation]\ntop_p = 0.0").unwrap_err();
        assert!(e.to_string().contains("generation.top_p"), "{e}");
        let e = Config::from_toml("[model]\nweights_dtype = \"q3\"").unwrap_err();
        assert!(e.to_string().contains("model.weights_dtype"), "{e}");
        let e = Config::from_toml("[model]\nkv_cache_dtype = \"q8\"").unwrap_err();
        assert!(e.to_string().contains("model.kv_cache_dtype"), "{e}");
        let e = Config::from_toml("[model]\nkv_cache_dtype = \"q4_0\"").unwrap_err();
        assert!(
            e.to_string().contains("model.kv_cache_dtype") && e.to_string().contains("not offered"),
            "{e}"
        );
        let c = Config::from_toml("[model]\nkv_cache_dtype = \"F32\"").unwrap();
        assert_eq!(c.kv_cache_dtype(), KvDtype::F32);
        let c = Config::from_toml("[model]\nkv_cache_dtype = \"bf16\"").unwrap();
        assert_eq!(c.kv_cache_dtype(), KvDtype::Bf16);
        let e = Config::from_toml("[model]\ncontext_length = 1").unwrap_err();
        assert!(e.to_string().contains("model.context_length"), "{e}");
        let e = Config::from_toml("[model]\nbogus = 1").unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
        let e = Config::from_toml("[generation]\nmax_tokens = \"many\"").unwrap_err();
        assert!(e.to_string().contains("max_tokens"), "{e}");
    }

    #[test]
    fn engine_keys_are_checked() {
        let e = Config::from_toml("[engine]\nmax_seqs = 0").unwrap_err();
        assert_eq!(e.to_string(), "config: engine.max_seqs must be >= 1");
        let e = Config::from_toml("[engine]\nmax_gamma = 33").unwrap_err();
        assert!(e.to_string().contains("engine.max_gamma"), "{e}");
        let mut c = Config::embedded();
        c.engine.max_queue = 0;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("engine.max_queue"));
    }

    #[test]
    fn user_values_override_defaults_only_where_given() {
        let c = Config::from_toml("[model]\ncontext_length = 128").unwrap();
        assert_eq!(c.model.context_length, 128);
        assert_eq!(c.model.path, "default");
    }
}
