//! Prompt lookup (n-gram) proposals: the tokens that followed the latest earlier occurrence of
//! the history's last n tokens, as vLLM's `ngram` speculator and the prompt-lookup decoding of
//! Saxena (2023) take them. No second model; it pays off where the output repeats its input
//! (summaries, code edits, extraction).

use super::proposer::Proposer;
use crate::{Error, Result};

/// Proposes from the history itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptLookup {
    /// The longest n-gram matched first.
    pub max_ngram: usize,
    /// The shortest n-gram tried when longer ones are not found.
    pub min_ngram: usize,
}

impl Default for PromptLookup {
    fn default() -> Self {
        PromptLookup { max_ngram: 4, min_ngram: 1 }
    }
}

impl PromptLookup {
    /// Checks the n-gram sizes.
    pub fn validate(&self) -> Result<()> {
        if self.min_ngram == 0 || self.min_ngram > self.max_ngram {
            return Err(Error::Invalid(format!(
                "prompt lookup n-gram sizes: min {} and max {} must satisfy 1 <= min <= max",
                self.min_ngram, self.max_ngram
            )));
        }
        Ok(())
    }
}

impl Proposer for PromptLookup {
    fn propose(&mut self, history: &[u32], k: usize) -> Result<Vec<u32>> {
        if k == 0 {
            return Ok(vec![]);
        }
        for n in (self.min_ngram..=self.max_ngram).rev() {
            if history.len() <= n {
                continue;
            }
            let tail = &history[history.len() - n..];
            // The latest earlier occurrence with k tokens after it, else the earliest (the most
            // after it): in a history that repeats with a short period the latest occurrence
            // sits just before the end, with one or two tokens to offer.
            let mut found = None;
            for start in (0..history.len() - n).rev().filter(|&s| &history[s..s + n] == tail) {
                found = Some(start + n);
                if start + n + k <= history.len() {
                    break;
                }
            }
            if let Some(from) = found {
                return Ok(history[from..(from + k).min(history.len())].to_vec());
            }
        }
        Ok(vec![])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_longest_match_is_continued() {
        let mut p = PromptLookup { max_ngram: 3, min_ngram: 1 };
        // "1 2 3 4 5 ... 1 2 3": the 3-gram 1 2 3 was followed by 4 5 6.
        assert_eq!(p.propose(&[1, 2, 3, 4, 5, 6, 9, 1, 2, 3], 2).unwrap(), vec![4, 5]);
        // Only the 1-gram 7 matches; its latest earlier occurrence is followed by 8.
        assert_eq!(p.propose(&[7, 1, 7, 8, 2, 7], 3).unwrap(), vec![8, 2, 7]);
        // Nothing repeats: no proposal; k = 0: none asked.
        assert!(p.propose(&[1, 2, 3], 4).unwrap().is_empty());
        assert!(p.propose(&[1, 1, 1], 0).unwrap().is_empty());
        // A proposal never runs past the history.
        assert_eq!(p.propose(&[5, 6, 5], 4).unwrap(), vec![6, 5]);
        // A period of one: the latest occurrence offers one token, the earliest all four.
        assert_eq!(p.propose(&[9, 9, 9, 9, 9, 9, 9], 4).unwrap(), vec![9, 9, 9, 9]);
        // The latest occurrence that has k tokens after it wins over earlier ones.
        assert_eq!(p.propose(&[1, 2, 3, 1, 4, 5, 6, 1], 3).unwrap(), vec![4, 5, 6]);
        assert!(PromptLookup { max_ngram: 2, min_ngram: 3 }.validate().is_err());
        assert!(PromptLookup { max_ngram: 2, min_ngram: 0 }.validate().is_err());
    }
}
