//! A drafter ready to run: what a [`DraftSpec`] comes to once its model or head is loaded and
//! checked against the target.
//!
//! Why it exists: setup loads a drafter once, and the engine, `tandem generate` and `tandem
//! bench` all take the same value. One type, with the questions every user of it asks (its
//! name, whether prompt lookup drafts first, what it looks ahead with) answered here, means a
//! new kind of drafter is a new variant and its arms, not a conversion at every boundary.

use std::sync::Arc;

use super::{DraftOrigin, DraftOrigins, DraftSpec, PromptLookup, Translation};
use crate::model::head::DraftHead;
use crate::model::{Decoder, DraftVocab, FeatureTaps};

/// A loaded drafter; `Option<LoadedDrafter>` is `None` for plain decoding.
#[derive(Clone)]
pub enum LoadedDrafter {
    /// Prompt lookup with these n-gram sizes (`suffix`: across requests too).
    PromptLookup(PromptLookup),
    /// A draft model (a separate file, or the target's first layers).
    Model {
        model: Arc<Decoder>,
        /// The reduced vocabulary it drafts over (`None`: its whole vocabulary).
        vocab: Option<Arc<DraftVocab>>,
        /// How it drafts for a target of another vocabulary (`None`: the same one).
        translation: Option<Arc<Translation>>,
        /// Prompt lookup drafting first, the model where the text has no match
        /// (`draft+prompt-lookup`).
        lookup: Option<PromptLookup>,
        /// As logs and the admin API show it, such as `model.gguf (Q8_0)`.
        name: String,
        /// It is the target's own first layers (`self:K`).
        self_layers: bool,
    },
    /// A draft head on the target's own features; with `lookup`, prompt lookup drafts first
    /// and the head where the text has no n-gram match (`head+prompt-lookup`).
    Head {
        head: Arc<DraftHead>,
        /// Such as `head:FOLDER (vocab K)`.
        name: String,
        lookup: Option<PromptLookup>,
    },
}

impl LoadedDrafter {
    /// The drafter's name, as logs, the admin API and `tandem bench` report it.
    pub fn name(&self) -> String {
        match self {
            Self::PromptLookup(p) => DraftSpec::PromptLookup(*p).to_string(),
            Self::Model { name, .. } | Self::Head { name, .. } => name.clone(),
        }
    }

    /// The prompt lookup that drafts first, before a model or a head; for prompt lookup alone,
    /// itself.
    pub fn lookup(&self) -> Option<PromptLookup> {
        match self {
            Self::PromptLookup(p) => Some(*p),
            Self::Model { lookup, .. } | Self::Head { lookup, .. } => *lookup,
        }
    }

    /// This drafter with prompt lookup drafting first (a model or a head; prompt lookup alone
    /// is left as it is), its name marked so.
    pub fn with_lookup_first(mut self, first: PromptLookup) -> Self {
        match &mut self {
            Self::Model { lookup, name, .. } => {
                *lookup = Some(first);
                *name = format!("draft+prompt-lookup:{name}");
            }
            Self::Head { lookup, name, .. } => {
                *lookup = Some(first);
                *name = match name.strip_prefix("head:") {
                    Some(rest) => format!("head+prompt-lookup:{rest}"),
                    None => format!("head+prompt-lookup:{name}"),
                };
            }
            Self::PromptLookup(_) => {}
        }
        self
    }

    /// The target's features a head drafts from (`None`: the drafter needs none).
    pub fn feature_taps(&self) -> Option<FeatureTaps> {
        match self {
            Self::Head { head, .. } => Some(head.feature_taps()),
            _ => None,
        }
    }

    /// What its drafts are called, by the kind of their proposal (token provenance).
    pub fn origins(&self) -> DraftOrigins {
        let lookup = self.lookup().map(|p| {
            if p.looks_across_requests() {
                DraftOrigin::Suffix
            } else {
                DraftOrigin::PromptLookup
            }
        });
        let model = match self {
            Self::PromptLookup(_) => None,
            Self::Model { self_layers, .. } => Some(if *self_layers {
                DraftOrigin::SelfLayers
            } else {
                DraftOrigin::DraftModel
            }),
            Self::Head { .. } => Some(DraftOrigin::Head),
        };
        DraftOrigins { lookup, model }
    }

    /// How a draft model of another vocabulary drafts for the target (`None` for any other).
    pub fn translation(&self) -> Option<&Arc<Translation>> {
        match self {
            Self::Model { translation, .. } => translation.as_ref(),
            _ => None,
        }
    }

    /// Whether it keeps a KV cache of its own (a draft model), which a prefix cache serves.
    pub fn keeps_a_cache(&self) -> bool {
        matches!(self, Self::Model { .. })
    }
}
