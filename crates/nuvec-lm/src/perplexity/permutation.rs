//! numpy's legacy permutation (`np.random.seed(s)` then `np.random.permutation(n)`), which
//! mlx_lm.perplexity draws its sample order from: MT19937 seeded as numpy seeds it from an integer,
//! then a Fisher-Yates shuffle whose indices come from numpy's `random_interval` (masked rejection
//! on 32-bit draws). Reproduced so that `nuvec perplexity` reads the same text as mlx-lm for the
//! same `--seed`.

/// The Mersenne Twister MT19937, 32-bit outputs.
struct Mt19937 {
    state: [u32; 624],
    pos: usize,
}

impl Mt19937 {
    /// Seeded from one integer, as numpy's `mt19937_seed` (the reference `init_genrand`).
    fn new(seed: u32) -> Self {
        let mut state = [0u32; 624];
        state[0] = seed;
        for i in 1..624 {
            let prev = state[i - 1];
            state[i] = 1_812_433_253u32.wrapping_mul(prev ^ (prev >> 30)).wrapping_add(i as u32);
        }
        Mt19937 { state, pos: 624 }
    }

    fn next_u32(&mut self) -> u32 {
        if self.pos >= 624 {
            self.twist();
        }
        let mut y = self.state[self.pos];
        self.pos += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    fn twist(&mut self) {
        for i in 0..624 {
            let y = (self.state[i] & 0x8000_0000) | (self.state[(i + 1) % 624] & 0x7fff_ffff);
            let mut next = self.state[(i + 397) % 624] ^ (y >> 1);
            if y & 1 != 0 {
                next ^= 0x9908_b0df;
            }
            self.state[i] = next;
        }
        self.pos = 0;
    }

    /// A uniform integer in `0..=max`, as numpy's `random_interval`: draws masked to the
    /// smallest all-ones mask covering `max`, rejected until one is at most `max`.
    fn interval(&mut self, max: u32) -> u32 {
        if max == 0 {
            return 0;
        }
        let mask = u32::MAX >> max.leading_zeros();
        loop {
            let v = self.next_u32() & mask;
            if v <= max {
                return v;
            }
        }
    }
}

/// `np.random.seed(seed); np.random.permutation(n)`: the indices `0..n` in numpy's order.
pub fn numpy_permutation(seed: u32, n: usize) -> Vec<usize> {
    let mut rng = Mt19937::new(seed);
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        // numpy draws 64-bit values past 2^32 - 1; no dataset here has that many records.
        let j = rng.interval(i as u32) as usize;
        order.swap(i, j);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::{numpy_permutation, Mt19937};

    #[test]
    fn the_generator_is_the_reference_mt19937() {
        // The reference implementation's outputs for init_genrand(5489) (C++'s std::mt19937
        // default seed; its 10,000th output is 4123659995 by the standard).
        let mut rng = Mt19937::new(5489);
        assert_eq!(rng.next_u32(), 3_499_211_612);
        let mut last = 0;
        for _ in 1..10_000 {
            last = rng.next_u32();
        }
        assert_eq!(last, 4_123_659_995);
    }

    #[test]
    fn a_permutation_holds_every_index_once() {
        let mut p = numpy_permutation(123, 1000);
        p.sort_unstable();
        assert_eq!(p, (0..1000).collect::<Vec<_>>());
        assert_eq!(numpy_permutation(7, 0), Vec::<usize>::new());
        assert_eq!(numpy_permutation(7, 1), vec![0]);
    }
}
