//! Stop strings over streamed text.
//!
//! Why it exists: a stop string can arrive split over several tokens ("\n\n" as "\n" + "\n", or
//! "END" as "E" + "ND"), and a streaming server must never send text that a later token turns
//! into the start of a stop string. The matcher therefore holds back the longest tail of the
//! text that could still begin a stop string and releases it once it cannot. Pure string logic,
//! no tokens.

/// Finds stop strings in text that arrives in pieces.
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not yet released: it could still be the start of a stop string.
    held: String,
}

impl StopMatcher {
    /// Empty stop strings are ignored (requests with them are refused earlier).
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// Adds `delta` and appends to `out` the text that can no longer be part of a stop string.
    /// Returns `true` when a stop string is complete: `out` then ends right before its earliest
    /// occurrence and everything from there on is dropped.
    pub fn push(&mut self, delta: &str, out: &mut String) -> bool {
        self.held.push_str(delta);
        let first_match = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(pos) = first_match {
            out.push_str(&self.held[..pos]);
            self.held.clear();
            return true;
        }
        let keep = self.partial_tail_len();
        let cut = self.held.len() - keep;
        out.push_str(&self.held[..cut]);
        self.held.drain(..cut);
        false
    }

    /// Releases the held-back text (the output ended for another reason).
    pub fn release(&mut self, out: &mut String) {
        out.push_str(&self.held);
        self.held.clear();
    }

    /// The length of the longest tail of `held` that is a proper prefix of some stop string.
    fn partial_tail_len(&self) -> usize {
        let held = self.held.as_bytes();
        self.stops
            .iter()
            .filter_map(|s| {
                let max = (s.len() - 1).min(held.len());
                (1..=max).rev().find(|&l| {
                    self.held.is_char_boundary(held.len() - l)
                        && s.as_bytes().starts_with(&held[held.len() - l..])
                })
            })
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut out = String::new();
        for p in pieces {
            if m.push(p, &mut out) {
                return (out, true);
            }
        }
        m.release(&mut out);
        (out, false)
    }

    #[test]
    fn stop_inside_one_piece_cuts_before_it() {
        assert_eq!(run(&["END"], &["abcENDdef"]), ("abc".into(), true));
    }

    #[test]
    fn stop_split_over_pieces_is_found_and_never_released() {
        let stops = vec!["END".to_string()];
        let mut m = StopMatcher::new(&stops);
        let mut out = String::new();
        assert!(!m.push("abcE", &mut out));
        assert_eq!(out, "abc", "the E could start END");
        assert!(!m.push("N", &mut out));
        assert_eq!(out, "abc");
        assert!(m.push("Dxyz", &mut out));
        assert_eq!(out, "abc");
    }

    #[test]
    fn false_starts_are_released() {
        assert_eq!(run(&["END"], &["aE", "Nb", "c"]), ("aENbc".into(), false));
        let stops = vec!["END".to_string()];
        let mut m = StopMatcher::new(&stops);
        let mut out = String::new();
        m.push("xEN", &mut out);
        m.push("x", &mut out);
        assert_eq!(out, "xENx");
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        assert_eq!(
            run(&["world", "lo w"], &["hel", "lo world"]),
            ("hel".into(), true)
        );
        assert_eq!(run(&["\n\n", "."], &["a.\n", "\nb"]), ("a".into(), true));
    }

    #[test]
    fn overlapping_prefix_candidates() {
        // "aab": after "xaa" both "a" and "aa" are candidate starts; the longest is held, and the
        // stop found in "xaaab" starts at byte 2, so "xa" is released.
        assert_eq!(run(&["aab"], &["xa", "a", "ab"]), ("xa".into(), true));
        assert_eq!(run(&["aab"], &["xa", "a", "b"]), ("x".into(), true));
        assert_eq!(
            run(&["aab"], &["xa", "a", "a", "c"]),
            ("xaaac".into(), false)
        );
    }

    #[test]
    fn multibyte_text_is_cut_on_char_boundaries() {
        assert_eq!(run(&["é!"], &["café", "!x"]), ("caf".into(), true));
        assert_eq!(run(&["éa"], &["日本é", "b"]), ("日本éb".into(), false));
    }

    #[test]
    fn no_stops_passes_everything() {
        let mut m = StopMatcher::new(&[String::new()]);
        assert!(m.is_empty());
        let mut out = String::new();
        assert!(!m.push("anything", &mut out));
        assert_eq!(out, "anything");
    }
}
