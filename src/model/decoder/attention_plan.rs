//! Which of a batch's attention work runs whole on one thread and which splits itself.
//!
//! Why it exists: an attention call splits its own work over the threads by key-value head
//! and 512-key segment, which leaves threads idle where the call is small (a windowed layer's
//! token over one window, a short context's few heads) and pays the pool's wake-up once per
//! sequence and layer in a batch. A batch's sequences that each bring a few tokens balance
//! better over the threads as whole units, largest first. A sequence holding more than one
//! thread's share of the batch's work (a deep context beside short ones) splits itself, or it
//! would keep one thread busy while the others wait. Pure: the forward applies the plan.

/// The most new tokens of a sequence that may run whole on one thread beside a batch's other
/// sequences: a verification's, not a prompt chunk's, whose call splits itself.
pub const FEW_TOKENS: usize = 16;

use crate::model::kernels::attention::SEGMENT;

/// One sequence's part of a layer's attention, as the plan sees it.
#[derive(Clone, Copy, Debug)]
pub struct SpanWork {
    /// Tokens in the cache before the new ones.
    pub start: usize,
    /// New tokens.
    pub tokens: usize,
    /// The layer's window, where the span's tokens attend one by one within it.
    pub one_by_one: Option<usize>,
}

/// A unit run whole on one thread: span `span`'s token `token`, or the whole span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unit {
    pub span: usize,
    pub token: Option<usize>,
}

/// The plan: spans that split themselves over the threads, in order, then units shared by
/// the threads, largest first.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub split: Vec<usize>,
    pub units: Vec<Unit>,
}

/// The plan for `spans` over `threads` threads. Work is counted in query-key pairs of one
/// head (the heads are the same for every span).
pub fn plan(spans: &[SpanWork], threads: usize) -> Plan {
    let mut plan = Plan::default();
    let mut units: Vec<(Unit, usize)> = Vec::new();
    // Spans that may run whole: their work, and whether they see past one segment.
    let mut whole: Vec<(usize, usize, bool)> = Vec::new();
    for (k, s) in spans.iter().enumerate() {
        match s.one_by_one {
            Some(w) => units.extend((0..s.tokens).map(|i| {
                let unit = Unit {
                    span: k,
                    token: Some(i),
                };
                (unit, (s.start + i + 1).min(w))
            })),
            None if spans.len() > 1 && s.tokens <= FEW_TOKENS => {
                let seen = s.tokens * s.start + s.tokens * (s.tokens + 1) / 2;
                whole.push((k, seen, s.start + s.tokens > SEGMENT));
            }
            None => plan.split.push(k),
        }
    }
    // Largest first, a deep span past a thread's share of what is left splits itself (a span
    // within one segment has little to split).
    whole.sort_by_key(|&(k, w, _)| (std::cmp::Reverse(w), k));
    let mut total: usize =
        units.iter().map(|u| u.1).sum::<usize>() + whole.iter().map(|w| w.1).sum::<usize>();
    whole.retain(|&(k, w, deep)| {
        let outweighs = deep && w * threads > total;
        if outweighs {
            plan.split.push(k);
            total -= w;
        }
        !outweighs
    });
    plan.split.sort_unstable();
    units.extend(whole.iter().map(|&(k, w, _)| {
        let unit = Unit {
            span: k,
            token: None,
        };
        (unit, w)
    }));
    units.sort_by_key(|&(u, w)| (std::cmp::Reverse(w), u.span, u.token));
    plan.units = units.into_iter().map(|u| u.0).collect();
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(start: usize, tokens: usize) -> SpanWork {
        SpanWork {
            start,
            tokens,
            one_by_one: None,
        }
    }

    fn whole(span: usize) -> Unit {
        Unit { span, token: None }
    }

    #[test]
    fn a_lone_span_and_a_prompt_chunk_split_themselves() {
        assert_eq!(
            plan(&[span(8000, 1)], 2),
            Plan {
                split: vec![0],
                units: vec![]
            }
        );
        let p = plan(&[span(0, 256), span(100, 1), span(120, 1)], 2);
        assert_eq!(p.split, vec![0]);
        assert_eq!(p.units, vec![whole(2), whole(1)]);
    }

    #[test]
    fn spans_of_a_batch_run_whole_largest_first_unless_a_deep_one_outweighs_a_threads_share() {
        let p = plan(&[span(1000, 2), span(3000, 1), span(2000, 1)], 2);
        assert_eq!(p.split, Vec::<usize>::new());
        assert_eq!(p.units, vec![whole(1), whole(0), whole(2)]);
        // A deep context beside short ones splits itself; the rest share the threads.
        let p = plan(
            &[span(100, 1), span(8000, 1), span(200, 2), span(150, 1)],
            2,
        );
        assert_eq!(p.split, vec![1]);
        assert_eq!(p.units, vec![whole(2), whole(3), whole(0)]);
        // Within one segment a span runs whole whatever its share.
        let p = plan(&[span(10, 1), span(500, 2)], 2);
        assert!(p.split.is_empty());
        assert_eq!(p.units, vec![whole(1), whole(0)]);
        // On one thread every span's share is the whole: nothing splits.
        let p = plan(&[span(100, 1), span(8000, 1)], 1);
        assert!(p.split.is_empty() && p.units.len() == 2);
    }

    #[test]
    fn a_windowed_layers_tokens_each_run_alone() {
        let windowed = SpanWork {
            start: 600,
            tokens: 3,
            one_by_one: Some(512),
        };
        let p = plan(&[windowed, span(10, 1)], 2);
        assert!(p.split.is_empty());
        let tokens: Vec<Option<usize>> = p.units[..3].iter().map(|u| u.token).collect();
        assert_eq!(tokens, vec![Some(0), Some(1), Some(2)]);
        assert_eq!(p.units[3], whole(1));
        // Alone, a windowed span's tokens are still units, however few.
        let p = plan(&[windowed], 2);
        assert_eq!(p.units.len(), 3);
    }
}
