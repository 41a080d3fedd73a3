//! Prompt lookup rehearsed on the prompt: how often its drafts would have stood had the
//! prompt itself been decoded, by kind of match.
//!
//! Why it exists: a request's acceptance is unknown until it drafts, and drafting to find out
//! costs verification width at a depth where width is dear (a 2-token verification at depth
//! 800 costs 1.4 steps here). The prompt is text of the same request, already in hand: a prompt
//! that never repeats its own n-grams gives little for lookup to copy from, one that repeats
//! itself a lot (code, templates, tables) gives much. Rehearsing lookup on it costs a scan per
//! position, microseconds beside a forward, and the governor starts the request's rates
//! from it (`KindRates::starting_from`).

use super::prompt_lookup::{kind_of_match, PromptLookup};

/// Positions of the prompt rehearsed at most (its last ones: nearest the text to come).
const POSITIONS: usize = 256;
/// Tokens before a rehearsed position searched for its match at most.
const WINDOW: usize = 2048;

/// Lookup's drafts on a prompt, by kind of match (`Proposal::confidence_kind`: 1, 2, 3 for 3
/// or more; 0 unused).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Rehearsal {
    /// Positions where lookup found a match and would have drafted.
    pub tried: [u32; 4],
    /// Those where its first drafted token was the prompt's next token.
    pub stood: [u32; 4],
}

impl PromptLookup {
    /// Lookup rehearsed on `prompt`'s last positions: at each, the match it would have found in
    /// the text before it, and whether its first token was the one that came.
    pub fn rehearse(&self, prompt: &[u32]) -> Rehearsal {
        let mut r = Rehearsal::default();
        for i in prompt.len().saturating_sub(POSITIONS).max(1)..prompt.len() {
            let before = &prompt[i.saturating_sub(WINDOW)..i];
            let (cont, ngram) = self.lookup_with_length(before, 1);
            if let Some(&first) = cont.first() {
                let k = usize::from(kind_of_match(ngram));
                r.tried[k] += 1;
                r.stood[k] += u32::from(first == prompt[i]);
            }
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_that_repeats_itself_rehearses_well_and_one_that_does_not_badly() {
        let lookup = PromptLookup::new(1, 3);
        let repeated: Vec<u32> = (0..40).map(|i| i % 8).collect();
        let r = lookup.rehearse(&repeated);
        assert!(r.tried[3] > 20, "{r:?}");
        assert_eq!(r.stood[3], r.tried[3], "every long match goes on as before");

        // Each token once: nothing to match.
        let fresh: Vec<u32> = (0..40).collect();
        assert_eq!(lookup.rehearse(&fresh), Rehearsal::default());

        // Pairs that recur with other followers: 1-token matches that miss.
        let mixed: Vec<u32> = (0..60)
            .map(|i| if i % 2 == 0 { 7 } else { 100 + i })
            .collect();
        let r = lookup.rehearse(&mixed);
        assert!(r.tried[1] > 20 && r.stood[1] == 0, "{r:?}");
    }

    #[test]
    fn only_the_last_positions_and_a_window_before_them_are_read() {
        let lookup = PromptLookup::new(1, 3);
        let long: Vec<u32> = (0..10_000).map(|i| i % 5).collect();
        let r = lookup.rehearse(&long);
        let tried: u32 = r.tried.iter().sum();
        assert_eq!(tried as usize, POSITIONS);
        assert!(lookup.rehearse(&[]).tried.iter().all(|&t| t == 0));
        assert!(lookup.rehearse(&[3]).tried.iter().all(|&t| t == 0));
    }
}
