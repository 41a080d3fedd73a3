//! Which drafter wrote a draft, as a client is told it (token provenance: each output token
//! marked by who wrote it).
//!
//! Why it exists: a combined drafter (`draft+prompt-lookup`, `head+prompt-lookup`) drafts some
//! rounds by prompt lookup and others by its model, and `suffix` is prompt lookup across
//! requests; the drafter's kind alone does not say which wrote a round's drafts. A proposal's
//! confidence kind does (prompt lookup's kinds are above 0), so the loaded drafter answers once
//! what each kind of its drafts is called.

/// The drafter of an accepted draft.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DraftOrigin {
    /// N-gram matches in the request's own text.
    PromptLookup,
    /// N-gram matches in the request's text and earlier requests' texts.
    Suffix,
    /// A separate draft model.
    DraftModel,
    /// The target's own first layers (`self:K`).
    SelfLayers,
    /// A draft head on the target's features.
    Head,
}

impl DraftOrigin {
    /// The name the API reports (`drafter` of a token source run).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PromptLookup => "prompt-lookup",
            Self::Suffix => "suffix",
            Self::DraftModel => "draft-model",
            Self::SelfLayers => "self",
            Self::Head => "head",
        }
    }
}

/// What a loaded drafter's drafts are, by the kind of their proposal
/// (`Proposal::confidence_kind`): prompt lookup's (kinds above 0) and its model's or head's
/// (kind 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DraftOrigins {
    pub lookup: Option<DraftOrigin>,
    pub model: Option<DraftOrigin>,
}

impl DraftOrigins {
    /// The drafter of a proposal of confidence kind `kind` (`None` without a drafter).
    pub fn of_kind(&self, kind: u8) -> Option<DraftOrigin> {
        if kind > 0 {
            self.lookup.or(self.model)
        } else {
            self.model.or(self.lookup)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_combined_drafter_names_each_kind_of_its_drafts() {
        let o = DraftOrigins {
            lookup: Some(DraftOrigin::PromptLookup),
            model: Some(DraftOrigin::Head),
        };
        assert_eq!(o.of_kind(0), Some(DraftOrigin::Head));
        assert_eq!(o.of_kind(2), Some(DraftOrigin::PromptLookup));
        let lookup_alone = DraftOrigins {
            lookup: Some(DraftOrigin::Suffix),
            model: None,
        };
        assert_eq!(lookup_alone.of_kind(0), Some(DraftOrigin::Suffix));
        assert_eq!(DraftOrigins::default().of_kind(1), None);
    }
}
