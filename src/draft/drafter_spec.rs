//! The drafter a user names: `none`, `prompt-lookup[:MIN-MAX]`, `suffix[:MIN-MAX]`, `self:K`,
//! `head[:PATH]`, `head+prompt-lookup[:PATH]`, `draft+prompt-lookup:MODEL`, `default` or a
//! model path, as one enum.
//!
//! Why it exists: the same name arrives from the config file (`speculation.draft_model`), from
//! CLI flags and from `tandem bench`'s modes, and is acted on by model loading, the server and
//! the CLI. Parsing it once, where it is read, gives every boundary the same names, aliases,
//! rules and error texts, and lets everything downstream match on the variant instead of
//! sniffing the string again.

use std::fmt;
use std::str::FromStr;

use super::PromptLookup;

/// Other spellings of drafter names, accepted everywhere a drafter is named and read as the
/// canonical name beside them (older configs, scripts and bench commands use them).
pub const DRAFTER_ALIASES: [(&str, &str); 5] = [
    ("pld", "prompt-lookup"),
    ("draft+lookup", "draft+prompt-lookup"),
    ("draft+pld", "draft+prompt-lookup"),
    ("head+lookup", "head+prompt-lookup"),
    ("head+pld", "head+prompt-lookup"),
];

/// `name` (the part of a drafter name before any `:`) with an alias read as its canonical
/// name; any other name as it is.
pub fn canonical_drafter_name(name: &str) -> &str {
    DRAFTER_ALIASES
        .iter()
        .find(|(alias, _)| *alias == name)
        .map_or(name, |(_, canonical)| canonical)
}

/// Which drafter proposes tokens for the target to verify, as a user names it (config,
/// flags); `setup::load_drafter` turns it into a loaded drafter.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DraftSpec {
    /// No speculation: plain decoding.
    None,
    /// N-gram matches in the sequence's own text (no model); `suffix`: and in earlier
    /// requests' texts.
    PromptLookup(PromptLookup),
    /// The target's own first K layers (`self:K`), K >= 1.
    SelfLayers(usize),
    /// A draft head on the target's features: `head` (the default model's shipped head) or
    /// `head:PATH` (a head folder); `head+prompt-lookup[:PATH]`: prompt lookup (`lookup`)
    /// drafts first, the head where the text has no n-gram match.
    Head {
        path: Option<String>,
        lookup: Option<PromptLookup>,
    },
    /// A draft model: `default` (the default model file), a .gguf file, a Hugging Face folder
    /// or a hub id.
    Model(String),
    /// `draft+prompt-lookup:MODEL`: prompt lookup drafts first, the draft model (a model
    /// name or `self:K`) where the text has no n-gram match.
    LookupThen(PromptLookup, Box<DraftSpec>),
}

/// A drafter name that cannot be read; its text is the rule, for the caller to prefix with the
/// key or flag.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidDraftSpec {
    #[error(
        "must be none, prompt-lookup[:MIN-MAX], suffix[:MIN-MAX], default, self:K, head[:PATH], \
         head+prompt-lookup[:PATH], draft+prompt-lookup:MODEL or a model path"
    )]
    Empty,
    #[error("`{0}`: want draft+prompt-lookup:MODEL, MODEL a model path, `default` or self:K")]
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
        let (name, rest) = match t.split_once(':') {
            Some((n, r)) => (n, Some(r)),
            None => (t, None),
        };
        match (canonical_drafter_name(name), rest) {
            ("none", None) => Ok(Self::None),
            ("prompt-lookup", None) => Ok(Self::PromptLookup(PromptLookup::default())),
            ("prompt-lookup", Some(sizes)) => PromptLookup::parse_ngrams(sizes)
                .map(Self::PromptLookup)
                .map_err(InvalidDraftSpec::Ngrams),
            ("suffix", None) => Ok(Self::PromptLookup(
                PromptLookup::default().across_requests(),
            )),
            ("suffix", Some(sizes)) => PromptLookup::parse_ngrams(sizes)
                .map(|p| Self::PromptLookup(p.across_requests()))
                .map_err(InvalidDraftSpec::Ngrams),
            (head @ ("head" | "head+prompt-lookup"), path) => {
                let lookup = (head != "head").then(PromptLookup::default);
                match path.map(str::trim) {
                    None => Ok(Self::Head { path: None, lookup }),
                    Some("") => Err(InvalidDraftSpec::Empty),
                    Some(p) => Ok(Self::Head {
                        path: Some(p.to_string()),
                        lookup,
                    }),
                }
            }
            ("draft+prompt-lookup", model) => match model.map(str::parse::<DraftSpec>) {
                Some(Ok(m @ (Self::Model(_) | Self::SelfLayers(_)))) => {
                    Ok(Self::LookupThen(PromptLookup::default(), Box::new(m)))
                }
                _ => Err(InvalidDraftSpec::LookupThen(s.to_string())),
            },
            ("self", Some(k)) => match k.trim().parse::<usize>() {
                Ok(k) if k >= 1 => Ok(Self::SelfLayers(k)),
                _ => Err(InvalidDraftSpec::SelfLayers(s.to_string())),
            },
            // Anything else names a model; whether it exists is for loading to say.
            _ => Ok(Self::Model(s.to_string())),
        }
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
                f.write_str(if lookup.is_some() {
                    "head+prompt-lookup"
                } else {
                    "head"
                })?;
                match path {
                    Some(p) => write!(f, ":{p}"),
                    None => Ok(()),
                }
            }
            Self::Model(m) => f.write_str(m),
            Self::LookupThen(_, m) => write!(f, "draft+prompt-lookup:{m}"),
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
        let head = |path: Option<&str>, lookup: bool| DraftSpec::Head {
            path: path.map(String::from),
            lookup: lookup.then(PromptLookup::default),
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
        let first = |m: DraftSpec| Ok(DraftSpec::LookupThen(PromptLookup::default(), Box::new(m)));
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
            "draft+prompt-lookup:self:6"
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
    fn every_alias_reads_as_its_canonical_name() {
        for (alias, canonical) in DRAFTER_ALIASES {
            assert_eq!(canonical_drafter_name(alias), canonical);
            let suffix = match canonical {
                "draft+prompt-lookup" => ":default",
                "head+prompt-lookup" => ":some/folder",
                _ => "",
            };
            assert_eq!(
                format!("{alias}{suffix}").parse::<DraftSpec>(),
                format!("{canonical}{suffix}").parse::<DraftSpec>(),
                "{alias}"
            );
        }
        assert_eq!(canonical_drafter_name("prompt-lookup"), "prompt-lookup");
        assert_eq!(
            "pld:2-4".parse::<DraftSpec>().unwrap().to_string(),
            "prompt-lookup:2-4"
        );
        assert_eq!(
            "self".parse::<DraftSpec>(),
            Ok(DraftSpec::Model("self".into()))
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
            "head+prompt-lookup",
            "head+prompt-lookup:some/folder",
            "draft+prompt-lookup:default",
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
