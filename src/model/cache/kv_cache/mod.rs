//! The KV cache: a fixed number of sequence slots, each holding keys and values for every
//! layer, that a round keeps in part (speculative rollback) and frees.
//!
//! Memory laid out token-major (`[pos][kv_head][head_dim]`), so appending a round's tokens is a
//! copy and dropping rejected tokens is a length change that keeps the allocation for reuse.
//! Elements are f32, f16, bf16 or q8_0 ([`KvDtype`]): attention over a deep cache is bound by
//! reading it, and f16 halves both the reads and the memory a sequence holds (llama.cpp's
//! default cache type too), bf16 as well (with attention on bf16 pairs), q8_0 (`q8`) about
//! quarters them. Keys and values are rounded once,
//! when they are appended, so a token's cached values are the same bits however it was
//! batched: greedy parity does not depend on the type.
//!
//! The memory is host buffers (`host`) for the own CPU forward or device tensors (`device`)
//! for the tensor backend, so the engine sees one cache type whichever forward fills it:
//! `slots` hands slots out, `forward_writes` is what a forward writes, `keep` what a round
//! keeps, `copy` a prefix shared between slots, `run` a stretch of tokens the prefix cache
//! stores.

mod copy;
mod device_slot;
mod dtype;
mod forward_writes;
mod host;
mod keep;
mod q8;
mod run;
mod slots;

pub use dtype::KvDtype;
pub(crate) use host::LayerKv;
pub use keep::Kept;
pub use run::KvRun;
pub use slots::KvCache;
