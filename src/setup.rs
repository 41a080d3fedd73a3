//! Turning a `Config` into loaded models and an engine configuration.
//!
//! Why it exists: `tandem serve` and `tandem bench` start the same engine from the same config
//! keys (the target, the drafter named by `speculation.draft_model`, the `[engine]` section),
//! and the start-up errors a user must see (missing model, vocabularies that differ) should be
//! worded once.

use std::sync::Arc;

use crate::config::Config;
use crate::draft::{
    check_same_vocabulary, reduced_vocab, DraftSpec, GreedyAcross, LoadedDrafter, Translation,
    MIN_COVERAGE,
};
use crate::engine::EngineConfig;
use crate::model::head::DraftHead;
use crate::model::loaded::LoadOptions;
use crate::model::{Decoder, DraftVocab, LoadedModel, ModelError, ModelSource, WeightsDtype};

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("draft model: {0}")]
    Draft(String),
}

/// Loads the target model named by `model.path` at `model.weights_dtype`.
pub fn load_target(config: &Config) -> Result<LoadedModel, SetupError> {
    log_vector_level();
    let source = ModelSource::resolve(&config.model.path)?;
    let t = std::time::Instant::now();
    let mut target = LoadedModel::load(&source, &target_options(config))?;
    if !config.model.chat_template.is_empty() {
        let path = &config.model.chat_template;
        let src = std::fs::read_to_string(path)
            .map_err(|e| ModelError::BadConfig(format!("model.chat_template {path}: {e}")))?;
        std::sync::Arc::get_mut(&mut target.tokenizer)
            .expect("the tokenizer was just loaded")
            .set_chat_template(&src)
            .map_err(|e| ModelError::BadConfig(format!("model.chat_template {path}: {e}")))?;
    }
    check_first_forward(&target, "the target model")?;
    tracing::info!(
        model = %source.display_name(),
        device = %target.model.placement(),
        weights = %target.model.linear_dtypes().join("/"),
        kv_cache = %target.model.kv_dtype(),
        seconds = t.elapsed().as_secs_f64(),
        "loaded the target model"
    );
    Ok(target)
}

/// A short forward of ordinary text through `loaded`, refused where any value between its
/// layers or any logit is not finite (a corrupt file), naming the model and the first layer
/// that went wrong.
pub fn check_first_forward(loaded: &LoadedModel, which: &str) -> Result<(), SetupError> {
    let mut tokens = loaded
        .tokenizer
        .encode("The capital of France is Paris.", true)
        .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
    // A tokenizer may hold more ids than the model has rows (padding, a cut-down test model).
    let rows = loaded.model.hparams().vocab_size as u32;
    tokens.retain(|&t| t < rows);
    tokens.truncate(16);
    if tokens.is_empty() {
        tokens.push(0);
    }
    crate::model::check_finite_forward(&loaded.model, &tokens).map_err(|e| match e {
        ModelError::NonFinite(why) => ModelError::NonFinite(format!("{which}: {why}")),
        other => other,
    })?;
    Ok(())
}

/// Says which vector instructions the kernels run on; a CPU without AVX2 still runs, on
/// portable code, and is warned about.
fn log_vector_level() {
    match crate::model::kernels::cpu_kernels::vector_level() {
        Some(level) => tracing::info!(cpu = %level, "CPU kernels"),
        None => tracing::warn!("{}", crate::model::kernels::cpu_kernels::PORTABLE_WARNING),
    }
    tracing::info!(pages = %crate::huge_pages::heap_pages(), "memory pages");
}

fn target_options(config: &Config) -> LoadOptions {
    LoadOptions {
        weights_dtype: config.weights_dtype(),
        context_len: config.model.context_length,
        kv_dtype: config.kv_cache_dtype(),
        device: config.device(),
        backend: config.backend(),
        ..Default::default()
    }
}

/// Loads the drafter `spec` names; a draft model loads at `dtype`, and drafts through a
/// [`Translation`] when its vocabulary is not the target's.
pub fn load_drafter(
    spec: &DraftSpec,
    dtype: WeightsDtype,
    config: &Config,
    target: &LoadedModel,
) -> Result<Option<LoadedDrafter>, SetupError> {
    let (source, layers) = match spec {
        DraftSpec::None => return Ok(None),
        DraftSpec::PromptLookup(p) => return Ok(Some(LoadedDrafter::PromptLookup(*p))),
        DraftSpec::SelfLayers(k) => {
            let n = target.model.hparams().num_layers;
            if *k >= n {
                return Err(SetupError::Draft(format!(
                    "`{spec}`: the target has {n} layers; a self-drafter takes fewer"
                )));
            }
            (target.source.clone(), Some(*k))
        }
        DraftSpec::Model(path) => (ModelSource::resolve(path)?, None),
        DraftSpec::LookupThen(first, model) => {
            let d = load_drafter(model, dtype, config, target)?;
            return Ok(d.map(|d| d.with_lookup_first(*first)));
        }
        DraftSpec::Head { path, lookup } => {
            let head = load_head(path.as_deref(), dtype, config, target)?;
            return Ok(Some(match lookup {
                Some(first) => head.with_lookup_first(*first),
                None => head,
            }));
        }
    };
    let opts = LoadOptions {
        weights_dtype: dtype,
        max_layers: layers,
        device: config.draft_device(),
        ..target_options(config)
    };
    let draft = LoadedModel::load(&source, &opts)?;
    check_first_forward(&draft, "the draft model")?;
    let translation =
        translation_for(&draft, &source, target, config.speculation.cross_vocabulary)?;
    let (vocab, vocab_note) = match &translation {
        Some(t) => {
            refuse_reduced_vocab_across(config)?;
            (None, format!(", {} shared tokens", t.shared()))
        }
        None => reduce_draft_vocab(&draft.model, config)?,
    };
    let layers_note = match layers {
        Some(k) => format!(
            ", first {k} of {} layers",
            target.model.hparams().num_layers
        ),
        None => String::new(),
    };
    let name = format!(
        "{} ({}{layers_note}{vocab_note})",
        source.display_name(),
        draft.model.linear_dtypes().join("/")
    );
    tracing::info!(draft_model = %name, device = %draft.model.placement(), "loaded the draft model");
    Ok(Some(LoadedDrafter::Model {
        model: Arc::new(draft.model),
        vocab,
        translation,
        lookup: None,
        name,
        self_layers: layers.is_some(),
    }))
}

/// `None` where the drafter shares the target's vocabulary token for token; else the
/// translation it drafts through (Token-Level Intersection), logged with its size and
/// coverage, or refused where it covers too little of the target's text to pay.
fn translation_for(
    draft: &LoadedModel,
    source: &ModelSource,
    target: &LoadedModel,
    greedy: GreedyAcross,
) -> Result<Option<Arc<Translation>>, SetupError> {
    let (draft_name, target_name) = (source.display_name(), target.source.display_name());
    let same = check_same_vocabulary(
        &draft.tokenizer,
        &draft_name,
        &target.tokenizer,
        &target_name,
    );
    let Err(differs) = same else {
        return Ok(None);
    };
    let t = Translation::between(
        Arc::clone(&draft.tokenizer),
        draft.model.hparams().vocab_size,
        Arc::clone(&target.tokenizer),
        target.model.hparams().vocab_size,
    )
    .map_err(|e| {
        SetupError::Draft(format!(
            "{differs}, and reading both for shared tokens: {e}"
        ))
    })?
    .with_greedy(greedy);
    let coverage = t
        .sample_coverage()
        .map_err(|e| SetupError::Draft(format!("{differs}, and the target's tokenizer: {e}")))?;
    if t.shared() == 0 || coverage < MIN_COVERAGE {
        return Err(SetupError::Draft(format!(
            "{differs}; they share {} tokens, {:.0}% of the target's tokens of ordinary text \
             (at least {:.0}% are needed for drafting across vocabularies to pay)",
            t.shared(),
            coverage * 100.0,
            MIN_COVERAGE * 100.0
        )));
    }
    tracing::info!(
        draft = %draft_name,
        target = %target_name,
        shared_tokens = t.shared(),
        draft_vocab = draft.model.hparams().vocab_size,
        target_vocab = target.model.hparams().vocab_size,
        sample_coverage = format!("{:.1}%", coverage * 100.0),
        greedy = ?t.greedy(),
        "the vocabularies differ: drafting over the tokens they share (token-level intersection)"
    );
    Ok(Some(Arc::new(t)))
}

/// A reduced draft vocabulary is a ranking of the target's own tokens: not for a drafter of
/// another vocabulary.
fn refuse_reduced_vocab_across(config: &Config) -> Result<(), SetupError> {
    match config.speculation.draft_model_vocab {
        0 => Ok(()),
        k => Err(SetupError::Draft(format!(
            "speculation.draft_model_vocab = {k}: not for a draft model of another vocabulary \
             (it drafts over the tokens the two share); set it to 0"
        ))),
    }
}

/// Loads a draft head for `target` from `path` (`None`: the default model's shipped head), its
/// matmuls at `dtype` (as-is: 8-bit, a head's file being f32) and its vocabulary reduced to
/// `speculation.draft_vocab` tokens.
/// The reduced draft vocabulary (`speculation.draft_model_vocab`) a draft model (or `self:K`)
/// of the default target drafts over: the shipped head's ranking, counted from the default
/// model's own answers, through the draft model's own output rows; with the note for the
/// drafter's name. Another target's ranking
/// ships only inside its head, and the reduced projection runs on the CPU, so asking for it
/// elsewhere is refused with the key named.
fn reduce_draft_vocab(
    model: &Decoder,
    config: &Config,
) -> Result<(Option<Arc<DraftVocab>>, String), SetupError> {
    let k = config.speculation.draft_model_vocab;
    if k == 0 {
        return Ok((None, String::new()));
    }
    let refuse = |why: String| {
        SetupError::Draft(format!(
            "speculation.draft_model_vocab = {k}: {why}; set it to 0"
        ))
    };
    if config.model.path != "default" {
        return Err(refuse(
            "a draft model's vocabulary ranking ships only for the default model".into(),
        ));
    }
    if !model.device().is_cpu() {
        return Err(refuse("the reduced projection runs on the CPU only".into()));
    }
    let dir = crate::model::head::default_head_dir();
    let ranking = crate::model::head::load_head(&dir)
        .map_err(|e| refuse(format!("the ranking in {}: {e}", dir.display())))?
        .token_rank;
    let vocab = reduced_vocab(model, &ranking, k).map_err(|e| refuse(e.to_string()))?;
    let note = vocab
        .as_ref()
        .map(|v| format!(", vocab {}", v.ids().len()))
        .unwrap_or_default();
    Ok((vocab.map(Arc::new), note))
}

fn load_head(
    path: Option<&str>,
    dtype: WeightsDtype,
    config: &Config,
    target: &LoadedModel,
) -> Result<LoadedDrafter, SetupError> {
    let dir = match path {
        Some(p) => std::path::PathBuf::from(p),
        None => crate::model::head::default_head_dir(),
    };
    let dtype = match dtype {
        WeightsDtype::AsIs => WeightsDtype::Auto,
        d => d,
    };
    let head_error = |e: ModelError| SetupError::Draft(format!("head {}: {e}", dir.display()));
    let tensors = crate::model::head::load_head(&dir).map_err(head_error)?;
    let vocab = config.speculation.draft_vocab;
    let head = DraftHead::new(tensors, &target.model, dtype, vocab).map_err(head_error)?;
    let vocab_note = match head.vocab_ids() {
        Some(ids) => format!("vocab {}", ids.len()),
        None => "full vocab".into(),
    };
    let vocab_note = match head.feature_taps() {
        crate::model::FeatureTaps::LayerInputs(taps) => {
            format!("EAGLE-3 over layers {taps:?}, {vocab_note}")
        }
        crate::model::FeatureTaps::LastNormed => vocab_note,
    };
    let name = format!("head:{} ({vocab_note})", dir.display());
    tracing::info!(draft_head = %name, "loaded the draft head");
    Ok(LoadedDrafter::Head {
        head: Arc::new(head),
        name,
        lookup: None,
    })
}

/// Loads the target and the drafter that `speculation.draft_model` names (blocking work: call
/// it off the async runtime's threads via `spawn_blocking`); returns them with the drafter's
/// display name.
pub fn load_models(
    config: &Config,
) -> Result<(LoadedModel, Option<LoadedDrafter>, String), SetupError> {
    let target = load_target(config)?;
    let sp = &config.speculation;
    let drafter = load_drafter(&sp.draft_model, sp.draft_weights_dtype, config, &target)?;
    let name = drafter
        .as_ref()
        .map_or_else(|| "none".to_string(), LoadedDrafter::name);
    Ok((target, drafter, name))
}

/// The engine settings from the config: `[engine]` as read, with its thread counts of 0 made
/// `threads` (the runtime's compute thread count) and the checked speculation settings.
pub fn engine_config(config: &Config, threads: usize) -> EngineConfig {
    let e = &config.engine;
    let or_runtime = |n: usize| if n == 0 { threads } else { n };
    EngineConfig {
        target_threads: or_runtime(e.target_threads),
        draft_threads: or_runtime(e.draft_threads),
        speculation: config.speculation.settings,
        stall_after_rounds: stall_after_rounds_for_tests(),
        price_memory: crate::price_identity::price_memory(config),
        context_from_model: config.model.context_length == 0,
        ..e.clone()
    }
}

/// `TANDEM_TEST_STALL_AFTER_ROUNDS=N`: the fault the watchdog's tests inject into a real
/// server (its scheduler stops waking up after N rounds, as a lost wake-up would).
fn stall_after_rounds_for_tests() -> Option<u64> {
    std::env::var("TANDEM_TEST_STALL_AFTER_ROUNDS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
}
