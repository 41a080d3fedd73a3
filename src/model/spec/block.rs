//! What a decoder block does, as data: the ways the families tandem runs differ from Llama's
//! block (norm placement, activation, biases, q/k norms, embedding scale), declared once per
//! family and read by the shared forward. A leaf, so the hyperparameters can carry it without
//! importing the families.

/// The MLP's gate activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `silu(gate) · up` (Llama, Qwen, Mistral, Phi-3).
    Silu,
    /// `gelu_tanh(gate) · up` (Gemma).
    GeluTanh,
    /// gpt-oss's clamped SwiGLU: `(clamp(up, ±7) + 1) · g · σ(1.702 · g)` with
    /// `g = min(gate, 7)`.
    SwigluOai,
}

/// A family's block, as far as it differs from Llama's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    /// q, k and v projections add a bias (Qwen 2).
    pub qkv_bias: bool,
    /// Each query and key head is RMS-normed over its own values before rotation (Qwen 3,
    /// Gemma 3).
    pub qk_norm: bool,
    /// The q/k norms span all the heads' values at once, one weight per value (OLMoE), not
    /// each head's.
    pub qk_norm_whole: bool,
    /// The attention output and the MLP output are RMS-normed before their residual adds,
    /// besides the norms before them (Gemma 2 and 3).
    pub sandwich_norms: bool,
    pub activation: Activation,
    /// Embeddings are multiplied by √hidden before the first layer (Gemma).
    pub embed_scale: bool,
    /// Hugging Face checkpoints store RMS norm weights as `w` and apply `1 + w` (Gemma);
    /// llama.cpp's converter writes `1 + w` into the GGUF, so only safetensors add it.
    pub hf_norm_plus_one: bool,
    /// The file holds q|k|v as one tensor and gate|up as one (Phi-3).
    pub fused_projections: bool,
    /// Which feed-forward the family's layers have.
    pub feedforward: Feedforward,
    /// A routed layer also has a shared expert every token reads, its output scaled by a
    /// sigmoid gate (Qwen2-MoE).
    pub shared_expert: bool,
    /// The output projection, the router and every expert's projections add biases
    /// (gpt-oss).
    pub ffn_and_out_bias: bool,
    /// Each attention head has a learned sink: one more logit in its softmax's denominator,
    /// with no value (gpt-oss).
    pub attn_sinks: bool,
    /// llama.cpp's files name the norm before the MLP `post_attention_norm` (gpt-oss), as
    /// Hugging Face's do, not `ffn_norm`.
    pub gguf_ffn_norm_post_attention: bool,
}

/// A family's feed-forward: one gated MLP, or a mixture of experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feedforward {
    Dense,
    /// Every layer's feed-forward is routed ([`Experts`], from the file).
    Routed,
    /// Dense, or routed where the file states experts: Llama's GGUF architecture holds
    /// Mixtral's files too.
    DenseOrRouted,
}

impl Block {
    /// Llama's block: pre-norms, SiLU-gated MLP, nothing else.
    pub const LLAMA: Block = Block {
        qkv_bias: false,
        qk_norm: false,
        qk_norm_whole: false,
        sandwich_norms: false,
        activation: Activation::Silu,
        embed_scale: false,
        hf_norm_plus_one: false,
        fused_projections: false,
        feedforward: Feedforward::Dense,
        shared_expert: false,
        ffn_and_out_bias: false,
        attn_sinks: false,
        gguf_ffn_norm_post_attention: false,
    };
}

/// A routed feed-forward (a mixture of experts): each token's router picks `used` of `count`
/// experts, each a gated MLP of width `ffn_len`, and sums their outputs weighted by the
/// router's probabilities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Experts {
    pub count: usize,
    pub used: usize,
    /// The width of one expert's gated MLP.
    pub ffn_len: usize,
    /// The chosen experts' probabilities are divided by their sum (Mixtral, Qwen3-MoE); else
    /// they are the softmax's over all experts.
    pub norm_top_k: bool,
    /// The width of the shared expert every token reads (0: none).
    pub shared_ffn_len: usize,
}
