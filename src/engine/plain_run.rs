//! A plain run: several plain steps of one sequence in one job on the verifier's worker, each
//! step feeding the token the step before sampled, as the reference loop decodes.
//!
//! Why it exists: a round that only decodes one token plainly still crosses threads four
//! times (the scheduler asks the verifier, the verifier its worker, and the answers come back
//! the same way) and each wake of a parked thread costs tens of microseconds on a virtual
//! machine; with the scheduler's own work between forwards, a lone sequence that drafted
//! nothing decoded 6-7% slower in the engine than in the reference loop (SmolLM2, 2 threads).
//! The scheduler asks for a run only where the coming rounds would not draft
//! (`scheduler/plain_run.rs`); where only a prompt-lookup match would make them draft, the
//! run checks each next context for one, with the scheduler's own foresight, and stops there.
//! Each step is an ordinary round ([`run_batch`]): the tokens, their logprobs and the random
//! draws are the ones the rounds one by one would give.

use std::time::Instant;

use super::error::EngineError;
use super::messages::{PlainRun, TargetBatchResult, TargetItem, TargetOutcome};
use super::target_round::{run_batch, TargetState};

/// Runs `items`: a lone item whose `plain_run` asks for more than one step as a run, anything
/// else as one round.
pub(super) fn run_round(
    s: &mut TargetState,
    mut items: Vec<TargetItem>,
) -> Result<TargetBatchResult, EngineError> {
    match items.as_slice() {
        [it] if it.plain_run.steps > 1 && it.tokens.len() == 1 => {
            run_plain(s, items.pop().expect("one item"))
        }
        _ => run_batch(s, items),
    }
}

/// Up to `it.plain_run.steps` rounds of `it`'s sequence, stopping after a failed step or a
/// sampled end-of-sequence token, or before a step prompt lookup would draft in
/// (`until_match`); one outcome per step run.
fn run_plain(s: &mut TargetState, mut it: TargetItem) -> Result<TargetBatchResult, EngineError> {
    let start = Instant::now();
    let PlainRun {
        steps,
        eos_ids,
        until_match,
    } = std::mem::take(&mut it.plain_run);
    let matches = |next: &TargetItem| {
        until_match
            .as_ref()
            .is_some_and(|m| m.stops_at(&next.context))
    };
    let mut result = TargetBatchResult {
        outcomes: Vec::with_capacity(steps),
        seconds: 0.0,
        steps: 0,
        expert_reads: Vec::new(),
    };
    let mut next = Some(it);
    while let Some(item) = next.take() {
        let rest = (result.steps + 1 < steps).then(|| next_step_base(&item));
        let mut round = run_batch(s, vec![item])?;
        if result.steps == 0 {
            result.expert_reads = std::mem::take(&mut round.expert_reads);
        }
        result.steps += 1;
        let outcome = round.outcomes.pop().expect("one item, one outcome");
        if let (Some(base), Ok(o)) = (rest, &outcome) {
            next = o
                .next_token
                .filter(|t| !eos_ids.contains(t))
                .map(|t| next_step(base, t, o))
                .filter(|next| !matches(next));
        }
        result.outcomes.push(outcome);
    }
    result.seconds = start.elapsed().as_secs_f64();
    Ok(result)
}

/// What a plain step's round leaves of its item for the step after: everything but the
/// tokens its round consumes.
fn next_step_base(it: &TargetItem) -> TargetItem {
    TargetItem {
        seq: it.seq,
        slot: it.slot,
        start_pos: it.start_pos,
        tokens: Vec::new(),
        work: it.work,
        proposal: Default::default(),
        parents: Vec::new(),
        params: it.params.clone(),
        lenience: it.lenience,
        context: it.context.clone(),
        prompt_len: it.prompt_len,
        rng: it.rng.clone(),
        logprobs: it.logprobs,
        prompt_logprobs: None,
        grammar: Default::default(),
        plain_run: PlainRun::default(),
    }
}

/// The step after the one that gave `o`: its sampled `token` fed one position on, with the
/// random state the round left.
fn next_step(mut item: TargetItem, token: u32, o: &TargetOutcome) -> TargetItem {
    item.start_pos += 1;
    item.tokens.push(token);
    item.context.push(token);
    item.rng = o.rng.clone();
    item
}
