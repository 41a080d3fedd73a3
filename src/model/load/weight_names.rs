//! What a decoder's weights are called: each role (`WeightName`, a routed layer's
//! `ExpertPart`) and its tensor's name in a GGUF file and in a Hugging Face checkpoint. The
//! names only; `weight_roles` reads the tensors by them.

/// A weight's role in a decoder model of any family.
#[derive(Clone, Copy, Debug)]
pub enum WeightName {
    /// q|k|v in one tensor (Phi-3).
    Qkv(usize),
    /// gate|up in one tensor (Phi-3).
    GateUp(usize),
    QBias(usize),
    KBias(usize),
    VBias(usize),
    /// Per-head RMS norms of queries and keys (Qwen 3, Gemma 3).
    QNorm(usize),
    KNorm(usize),
    /// The norms after attention and after the MLP (Gemma 3).
    AttnPostNorm(usize),
    FfnPostNorm(usize),
    Embed,
    OutputNorm,
    Output,
    AttnNorm(usize),
    Q(usize),
    K(usize),
    V(usize),
    O(usize),
    FfnNorm(usize),
    Gate(usize),
    Up(usize),
    Down(usize),
    /// A routed layer's router: one row of logits weights per expert.
    Router(usize),
    /// A routed layer's shared expert (Qwen2-MoE) and its gate, one logit a token.
    SharedGate(usize),
    SharedUp(usize),
    SharedDown(usize),
    SharedExpertGate(usize),
    /// The output projection's bias (gpt-oss).
    OBias(usize),
    /// One sink logit per attention head (gpt-oss).
    Sinks(usize),
    /// The router's bias, one per expert (gpt-oss).
    RouterBias(usize),
}

/// One of the three matrices of a routed layer's experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertPart {
    Gate,
    Up,
    Down,
}

impl ExpertPart {
    /// llama.cpp's name of the part's stacked tensor (`ffn_gate_exps`) and of one expert's in
    /// older Mixtral files (`ffn_gate.3`).
    pub(super) fn gguf(self) -> &'static str {
        match self {
            Self::Gate => "gate",
            Self::Up => "up",
            Self::Down => "down",
        }
    }

    /// Its name in a Hugging Face checkpoint: Qwen-MoE's (`gate_proj`) or Mixtral's (`w1`).
    pub(super) fn hf(self, mixtral: bool) -> &'static str {
        match (self, mixtral) {
            (Self::Gate, false) => "gate_proj",
            (Self::Up, false) => "up_proj",
            (Self::Down, false) => "down_proj",
            (Self::Gate, true) => "w1",
            (Self::Up, true) => "w3",
            (Self::Down, true) => "w2",
        }
    }
}

impl WeightName {
    /// The tensor's name in a GGUF file.
    pub fn gguf(self) -> String {
        match self {
            Self::Embed => "token_embd.weight".into(),
            Self::OutputNorm => "output_norm.weight".into(),
            Self::Output => "output.weight".into(),
            Self::AttnNorm(l) => format!("blk.{l}.attn_norm.weight"),
            Self::Q(l) => format!("blk.{l}.attn_q.weight"),
            Self::K(l) => format!("blk.{l}.attn_k.weight"),
            Self::V(l) => format!("blk.{l}.attn_v.weight"),
            Self::O(l) => format!("blk.{l}.attn_output.weight"),
            Self::FfnNorm(l) => format!("blk.{l}.ffn_norm.weight"),
            Self::Gate(l) => format!("blk.{l}.ffn_gate.weight"),
            Self::Up(l) => format!("blk.{l}.ffn_up.weight"),
            Self::Down(l) => format!("blk.{l}.ffn_down.weight"),
            Self::Qkv(l) => format!("blk.{l}.attn_qkv.weight"),
            // llama.cpp keeps Phi-3's fused gate|up under the up projection's name.
            Self::GateUp(l) => format!("blk.{l}.ffn_up.weight"),
            Self::QBias(l) => format!("blk.{l}.attn_q.bias"),
            Self::KBias(l) => format!("blk.{l}.attn_k.bias"),
            Self::VBias(l) => format!("blk.{l}.attn_v.bias"),
            Self::QNorm(l) => format!("blk.{l}.attn_q_norm.weight"),
            Self::KNorm(l) => format!("blk.{l}.attn_k_norm.weight"),
            Self::AttnPostNorm(l) => format!("blk.{l}.post_attention_norm.weight"),
            Self::FfnPostNorm(l) => format!("blk.{l}.post_ffw_norm.weight"),
            Self::Router(l) => format!("blk.{l}.ffn_gate_inp.weight"),
            Self::SharedGate(l) => format!("blk.{l}.ffn_gate_shexp.weight"),
            Self::SharedUp(l) => format!("blk.{l}.ffn_up_shexp.weight"),
            Self::SharedDown(l) => format!("blk.{l}.ffn_down_shexp.weight"),
            Self::SharedExpertGate(l) => format!("blk.{l}.ffn_gate_inp_shexp.weight"),
            Self::OBias(l) => format!("blk.{l}.attn_output.bias"),
            Self::Sinks(l) => format!("blk.{l}.attn_sinks.weight"),
            Self::RouterBias(l) => format!("blk.{l}.ffn_gate_inp.bias"),
        }
    }

    /// The tensor's name in a Hugging Face checkpoint. With sandwich norms (Gemma) the norm
    /// before the MLP is `pre_feedforward_layernorm` and `post_attention_layernorm` is the
    /// one after attention; in Llama's naming `post_attention_layernorm` is the one before
    /// the MLP.
    pub(super) fn hf(self, sandwich: bool) -> String {
        match self {
            Self::Embed => "model.embed_tokens.weight".into(),
            Self::OutputNorm => "model.norm.weight".into(),
            Self::Output => "lm_head.weight".into(),
            Self::AttnNorm(l) => format!("model.layers.{l}.input_layernorm.weight"),
            Self::Q(l) => format!("model.layers.{l}.self_attn.q_proj.weight"),
            Self::K(l) => format!("model.layers.{l}.self_attn.k_proj.weight"),
            Self::V(l) => format!("model.layers.{l}.self_attn.v_proj.weight"),
            Self::O(l) => format!("model.layers.{l}.self_attn.o_proj.weight"),
            Self::FfnNorm(l) if sandwich => {
                format!("model.layers.{l}.pre_feedforward_layernorm.weight")
            }
            Self::FfnNorm(l) => format!("model.layers.{l}.post_attention_layernorm.weight"),
            Self::Gate(l) => format!("model.layers.{l}.mlp.gate_proj.weight"),
            Self::Up(l) => format!("model.layers.{l}.mlp.up_proj.weight"),
            Self::Down(l) => format!("model.layers.{l}.mlp.down_proj.weight"),
            Self::Qkv(l) => format!("model.layers.{l}.self_attn.qkv_proj.weight"),
            Self::GateUp(l) => format!("model.layers.{l}.mlp.gate_up_proj.weight"),
            Self::QBias(l) => format!("model.layers.{l}.self_attn.q_proj.bias"),
            Self::KBias(l) => format!("model.layers.{l}.self_attn.k_proj.bias"),
            Self::VBias(l) => format!("model.layers.{l}.self_attn.v_proj.bias"),
            Self::QNorm(l) => format!("model.layers.{l}.self_attn.q_norm.weight"),
            Self::KNorm(l) => format!("model.layers.{l}.self_attn.k_norm.weight"),
            Self::AttnPostNorm(l) => format!("model.layers.{l}.post_attention_layernorm.weight"),
            Self::FfnPostNorm(l) => format!("model.layers.{l}.post_feedforward_layernorm.weight"),
            // Mixtral's router is `block_sparse_moe.gate`: `WeightReader::router` tries both.
            Self::Router(l) => format!("model.layers.{l}.mlp.gate.weight"),
            Self::SharedGate(l) => format!("model.layers.{l}.mlp.shared_expert.gate_proj.weight"),
            Self::SharedUp(l) => format!("model.layers.{l}.mlp.shared_expert.up_proj.weight"),
            Self::SharedDown(l) => format!("model.layers.{l}.mlp.shared_expert.down_proj.weight"),
            Self::SharedExpertGate(l) => format!("model.layers.{l}.mlp.shared_expert_gate.weight"),
            Self::OBias(l) => format!("model.layers.{l}.self_attn.o_proj.bias"),
            Self::Sinks(l) => format!("model.layers.{l}.self_attn.sinks"),
            Self::RouterBias(l) => format!("model.layers.{l}.mlp.router.bias"),
        }
    }
}
