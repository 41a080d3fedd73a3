mod gguf_header;
pub mod gguf_keys;
pub mod hf_config;
pub mod host_memory;
pub mod hparams;
pub mod loader;
pub mod rope_config;
pub mod weight_roles;
