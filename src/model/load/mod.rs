mod expert_stacks;
pub(crate) mod gguf_header;
pub mod gguf_keys;
pub mod hf_config;
pub mod host_memory;
pub mod hparams;
pub mod mxfp4;
pub mod raw_weight;
pub mod weight_roles;
