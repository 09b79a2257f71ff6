//! Stop strings matched on decoded text. Text that could still turn into a stop
//! string is withheld, so a client never sees part of a stop string.

use super::TextError;

/// What one `push` releases.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StopResult {
    /// Text safe to show (never includes any part of a stop string).
    pub emit: String,
    /// Index of the stop string that matched; generation should end.
    pub stopped: Option<usize>,
}

/// Streams text through, stopping at the first stop string to complete.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Withheld tail: the longest suffix that is a proper prefix of a stop string.
    held: String,
    stopped: Option<usize>,
}

impl StopMatcher {
    /// Errs on an empty stop string (it would match before any text).
    pub fn new<S: AsRef<str>>(stops: &[S]) -> Result<StopMatcher, TextError> {
        if let Some(i) = stops.iter().position(|s| s.as_ref().is_empty()) {
            return Err(TextError::EmptyStopString(i));
        }
        let stops = stops.iter().map(|s| s.as_ref().to_string()).collect();
        Ok(StopMatcher {
            stops,
            held: String::new(),
            stopped: None,
        })
    }

    /// Adds decoded text. On a match, emits the text before the stop string
    /// and reports which one matched (the one starting earliest, then the first
    /// listed); after that, input is ignored.
    pub fn push(&mut self, text: &str) -> StopResult {
        if self.stopped.is_some() {
            return StopResult {
                emit: String::new(),
                stopped: self.stopped,
            };
        }
        self.held.push_str(text);
        // `held` is shorter than the longest stop string plus `text`, so this
        // search is proportional to the new text, not to all text so far.
        let hit = self
            .stops
            .iter()
            .enumerate()
            .filter_map(|(i, s)| self.held.find(s.as_str()).map(|at| (at, i)))
            .min();
        if let Some((at, i)) = hit {
            self.held.truncate(at);
            self.stopped = Some(i);
            return StopResult {
                emit: std::mem::take(&mut self.held),
                stopped: Some(i),
            };
        }
        let keep = self.partial_suffix_len();
        let tail = self.held.split_off(self.held.len() - keep);
        StopResult {
            emit: std::mem::replace(&mut self.held, tail),
            stopped: None,
        }
    }

    /// Releases withheld text at the end of generation (nothing after a stop).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length of the longest suffix of `held` that begins some stop string.
    fn partial_suffix_len(&self) -> usize {
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let from = self.held.len().saturating_sub(longest.saturating_sub(1));
        (from..self.held.len())
            .filter(|&at| self.held.is_char_boundary(at))
            .find(|&at| self.stops.iter().any(|s| s.starts_with(&self.held[at..])))
            .map_or(0, |at| self.held.len() - at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds pieces; returns everything emitted and the stop index.
    fn run(stops: &[&str], pieces: &[&str]) -> (String, Option<usize>) {
        let mut m = StopMatcher::new(stops).unwrap();
        let mut out = String::new();
        for p in pieces {
            let r = m.push(p);
            out.push_str(&r.emit);
            if r.stopped.is_some() {
                return (out, r.stopped);
            }
        }
        out.push_str(&m.finish());
        (out, None)
    }

    #[test]
    fn stop_string_split_across_pushes() {
        assert_eq!(
            run(&["</s>"], &["Hello <", "/", "s", "> more"]),
            ("Hello ".into(), Some(0))
        );
        let mut m = StopMatcher::new(&["STOP"]).unwrap();
        assert_eq!(m.push("abST").emit, "ab");
        assert_eq!(m.push("O").emit, "");
        assert_eq!(
            m.push("P!"),
            StopResult {
                emit: String::new(),
                stopped: Some(0)
            }
        );
        assert_eq!(
            m.push("later"),
            StopResult {
                emit: String::new(),
                stopped: Some(0)
            }
        );
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn false_start_is_released() {
        let mut m = StopMatcher::new(&["abc"]).unwrap();
        assert_eq!(m.push("xab").emit, "x");
        assert_eq!(m.push("d").emit, "abd");
        assert_eq!(run(&["abc"], &["ab", "ab", "x"]), ("ababx".into(), None));
    }

    #[test]
    fn overlapping_prefixes() {
        // "aab" must still be found after the first "a" fails to continue "aab".
        assert_eq!(
            run(&["aab"], &["a", "a", "a", "b", "z"]),
            ("a".into(), Some(0))
        );
        assert_eq!(run(&["abab"], &["ab", "ab", "ab"]), ("".into(), Some(0)));
        let mut m = StopMatcher::new(&["aab"]).unwrap();
        assert_eq!(m.push("aaa").emit, "a");
    }

    #[test]
    fn multiple_stop_strings() {
        assert_eq!(
            run(&["END", "\n\n"], &["a\n", "\nEND"]),
            ("a".into(), Some(1))
        );
        assert_eq!(
            run(&["END", "\n\n"], &["aE", "ND\n\n"]),
            ("a".into(), Some(0))
        );
        // Several complete in one push: the earliest start wins, then list order.
        assert_eq!(run(&["bc", "abcd"], &["xabcd"]), ("x".into(), Some(1)));
        assert_eq!(run(&["abc", "ab"], &["xabcd"]), ("x".into(), Some(0)));
    }

    #[test]
    fn no_stop_flushes_everything() {
        assert_eq!(
            run(&["<|im_end|>"], &["a", "<|im", "_e"]),
            ("a<|im_e".into(), None)
        );
        assert_eq!(
            run(&[] as &[&str], &["free ", "text"]),
            ("free text".into(), None)
        );
    }

    #[test]
    fn multibyte_text_stays_whole() {
        assert_eq!(
            run(&["日本語"], &["é日", "本", "x日"]),
            ("é日本x日".into(), None)
        );
        assert_eq!(run(&["日本語"], &["é日", "本語"]), ("é".into(), Some(0)));
        let mut m = StopMatcher::new(&["🙂!"]).unwrap();
        assert_eq!(m.push("a🙂").emit, "a");
        assert_eq!(m.finish(), "🙂");
    }

    #[test]
    fn empty_stop_string_is_rejected() {
        let err = StopMatcher::new(&["ok", ""]).unwrap_err();
        assert_eq!(err, TextError::EmptyStopString(1));
        assert!(err.to_string().contains("#1"));
    }
}
