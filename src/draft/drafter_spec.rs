//! The drafter a user names: `none`, `prompt-lookup[:MIN-MAX]`, `suffix[:MIN-MAX]`, `self:K`,
//! `head[:PATH]`, `head+lookup[:PATH]`, `default` or a model path, as one enum.
//!
//! Why it exists: the same name arrives from the config file (`speculation.draft_model`) and from
//! CLI flags, and is acted on by model loading, the server and the CLI. Parsing it once, where it
//! is read, gives every boundary the same rules and error texts, and lets everything downstream
//! match on the variant instead of sniffing the string again.

use std::fmt;
use std::str::FromStr;

use super::PromptLookup;

/// Which drafter proposes tokens for the target to verify, as a user names it (config,
/// flags); `setup::load_drafter` turns it into a loaded drafter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DraftSpec {
    /// No speculation: plain decoding.
    None,
    /// N-gram matches in the sequence's own text (no model); `suffix`: and in earlier
    /// requests' texts.
    PromptLookup(PromptLookup),
    /// The target's own first K layers (`self:K`), K >= 1.
    SelfLayers(usize),
    /// A draft head on the target's features: `head` (the default model's shipped head) or
    /// `head:PATH` (a head folder); `head+lookup[:PATH]`: prompt lookup drafts first, the
    /// head where the text has no n-gram match.
    Head { path: Option<String>, lookup: bool },
    /// A draft model: `default` (the default model file), a .gguf file, a Hugging Face folder
    /// or a hub id.
    Model(String),
    /// `draft+lookup:MODEL`: prompt lookup drafts first, the draft model (a model name or
    /// `self:K`) where the text has no n-gram match.
    LookupThen(Box<DraftSpec>),
}

/// A drafter name that cannot be read; its text is the rule, for the caller to prefix with the
/// key or flag.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidDraftSpec {
    #[error(
        "must be none, prompt-lookup[:MIN-MAX], suffix[:MIN-MAX], default, self:K, head[:PATH], \
         head+lookup[:PATH], draft+lookup:MODEL or a model path"
    )]
    Empty,
    #[error("`{0}`: want draft+lookup:MODEL, MODEL a model path, `default` or self:K")]
    LookupThen(String),
    /// Prompt-lookup n-gram sizes out of range (the text is [`PromptLookup::parse_ngrams`]'s).
    #[error("{0}")]
    Ngrams(String),
    #[error("`{0}`: want self:K, K >= 1 layers of the target")]
    SelfLayers(String),
}

impl FromStr for DraftSpec {
    type Err = InvalidDraftSpec;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if t.is_empty() {
            return Err(InvalidDraftSpec::Empty);
        }
        if t == "none" {
            return Ok(Self::None);
        }
        if t == "prompt-lookup" {
            return Ok(Self::PromptLookup(PromptLookup::default()));
        }
        if let Some(sizes) = t.strip_prefix("prompt-lookup:") {
            return PromptLookup::parse_ngrams(sizes)
                .map(Self::PromptLookup)
                .map_err(InvalidDraftSpec::Ngrams);
        }
        if t == "suffix" {
            return Ok(Self::PromptLookup(
                PromptLookup::default().across_requests(),
            ));
        }
        if let Some(sizes) = t.strip_prefix("suffix:") {
            return PromptLookup::parse_ngrams(sizes)
                .map(|p| Self::PromptLookup(p.across_requests()))
                .map_err(InvalidDraftSpec::Ngrams);
        }
        for (name, lookup) in [("head", false), ("head+lookup", true)] {
            if t == name {
                return Ok(Self::Head { path: None, lookup });
            }
            if let Some(path) = t.strip_prefix(name).and_then(|r| r.strip_prefix(':')) {
                return match path.trim() {
                    "" => Err(InvalidDraftSpec::Empty),
                    p => Ok(Self::Head {
                        path: Some(p.to_string()),
                        lookup,
                    }),
                };
            }
        }
        if let Some(model) = t.strip_prefix("draft+lookup:") {
            return match model.parse::<DraftSpec>() {
                Ok(m @ (Self::Model(_) | Self::SelfLayers(_))) => Ok(Self::LookupThen(Box::new(m))),
                _ => Err(InvalidDraftSpec::LookupThen(s.to_string())),
            };
        }
        if let Some(k) = t.strip_prefix("self:") {
            return match k.trim().parse::<usize>() {
                Ok(k) if k >= 1 => Ok(Self::SelfLayers(k)),
                _ => Err(InvalidDraftSpec::SelfLayers(s.to_string())),
            };
        }
        // Anything else names a model; whether it exists is for loading to say.
        Ok(Self::Model(s.to_string()))
    }
}

impl fmt::Display for DraftSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => f.write_str("none"),
            Self::PromptLookup(p) => {
                let (lo, hi) = p.ngrams();
                let kind = if p.looks_across_requests() {
                    "suffix"
                } else {
                    "prompt-lookup"
                };
                write!(f, "{kind}:{lo}-{hi}")
            }
            Self::SelfLayers(k) => write!(f, "self:{k}"),
            Self::Head { path, lookup } => {
                f.write_str(if *lookup { "head+lookup" } else { "head" })?;
                match path {
                    Some(p) => write!(f, ":{p}"),
                    None => Ok(()),
                }
            }
            Self::Model(m) => f.write_str(m),
            Self::LookupThen(m) => write!(f, "draft+lookup:{m}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_drafter_name_is_read() {
        let parse = |s: &str| s.parse::<DraftSpec>();
        assert_eq!(parse("none"), Ok(DraftSpec::None));
        assert_eq!(
            parse("prompt-lookup"),
            Ok(DraftSpec::PromptLookup(PromptLookup::new(1, 3)))
        );
        assert_eq!(
            parse("prompt-lookup:2-5"),
            Ok(DraftSpec::PromptLookup(PromptLookup::new(2, 5)))
        );
        assert_eq!(
            parse("prompt-lookup:4"),
            Ok(DraftSpec::PromptLookup(PromptLookup::new(4, 4)))
        );
        assert_eq!(
            parse("suffix"),
            Ok(DraftSpec::PromptLookup(
                PromptLookup::default().across_requests()
            ))
        );
        assert_eq!(parse("suffix:2-4").unwrap().to_string(), "suffix:2-4");
        assert!(matches!(
            parse("suffix:0-4"),
            Err(InvalidDraftSpec::Ngrams(_))
        ));
        assert_eq!(parse("self:8"), Ok(DraftSpec::SelfLayers(8)));
        let head = |path: Option<&str>, lookup| DraftSpec::Head {
            path: path.map(String::from),
            lookup,
        };
        assert_eq!(parse("head"), Ok(head(None, false)));
        assert_eq!(
            parse("head:heads/mine"),
            Ok(head(Some("heads/mine"), false))
        );
        assert_eq!(parse("head+lookup"), Ok(head(None, true)));
        assert_eq!(
            parse("head+lookup:heads/mine"),
            Ok(head(Some("heads/mine"), true))
        );
        assert_eq!(parse("head:"), Err(InvalidDraftSpec::Empty));
        assert_eq!(parse("head+lookup:"), Err(InvalidDraftSpec::Empty));
        assert_eq!(parse("default"), Ok(DraftSpec::Model("default".into())));
        let first = |m: DraftSpec| Ok(DraftSpec::LookupThen(Box::new(m)));
        assert_eq!(
            parse("draft+lookup:default"),
            first(DraftSpec::Model("default".into()))
        );
        assert_eq!(
            parse("draft+lookup:self:6"),
            first(DraftSpec::SelfLayers(6))
        );
        assert_eq!(
            parse("draft+lookup:self:6").unwrap().to_string(),
            "draft+lookup:self:6"
        );
        for bad in [
            "draft+lookup:",
            "draft+lookup:head",
            "draft+lookup:prompt-lookup",
        ] {
            assert!(
                matches!(parse(bad), Err(InvalidDraftSpec::LookupThen(_))),
                "{bad}"
            );
        }
        assert_eq!(
            parse("models/draft.gguf"),
            Ok(DraftSpec::Model("models/draft.gguf".into()))
        );
        // Only the exact keyword means prompt lookup; anything longer is a model name.
        assert_eq!(
            parse("prompt-lookupx"),
            Ok(DraftSpec::Model("prompt-lookupx".into()))
        );
    }

    #[test]
    fn bad_names_say_what_is_wrong() {
        for bad in [
            "prompt-lookup:0-3",
            "prompt-lookup:3-2",
            "prompt-lookup:1-17",
            "prompt-lookup:x",
        ] {
            let e = bad.parse::<DraftSpec>().unwrap_err();
            assert!(e.to_string().contains("n-gram sizes"), "{bad}: {e}");
        }
        for bad in ["self:0", "self:x", "self:"] {
            let e = bad.parse::<DraftSpec>().unwrap_err();
            assert!(e.to_string().contains("want self:K"), "{bad}: {e}");
        }
        assert_eq!(" ".parse::<DraftSpec>(), Err(InvalidDraftSpec::Empty));
    }

    #[test]
    fn a_spec_prints_as_it_parses() {
        for s in [
            "none",
            "prompt-lookup:1-3",
            "prompt-lookup:2-5",
            "self:8",
            "head",
            "head:some/folder",
            "head+lookup",
            "head+lookup:some/folder",
            "default",
        ] {
            assert_eq!(s.parse::<DraftSpec>().unwrap().to_string(), s);
        }
        assert_eq!(
            DraftSpec::PromptLookup(PromptLookup::default()).to_string(),
            "prompt-lookup:1-3"
        );
    }
}
