//! A small multiplicative hasher for child keys (token ids are not attacker-chosen hash
//! inputs here: a request can only make its own lookups slower, never another's wrong).

use std::hash::{BuildHasherDefault, Hasher};

#[derive(Clone, Copy, Default)]
pub(crate) struct TokenHasher(u64);

const K: u64 = 0x517c_c1b7_2722_0a95;

impl TokenHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(K);
    }
}

impl Hasher for TokenHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(c);
            self.add(u64::from_le_bytes(word));
        }
        for &b in chunks.remainder() {
            self.add(b as u64);
        }
    }

    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }

    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

pub(crate) type BuildTokenHasher = BuildHasherDefault<TokenHasher>;
