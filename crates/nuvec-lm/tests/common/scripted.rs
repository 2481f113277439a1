//! A proposer that knows the answer: guesses `answer` after `prompt_len` tokens of history, one
//! guess in three wrong and every fifth step none at all, so that verified passes are taken
//! whole, cut short and taken back at every position.

use nuvec_lm::speculative::Proposer;

pub struct Scripted {
    pub answer: Vec<u32>,
    pub prompt_len: usize,
    pub calls: usize,
}

impl Scripted {
    pub fn new(answer: &[u32], prompt_len: usize) -> Self {
        Scripted { answer: answer.to_vec(), prompt_len, calls: 0 }
    }
}

impl Proposer for Scripted {
    fn propose(&mut self, history: &[u32], k: usize) -> nuvec_lm::Result<Vec<u32>> {
        self.calls += 1;
        if self.calls.is_multiple_of(5) {
            return Ok(vec![]);
        }
        let at = history.len() - self.prompt_len;
        let mut guesses: Vec<u32> = self.answer.iter().skip(at).take(k).copied().collect();
        if self.calls % 3 == 1 && !guesses.is_empty() {
            let wrong = self.calls % guesses.len();
            guesses[wrong] = guesses[wrong].wrapping_add(1) % 1000 + 3;
        }
        Ok(guesses)
    }
}
