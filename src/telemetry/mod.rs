//! Every Prometheus metric tandem exports, defined in one place (docs/operations.md, "Metrics").
//!
//! Why it exists: dashboards, alert rules and tests refer to these names, so they must not drift
//! between the places that record them. Recording goes through the `metrics` facade; without an
//! installed recorder (the library in tests, `tandem generate`) it costs next to nothing. The
//! speculation counters are named after vLLM's (`vllm:spec_decode_num_drafts` is
//! `tandem_spec_decode_num_drafts_total` here): a query written for vLLM needs only its prefix
//! changed.
//!
//! `names` holds the metric names, `install` the exporter with each metric's buckets and help
//! text, and `record` the functions the engine and server call to record.

mod install;
mod names;
mod record;
mod vllm_aliases;

pub use install::install;
pub use names::*;
pub use record::*;
pub use vllm_aliases::register_vllm_aliases;
