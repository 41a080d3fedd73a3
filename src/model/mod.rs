//! The model layer: token ids in, logits out, and the text on either side of them.
//!
//! It exists so that everything above it (sampling, drafters, the engine) sees one decoder
//! forward that is batch-invariant: a token's logits are the same bits whether it is decoded
//! alone, verified with drafts, or batched with other sequences, which is what lets
//! speculative decoding reproduce plain greedy decoding exactly. candle supplies the tensors,
//! the thread pool, the GPU forward's row-wise operations and the matmul for weight types we
//! have no kernel for; the heavy arithmetic is our own CPU kernels:
//!
//! It is grouped by job:
//!
//! * `kernels/`: the CPU arithmetic. Matrix multiplies for Q4_0/Q4_1 (`q4_gemm`), Q8_0
//!   (`q8_gemm`) and f16 or f32 (`float_gemm`) weights with the candle glue in `packed_gemm`; attention
//!   written by hand with scalar definitions and AVX2/AVX-512 kernels that match them bit for
//!   bit (`attention`); RMS norms fused with the residual add (`rms_norm`); elementwise work
//!   over one vectorized exponential (`elementwise`, `fast_exp`); which vector level the CPU gets (`cpu_kernels`) and the row-parallel loop
//!   (`parallel`).
//! * `spec/`: what a model is, as data, the layer's leaf: its hyperparameters (`hparams`), its
//!   block as a family declares it, dense or routed feed-forward included (`block`), and its
//!   rotary embeddings' layout and scaling (`rope`).
//! * `arch/`: the families (Llama and Mistral, Qwen 2, Qwen 3, Gemma 3, Phi-3, the mixtures
//!   Qwen3-MoE, Qwen2-MoE, OLMoE and Mixtral), one file each: the block each declares and the
//!   keys only its files carry.
//! * `decoder/`: the shared decoder that runs every family's forward. Its weights (`weights`), the per-layer weight type (`linear`),
//!   rotary embeddings (`rope`), the feed-forward, dense or routed (`ffn`, the router's choice
//!   in `routing`, recorded on request by `expert_trace`), the batched forward's inputs and
//!   outputs (`batch`), the
//!   forward itself (`model`, the `Decoder` type) on tandem's own kernels (`own_forward`) or on
//!   candle's tensors for GPUs (`tensor_forward`), the device choice (`device`) and
//!   per-operation timing (`op_profile`).
//! * `load/`: reading GGUF files and Hugging Face folders: weights by role as the file holds
//!   them (`weight_roles`, `raw_weight`), the hyperparameters (`hparams` over `gguf_keys` and
//!   `hf_config`), and the memory the process may use (`host_memory`).
//! * `loaded`: what the user named resolved to a file or folder and loaded: the family found,
//!   the memory checked, the model built (weights converted to the type the kernels run) with
//!   its tokenizer. The one part above the families, the readers and the model.
//! * `preload_checks`: what `loaded` checks before reading tensors: a GGUF file complete, the
//!   weights within the memory the process could take, counted in the types they load as.
//! * `text/`: the tokenizer with incremental decoding (`tokenizer`), the chat template
//!   (`chat_template`), and the tokens two vocabularies share (`vocab_map`).
//! * `head/`: draft heads (EAGLE): one decoder layer over the target's own hidden states and
//!   embeddings, drafting through the target's output head or a reduced vocabulary of its
//!   rows; read and written in EAGLE's published layout, and trained (`train`).
//! * `cache/`: the explicit KV cache (`kv_cache`), f16, f32, bf16 or q8_0, with slots that can
//!   be truncated when drafts are rejected or copied from one another, and the prefix cache: ended texts'
//!   keys and values in a radix tree of token runs under a byte budget (`prefix_store`).
//! * `error`: the layer's error type, apart from the module root so its children import no
//!   parent.

pub mod arch;
pub mod cache;
pub mod draft_vocab;
pub use draft_vocab::DraftVocab;
pub mod decoder;
mod error;
pub mod head;
pub mod kernels;
pub mod load;
pub mod loaded;
pub mod preload_checks;
mod self_check;
pub mod spec;
pub mod synthetic;
pub mod text;

pub use cache::kv_cache::{Kept, KvCache, KvDtype};
pub use decoder::batch::{
    BatchFeatures, BatchLogits, FeatureTaps, LogitsRows, SeqInput, TREE_ROOT,
};
pub use decoder::device::{BackendChoice, DeviceSpec, ForwardKind};
pub use decoder::linear::WeightsDtype;
pub use decoder::model::Decoder;
pub use error::{ModelError, Result};
pub use load::hparams::{Hparams, RopeScaling};
pub use loaded::{default_model_path, LoadOptions, LoadedModel, ModelSource};
pub use self_check::check_finite_forward;
pub use text::chat_template::{ChatMessage, ChatTemplate, ChatTemplateError};
pub use text::tokenizer::{literal_marker, IncrementalDecoder, TextTokenizer, TokenizerError};
