//! Benchmark modes: how one run decodes (plain, or which drafter with which γ, lenience and
//! pipelining), written as `NAME[:key=value...]` on the command line.
//!
//! Why it exists: every mode runs in the same process on the same prompts, so a mode must say
//! exactly which engine it needs (drafter and pipelining) and how each request speculates.

use crate::draft::{canonical_drafter_name, DraftSpec, GreedyAcross, PromptLookup};
use crate::engine::{Gamma, GammaPolicy, TreeNodes};
use crate::sampling::{Lenience, RequestGate, SampledDrafts};

use super::BenchError;

/// What `draft` and `head` modes draft with: `tandem bench`'s `--draft-model` (loaded once for
/// every such mode) and `--head` (`None`: the default model's shipped head).
#[derive(Clone, Debug, PartialEq)]
pub struct BenchDrafters {
    pub draft_model: DraftSpec,
    pub head: Option<String>,
}

impl Default for BenchDrafters {
    fn default() -> Self {
        Self {
            draft_model: DraftSpec::Model("default".into()),
            head: None,
        }
    }
}

/// What a mode's answers are held to: nothing, a JSON schema, or tool calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Structured {
    #[default]
    Free,
    /// Each question answered into a JSON schema (`structured.rs`).
    Json,
    /// Each question answered with a call of one of a few tools (`tool_choice: required`).
    Tools,
    /// Each question answered freely under the tools workload's system prompt: the baseline
    /// that tells the tools grammar's cost from its longer prompt's.
    ToolsPrompt,
}

impl Structured {
    pub fn parse(v: &str) -> Option<Self> {
        match v {
            "none" | "free" => Some(Self::Free),
            "json" => Some(Self::Json),
            "tools" => Some(Self::Tools),
            "tools_prompt" => Some(Self::ToolsPrompt),
            _ => None,
        }
    }

    /// Whether the answers are held to a grammar.
    pub fn is_constrained(self) -> bool {
        matches!(self, Self::Json | Self::Tools)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Mode {
    /// As given on the command line: the name in tables, JSON and the chart.
    pub label: String,
    /// The drafter its engine carries (`None`: no drafter), as the config would name it; modes
    /// with the same one share an engine.
    pub drafter: Option<DraftSpec>,
    /// How a draft model of another vocabulary drafts for greedy requests (`None`: as
    /// configured).
    pub cross_vocabulary: Option<GreedyAcross>,
    pub gamma: GammaPolicy,
    /// `None` = exact (1).
    pub lenience: Option<Lenience>,
    pub pipeline: bool,
    /// The engine keeps finished sequences' caches and starts prompts from cached prefixes.
    pub prefix_cache: bool,
    /// The confidence gate each request drafts under (a draft model only).
    pub gate: RequestGate,
    /// Each request's `confidence_pricing` (`None`: the server's, off by default).
    pub confidence_pricing: Option<bool>,
    /// Each request's `tree_nodes` (`None`: the server's, 0 by default).
    pub tree_nodes: Option<TreeNodes>,
    /// Each request's `sampled_drafts` (`None`: the server's, `auto` by default).
    pub sampled_drafts: Option<SampledDrafts>,
    /// What the answers are held to.
    pub structured: Structured,
}

impl Mode {
    /// Plain decoding: no drafter, and no forced tokens drafted either.
    pub fn is_plain(&self) -> bool {
        self.drafter.is_none() && self.gamma == GammaPolicy::Off
    }

    /// The mode this one is measured against: for a speculative mode, the first plain mode
    /// under the same structure (constrained speculation against constrained plain decoding);
    /// for a constrained plain mode, the first unconstrained plain mode (the constraint's own
    /// cost), for tool calls the one under the tools' system prompt where there is one.
    /// `None` for the baseline itself.
    pub fn baseline<'a>(&self, modes: &'a [Mode]) -> Option<&'a Mode> {
        let plain_under = |s: Structured| modes.iter().find(|m| m.is_plain() && m.structured == s);
        let want = if self.is_plain() {
            match self.structured {
                Structured::Free => return None,
                Structured::Tools => {
                    return plain_under(Structured::ToolsPrompt)
                        .or_else(|| plain_under(Structured::Free));
                }
                _ => Structured::Free,
            }
        } else {
            self.structured
        };
        plain_under(want)
    }

    /// The engine this mode runs on: modes with the same drafter, pipelining and prefix cache
    /// share one.
    pub fn engine_key(&self) -> EngineKey {
        (
            self.drafter.clone(),
            self.cross_vocabulary,
            self.pipeline,
            self.prefix_cache,
        )
    }

    /// Whether its drafter is a draft model (alone or after prompt lookup).
    pub fn drafts_with_a_model(&self) -> bool {
        matches!(
            self.drafter,
            Some(DraftSpec::Model(_) | DraftSpec::SelfLayers(_) | DraftSpec::LookupThen(..))
        )
    }

    /// Whether its drafter is a draft head.
    pub fn drafts_with_a_head(&self) -> bool {
        matches!(self.drafter, Some(DraftSpec::Head { .. }))
    }

    /// Parses `plain`, `prompt-lookup`, `suffix` (prompt lookup across requests), `draft`
    /// (alias `draft-model`: `drafters.draft_model`), `draft+prompt-lookup` (prompt lookup
    /// first, the draft model where the text has no match), `head` or `head+prompt-lookup`
    /// (likewise with the head `drafters.head`), drafter names read as the config reads them
    /// (with their aliases: `pld`, `draft+pld`, ...), each
    /// optionally followed by `:gamma=N|adaptive`, `:lenience=L`, `:pipeline=true|false`,
    /// `:tree=N` (up to N alternative nodes a round, verified with the chain as a token tree),
    /// `:confidence=true|false` (the governor cuts chains by the drafter's confidence),
    /// for prompt lookup `:ngram=MIN-MAX`, for a draft model the draft gate's keys as the config
    /// names them (`:use_egag=true`, `:egag_threshold=T`, `:egag_ema_beta=B`, `:draft_p_min=P`;
    /// `:egag=T` is `use_egag` at threshold T), and for every mode
    /// `:prefix_cache=true|false` and `:structured=none|json|tools` (answers held to a JSON
    /// schema or to tool calls). `forced` decodes with no drafter but speculating, so a
    /// constraint's forced tokens are its only drafts. Speculative modes default to the governor (`gamma=adaptive`), exact acceptance and no
    /// pipelining; every mode to the prefix cache on.
    pub fn parse(
        spec: &str,
        max_gamma: usize,
        drafters: &BenchDrafters,
    ) -> Result<Mode, BenchError> {
        let bad = |reason: String| BenchError::Options(format!("mode `{spec}`: {reason}"));
        let mut parts = spec.trim().split(':');
        let name = parts.next().unwrap_or("");
        let drafter = drafter_named(name, drafters).map_err(bad)?;
        let mut mode = Mode::with_defaults(spec.trim(), drafter, name == "forced");
        for kv in parts {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| bad(format!("`{kv}` is not key=value")))?;
            mode.set(k, v, max_gamma, &bad)?;
        }
        Ok(mode)
    }

    /// A mode before its settings: speculative ones (and `forced`) under the governor, exact,
    /// not pipelined; every one with the prefix cache and free answers.
    fn with_defaults(label: &str, drafter: Option<DraftSpec>, forced: bool) -> Mode {
        Mode {
            label: label.to_string(),
            gamma: if drafter.is_none() && !forced {
                GammaPolicy::Off
            } else {
                GammaPolicy::Adaptive
            },
            drafter,
            cross_vocabulary: None,
            lenience: None,
            pipeline: false,
            prefix_cache: true,
            gate: RequestGate::default(),
            confidence_pricing: None,
            tree_nodes: None,
            sampled_drafts: None,
            structured: Structured::Free,
        }
    }

    /// Applies one `key=value` setting; `bad` words a refusal as this mode's.
    fn set(
        &mut self,
        k: &str,
        v: &str,
        max_gamma: usize,
        bad: &dyn Fn(String) -> BenchError,
    ) -> Result<(), BenchError> {
        if k == "prefix_cache" {
            self.prefix_cache = v.parse().map_err(|_| bad(format!("prefix_cache `{v}`")))?;
            return Ok(());
        }
        if k == "structured" {
            self.structured = Structured::parse(v).ok_or_else(|| {
                bad(format!(
                    "structured `{v}` (none, json, tools, tools_prompt)"
                ))
            })?;
            return Ok(());
        }
        if self.drafter.is_none() {
            return Err(bad(
                "plain and forced decoding take no settings but prefix_cache and structured".into(),
            ));
        }
        match k {
            "gamma" | "spec_length" if v == "adaptive" => self.gamma = GammaPolicy::Adaptive,
            "gamma" | "spec_length" => {
                let g: usize = v.parse().map_err(|_| bad(format!("gamma `{v}`")))?;
                let g = Gamma::within(g, max_gamma).map_err(|e| bad(format!("gamma {e}")))?;
                self.gamma = GammaPolicy::Fixed(g);
            }
            "lenience" => {
                let l: f64 = v.parse().map_err(|_| bad(format!("lenience `{v}`")))?;
                let l = Lenience::try_from(l).map_err(|e| bad(format!("lenience {e}")))?;
                self.lenience = Some(l);
            }
            "pipeline" => {
                self.pipeline = v.parse().map_err(|_| bad(format!("pipeline `{v}`")))?;
            }
            "confidence" => {
                let on = v.parse().map_err(|_| bad(format!("confidence `{v}`")))?;
                self.confidence_pricing = Some(on);
            }
            "tree" => {
                let n: usize = v.parse().map_err(|_| bad(format!("tree `{v}`")))?;
                let n = TreeNodes::within(n, max_gamma).map_err(|e| bad(format!("tree {e}")))?;
                self.tree_nodes = Some(n);
            }
            "ngram" => self.set_ngrams(v, bad)?,
            "sampled" | "sampled_drafts" => {
                self.sampled_drafts = Some(v.parse().map_err(|e| bad(format!("sampled {e}")))?);
            }
            "cross_vocabulary" if self.drafts_with_a_model() => {
                self.cross_vocabulary = Some(v.parse().map_err(bad)?);
            }
            "cross_vocabulary" => {
                return Err(bad("cross_vocabulary is a draft-model setting".into()))
            }
            "use_egag" | "egag_threshold" | "egag_ema_beta" | "draft_p_min" | "egag"
            | "egag_beta" | "p_min" => self.set_gate(k, v, bad)?,
            other => {
                return Err(bad(format!(
                    "unknown setting `{other}` (gamma, lenience, pipeline, tree, confidence, \
                     ngram, sampled, cross_vocabulary, use_egag, egag_threshold, egag_ema_beta, \
                     draft_p_min, prefix_cache, structured)"
                )))
            }
        }
        Ok(())
    }

    /// `ngram=MIN-MAX`: the n-gram sizes of a mode's prompt lookup.
    fn set_ngrams(
        &mut self,
        v: &str,
        bad: &dyn Fn(String) -> BenchError,
    ) -> Result<(), BenchError> {
        let lookup = match &mut self.drafter {
            Some(DraftSpec::PromptLookup(p))
            | Some(DraftSpec::Head {
                lookup: Some(p), ..
            })
            | Some(DraftSpec::LookupThen(p, _)) => p,
            _ => return Err(bad("ngram is a prompt-lookup setting".into())),
        };
        let sizes = PromptLookup::parse_ngrams(v).map_err(bad)?;
        *lookup = lookup.with_ngrams_of(sizes);
        Ok(())
    }

    /// The draft gate's settings, by the config's and the request's keys (`use_egag`,
    /// `egag_threshold`, `egag_ema_beta`, `draft_p_min`; older bench commands' `egag=X` (on, at
    /// X), `egag_beta` and `p_min` too), checked as a whole.
    fn set_gate(
        &mut self,
        k: &str,
        v: &str,
        bad: &dyn Fn(String) -> BenchError,
    ) -> Result<(), BenchError> {
        if !self.drafts_with_a_model() {
            return Err(bad(format!("{k} is a draft-model setting")));
        }
        if k == "use_egag" {
            self.gate.use_egag = Some(v.parse().map_err(|_| bad(format!("{k} `{v}`")))?);
            return Ok(());
        }
        let x: f32 = v.parse().map_err(|_| bad(format!("{k} `{v}`")))?;
        match k {
            // `egag=X` (older bench commands): the entropy rule on at threshold X.
            "egag" => {
                self.gate.use_egag = Some(true);
                self.gate.egag_threshold = Some(x);
            }
            "egag_threshold" => self.gate.egag_threshold = Some(x),
            "egag_ema_beta" | "egag_beta" => self.gate.egag_ema_beta = Some(x),
            _ => self.gate.draft_p_min = Some(x),
        }
        self.gate
            .check()
            .map_err(|(key, rule)| bad(format!("{key} {rule}")))
    }
}

/// The engine a mode runs on: its drafter, how a drafter of another vocabulary drafts, its
/// pipelining and its prefix cache.
pub type EngineKey = (Option<DraftSpec>, Option<GreedyAcross>, bool, bool);

/// The drafter a mode's name asks for (`Ok(None)`: none), its names the config's (through
/// [`canonical_drafter_name`]) plus `plain`, `forced` and `draft`.
fn drafter_named(name: &str, drafters: &BenchDrafters) -> Result<Option<DraftSpec>, String> {
    let model = || match &drafters.draft_model {
        m @ (DraftSpec::Model(_) | DraftSpec::SelfLayers(_)) => Ok(Box::new(m.clone())),
        other => Err(format!(
            "`{name}` drafts with --draft-model, which names no model (`{other}`)"
        )),
    };
    let head = |lookup| DraftSpec::Head {
        path: drafters.head.clone(),
        lookup,
    };
    Ok(Some(match canonical_drafter_name(name) {
        // `forced`: no drafter, speculating: only a constraint's forced tokens are drafted.
        "plain" | "forced" => return Ok(None),
        "draft" | "draft-model" => *model()?,
        "draft+prompt-lookup" => DraftSpec::LookupThen(PromptLookup::default(), model()?),
        "head" => head(None),
        "head+prompt-lookup" => head(Some(PromptLookup::default())),
        n @ ("prompt-lookup" | "suffix") => n.parse().map_err(|e| format!("{e}"))?,
        _ => {
            return Err(format!(
                "unknown mode `{name}` (plain, prompt-lookup, suffix, draft, \
                 draft+prompt-lookup, head, head+prompt-lookup, forced)"
            ))
        }
    }))
}

/// Parses a comma-separated mode list; `plain` is added first when missing, since every
/// speedup is measured against it.
pub fn parse_modes(
    list: &str,
    max_gamma: usize,
    drafters: &BenchDrafters,
) -> Result<Vec<Mode>, BenchError> {
    let mut modes = Vec::new();
    for spec in list.split(',').filter(|s| !s.trim().is_empty()) {
        let m = Mode::parse(spec, max_gamma, drafters)?;
        if modes.iter().any(|o: &Mode| o.label == m.label) {
            return Err(BenchError::Options(format!(
                "mode `{}` is listed twice",
                m.label
            )));
        }
        modes.push(m);
    }
    if !modes.iter().any(Mode::is_plain) {
        modes.insert(0, Mode::parse("plain", max_gamma, drafters)?);
    }
    Ok(modes)
}

#[cfg(test)]
mod tests;
