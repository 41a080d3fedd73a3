//! Where one `tandem generate` run happens: the reference loops (plain, or a fixed γ every
//! round) or the engine with its governor (`governed`), behind one call so the shown run and
//! `--compare`'s timed runs go the same way.

use std::io::Write;
use std::sync::Arc;

use tandem::draft::{LoadedDrafter, ModelDrafter, Proposer};
use tandem::engine::{
    generate_plain, generate_speculative, FixedSpeculation, GenerationOutput, GenerationRequest,
    OnOutput, OutputPiece, SpeculationStats,
};
use tandem::model::Decoder;

use super::governed::GovernedEngine;
use super::CliError;

/// The proposer of a loaded drafter (a draft model's shares its weights); `None` for none.
fn proposer(drafter: Option<&LoadedDrafter>) -> Option<Box<dyn Proposer + '_>> {
    match drafter? {
        LoadedDrafter::PromptLookup(p) => Some(Box::new(*p)),
        LoadedDrafter::Model {
            model,
            vocab,
            translation,
            lookup,
            name,
            ..
        } => Some(Box::new(
            ModelDrafter::new(Arc::clone(model), name.clone())
                .with_draft_vocab(vocab.clone())
                .with_translation(translation.clone())
                .with_lookup(*lookup),
        )),
        // Refused before loading (see `run`).
        LoadedDrafter::Head { .. } => None,
    }
}

/// Where a generation runs: the reference loops (plain, or a fixed γ), or the engine with
/// its governor.
pub enum Runner<'a> {
    /// A drafter and its fixed γ, if any.
    Reference {
        target: &'a Decoder,
        fixed: Option<(LoadedDrafter, FixedSpeculation)>,
    },
    /// The engine, and for plain runs in the reference loop (`plain_in_loop`) its target.
    Governed {
        engine: GovernedEngine,
        target: &'a Decoder,
        plain_in_loop: bool,
    },
}

impl Runner<'_> {
    /// Where this runner's plain runs decode: `engine` or `loop`.
    pub fn plain_path(&self) -> &'static str {
        match self {
            Self::Governed {
                plain_in_loop: false,
                ..
            } => "engine",
            _ => "loop",
        }
    }

    /// One generation, speculative (`speculative`, with a drafter) or plain, optionally
    /// streaming its text.
    pub fn run(
        &self,
        req: &GenerationRequest,
        speculative: bool,
        stream: bool,
    ) -> Result<(GenerationOutput, Option<SpeculationStats>), CliError> {
        let mut stdout = std::io::stdout().lock();
        let mut write_err = None;
        let mut on_output = |piece: OutputPiece<'_>| {
            if stream && !piece.text.is_empty() {
                if let Err(e) = stdout
                    .write_all(piece.text.as_bytes())
                    .and_then(|_| stdout.flush())
                {
                    write_err = Some(e);
                    return false;
                }
            }
            true
        };
        let result = match self {
            Self::Reference { target, fixed } => match fixed.as_ref().filter(|_| speculative) {
                Some((d, spec)) => run_reference(
                    target,
                    proposer(Some(d)).map(|p| (p, *spec)),
                    req,
                    &mut on_output,
                )?,
                None => run_reference(target, None, req, &mut on_output)?,
            },
            Self::Governed {
                target,
                plain_in_loop: true,
                ..
            } if !speculative => run_reference(target, None, req, &mut on_output)?,
            Self::Governed { engine, .. } => {
                let (out, st) = engine.generate(req, speculative, &mut on_output)?;
                (out, speculative.then_some(st))
            }
        };
        if let Some(e) = write_err {
            return Err(CliError::Output(e));
        }
        if stream {
            writeln!(stdout).map_err(CliError::Output)?;
        }
        Ok(result)
    }
}

/// One generation in the reference loops, plain (no drafter) or at a fixed γ.
fn run_reference(
    target: &Decoder,
    drafter: Option<(Box<dyn Proposer + '_>, FixedSpeculation)>,
    req: &GenerationRequest,
    on_output: &mut OnOutput<'_>,
) -> Result<(GenerationOutput, Option<SpeculationStats>), CliError> {
    let mut cache = target.new_cache(1);
    Ok(match drafter {
        None => (generate_plain(target, &mut cache, req, on_output)?, None),
        Some((mut d, spec)) => {
            let (out, st) =
                generate_speculative(target, &mut cache, d.as_mut(), req, spec, on_output)?;
            (out, Some(st))
        }
    })
}
