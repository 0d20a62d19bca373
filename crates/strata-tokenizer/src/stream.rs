//! Incremental detokenization for streaming responses.

use crate::{Tokenizer, TokenizerError};

/// Turns a stream of token ids into text chunks that are always valid UTF-8: bytes of a
/// character split across tokens are held back until the character is complete.
#[derive(Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
    /// Control tokens whose text is written out (others decode to nothing).
    shown: Vec<u32>,
}

impl StreamDecoder {
    /// A decoder with nothing pending.
    pub fn new() -> Self {
        Self::default()
    }

    /// A decoder that writes out the text of the control tokens `shown` (a tool-call
    /// format's markers, such as Gemma-4's `<|tool_call>`).
    pub fn showing(shown: Vec<u32>) -> Self {
        Self {
            pending: Vec::new(),
            shown,
        }
    }

    /// Adds one token; returns the text that became complete (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String, TokenizerError> {
        self.pending
            .extend(tok.token_bytes(id, self.shown.contains(&id))?);
        Ok(self.take_valid())
    }

    fn take_valid(&mut self) -> String {
        // Emit everything up to an unfinished character at the end; invalid sequences in
        // the middle are emitted (as U+FFFD) rather than held forever.
        let mut end = 0;
        loop {
            match std::str::from_utf8(&self.pending[end..]) {
                Ok(s) => {
                    end += s.len();
                    break;
                }
                Err(e) => {
                    end += e.valid_up_to();
                    match e.error_len() {
                        Some(bad) => end += bad,
                        None => break,
                    }
                }
            }
        }
        let rest = self.pending.split_off(end);
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending = rest;
        out
    }

    /// Whatever is left at the end of the stream (an unfinished character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}
