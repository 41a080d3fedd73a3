//! Running requests from tests: plain decoding (the reference every speculative output is
//! compared with), requests through the engine together, the tokio runtime the engine is
//! driven from, and the lock that keeps engine tests from sharing the machine's cores.

use std::sync::{Mutex, MutexGuard};

use tandem::draft::Proposer;
use tandem::engine::{
    generate_plain, generate_speculative, Completion, Engine, EngineRequest, FixedSpeculation,
    Gamma, GenerationOutput, GenerationRequest,
};
use tandem::model::Decoder;
use tandem::sampling::Lenience;

/// The tokio runtime engine tests drive the engine from: two workers, like the machine's cores.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Holds the test binary's tests to one at a time: each starts engines with two compute
/// threads, and two at once on a 2-core machine would only slow each other down.
pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// `req` decoded plainly by `model` alone, in a cache of its own.
pub fn plain_output(model: &Decoder, req: &GenerationRequest) -> GenerationOutput {
    let mut cache = model.new_cache(1);
    generate_plain(model, &mut cache, req, &mut |_| true).unwrap()
}

/// Greedy speculative decoding of `req` with each of `drafters` at each of `gammas` gives
/// plain decoding's tokens; returns the drafts accepted and rejected over every run (so a
/// caller can require both branches of the rule to have been taken).
pub fn speculation_equals_plain<'a>(
    target: &Decoder,
    drafters: &mut dyn FnMut() -> Vec<Box<dyn Proposer + 'a>>,
    req: &GenerationRequest,
    gammas: &[usize],
) -> (usize, usize) {
    let want = plain_output(target, req).tokens;
    let (mut accepted, mut rejected) = (0, 0);
    for &gamma in gammas {
        for mut d in drafters() {
            let mut cache = target.new_cache(1);
            let spec = FixedSpeculation {
                gamma: Gamma::try_from(gamma).unwrap(),
                lenience: Lenience::EXACT,
            };
            let (out, stats) =
                generate_speculative(target, &mut cache, d.as_mut(), req, spec, &mut |_| true)
                    .unwrap();
            assert_eq!(out.tokens, want, "{} γ={gamma}", d.name());
            accepted += stats.accepted_tokens;
            rejected += stats.draft_tokens - stats.accepted_tokens;
        }
    }
    (accepted, rejected)
}

/// Submits `reqs` to `engine` one after another, all in flight together, and collects each
/// (in the order given).
pub fn complete_together(
    rt: &tokio::runtime::Runtime,
    engine: &Engine,
    reqs: Vec<EngineRequest>,
) -> Vec<Completion> {
    rt.block_on(async {
        let mut handles = Vec::new();
        for r in reqs {
            let stream = engine.submit(r).await.unwrap();
            handles.push(tokio::spawn(stream.collect()));
        }
        let mut out = Vec::new();
        for h in handles {
            out.push(h.await.unwrap().unwrap());
        }
        out
    })
}
