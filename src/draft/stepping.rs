//! The batched drafting loop every model-like drafter shares (a draft model or `self:K`, a
//! draft head): a lane per job, one catch-up forward over the context the drafter's cache
//! lacks, then one forward per draft step over every lane still drafting, each lane's token
//! drawn from its row and fed to the next step.
//!
//! Why it exists: the loop's bookkeeping (which lanes step, a shared forward's failure failing
//! every lane in it, the gate ending a lane, timing) is the same for every drafter; what
//! differs (what a lane feeds, how a step is forwarded, where a lane's row is) is a
//! [`Stepper`]'s.

use std::time::Instant;

use super::draw::DrawLane;
use super::siblings::Siblings;
use super::{DraftError, DraftJob, DraftTiming};
use crate::sampling::GateRound;

/// One job's state while a batch drafts.
pub(super) struct Lane<F> {
    pub slot: usize,
    /// Steps this lane drafts (0 once the gate stopped it).
    pub gamma: usize,
    /// What the lane's next forward takes in (its tokens, and a head's features).
    pub feed: F,
    /// The lane's text so far: context and drafts.
    pub history: Vec<u32>,
    pub gate: GateRound,
    pub siblings: Siblings,
}

impl<F> Lane<F> {
    pub fn new(slot: usize, gamma: usize, feed: F, history: Vec<u32>) -> Self {
        Self {
            slot,
            gamma,
            feed,
            history,
            gate: GateRound::default(),
            siblings: Siblings::new(),
        }
    }
}

/// What one kind of model drafter does at each point of the loop.
pub(super) trait Stepper {
    /// What a lane feeds its next forward.
    type Feed;
    /// A draft step's output (every lane's last row, and what a next step reads).
    type Step;

    /// The vocabulary the proposals' token ids are in.
    fn vocab(&self) -> usize;

    /// Drafts `job` without stepping where this drafter does (a head's prompt lookup match);
    /// `true` when it did.
    fn drafted_without_steps(&mut self, _job: &mut DraftJob) -> bool {
        false
    }

    /// Sets up `job`'s lane: its slot, what of its context the cache lacks, its γ.
    fn lane(&mut self, job: &DraftJob) -> Result<Lane<Self::Feed>, DraftError>;

    /// Tokens in a feed.
    fn fed_tokens(feed: &Self::Feed) -> usize;

    /// Takes in all but the last token of each lane's feed, asking for no logits.
    fn catch_up(&mut self, lanes: &[&Lane<Self::Feed>]) -> Result<(), String>;

    /// Drops what a catch-up took in from a feed, leaving its last token.
    fn caught_up(&self, feed: &mut Self::Feed);

    /// One draft step's forward over `lanes`.
    fn step(&mut self, lanes: &[&Lane<Self::Feed>]) -> Result<Self::Step, String>;

    /// After the first step's forward, done or failed: `(seq, slot)` of each lane in it.
    fn first_step_taken(&mut self, _lanes: &[(u64, usize)]) {}

    /// Draws the `k`th lane's token from `step`; `None`: the gate ended its round.
    fn draw(
        &mut self,
        step: &Self::Step,
        k: usize,
        job: &mut DraftJob,
        draw: DrawLane,
    ) -> Result<Option<u32>, DraftError>;

    /// Makes `token`, just drawn for the `k`th lane of `step`, the lane's next feed.
    fn feed_drawn(&self, step: &Self::Step, k: usize, feed: &mut Self::Feed, token: u32);

    /// After the batch, with each job's lane (`None`: it failed or drafted without steps); it
    /// may still rewrite a job's proposal (a string-level draft is put in the target's tokens).
    fn finish(&mut self, _jobs: &mut [DraftJob], _lanes: &[Option<Lane<Self::Feed>>]) {}
}

/// Drafts for every job at once; each job's outcome lands in its `result`. A failure of a
/// shared forward fails every job in it; a sampling failure fails only its job.
pub(super) fn draft_in_steps<S: Stepper>(s: &mut S, jobs: &mut [DraftJob]) -> DraftTiming {
    let mut timing = DraftTiming::default();
    let mut lanes = open_lanes(s, jobs);
    catch_up(s, jobs, &mut lanes, &mut timing);
    let start = Instant::now();
    let steps = lanes.iter().flatten().map(|l| l.gamma).max().unwrap_or(0);
    for j in 0..steps {
        if !take_step(s, j, jobs, &mut lanes, &mut timing, start) {
            break;
        }
    }
    timing.step_seconds = start.elapsed().as_secs_f64();
    for (job, lane) in jobs.iter_mut().zip(lanes.iter_mut()) {
        if let (Some(l), Ok(())) = (lane, &job.result) {
            l.siblings.attach(job.tree_nodes, job.out);
        }
    }
    s.finish(jobs, &lanes);
    timing
}

/// A lane per job; a job drafted without steps, or one that cannot draft (no slot: it fails
/// here), gets none.
fn open_lanes<S: Stepper>(s: &mut S, jobs: &mut [DraftJob]) -> Vec<Option<Lane<S::Feed>>> {
    let vocab = s.vocab();
    let mut lanes = Vec::with_capacity(jobs.len());
    for job in jobs.iter_mut() {
        job.out.clear();
        job.out.vocab = vocab;
        job.result = Ok(());
        if s.drafted_without_steps(job) {
            lanes.push(None);
            continue;
        }
        match s.lane(job) {
            Ok(l) => lanes.push(Some(l)),
            Err(e) => {
                job.result = Err(e);
                lanes.push(None);
            }
        }
    }
    lanes
}

/// Context the cache has not seen (a prompt, plain-decoded output) goes in first, all but its
/// last token, so the draft steps are uniform and cheap, and the cost model sees catch-ups
/// apart. A short feed (at most [`DraftTiming::ROUTINE_CATCH_UP`] tokens before its last: a
/// round's own) goes whole into the first step instead, which saves a forward.
fn catch_up<S: Stepper>(
    s: &mut S,
    jobs: &mut [DraftJob],
    lanes: &mut [Option<Lane<S::Feed>>],
    timing: &mut DraftTiming,
) {
    let behind: Vec<usize> = (0..lanes.len())
        .filter(|&i| {
            lanes[i]
                .as_ref()
                .is_some_and(|l| S::fed_tokens(&l.feed) > DraftTiming::ROUTINE_CATCH_UP + 1)
        })
        .collect();
    if behind.is_empty() {
        return;
    }
    let start = Instant::now();
    let taking: Vec<&Lane<S::Feed>> = behind
        .iter()
        .map(|&i| lanes[i].as_ref().expect("filtered"))
        .collect();
    timing.catch_up_tokens += taking
        .iter()
        .map(|l| S::fed_tokens(&l.feed) - 1)
        .sum::<usize>();
    let done = s.catch_up(&taking);
    drop(taking);
    for &i in &behind {
        match &done {
            Ok(()) => s.caught_up(&mut lanes[i].as_mut().expect("filtered").feed),
            Err(e) => {
                jobs[i].result = Err(DraftError::Forward(e.clone()));
                lanes[i] = None;
            }
        }
    }
    timing.catch_up_seconds = start.elapsed().as_secs_f64();
}

/// Draft step `j` over every lane still drafting; `false` when none is left (or the shared
/// forward failed).
fn take_step<S: Stepper>(
    s: &mut S,
    j: usize,
    jobs: &mut [DraftJob],
    lanes: &mut [Option<Lane<S::Feed>>],
    timing: &mut DraftTiming,
    start: Instant,
) -> bool {
    let order: Vec<usize> = (0..jobs.len())
        .filter(|&i| lanes[i].as_ref().is_some_and(|l| j < l.gamma))
        .collect();
    if order.is_empty() {
        return false;
    }
    let stepping: Vec<&Lane<S::Feed>> = order
        .iter()
        .map(|&i| lanes[i].as_ref().expect("filtered"))
        .collect();
    if j == 0 {
        timing.first_step_tokens = stepping.iter().map(|l| S::fed_tokens(&l.feed)).sum();
    }
    let step = s.step(&stepping);
    drop(stepping);
    timing.steps += 1;
    if j == 0 {
        timing.first_step_seconds = start.elapsed().as_secs_f64();
        let seqs: Vec<(u64, usize)> = order
            .iter()
            .map(|&i| (jobs[i].seq, lanes[i].as_ref().expect("filtered").slot))
            .collect();
        s.first_step_taken(&seqs);
    }
    let step = match step {
        Ok(step) => step,
        Err(e) => {
            for &i in &order {
                jobs[i].result = Err(DraftError::Forward(e.clone()));
                lanes[i] = None;
            }
            return false;
        }
    };
    for (k, &i) in order.iter().enumerate() {
        let lane = lanes[i].as_mut().expect("filtered");
        let job = &mut jobs[i];
        let draw = DrawLane {
            step: j,
            gate: &mut lane.gate,
            siblings: &mut lane.siblings,
            history: &lane.history,
        };
        match s.draw(&step, k, job, draw) {
            Ok(Some(t)) => {
                job.out.tokens.push(t);
                lane.history.push(t);
                s.feed_drawn(&step, k, &mut lane.feed, t);
            }
            // The gate stopped: no later step drafts for this lane.
            Ok(None) => lane.gamma = j,
            Err(e) => {
                job.result = Err(e);
                lanes[i] = None;
            }
        }
    }
    true
}
