//! Turning a request's token stream into text: incremental UTF-8-safe decoding and text stop
//! strings, with the tail that could still become a stop string held back.

use std::sync::Arc;

use strata_tokenizer::{StreamDecoder, Tokenizer};

/// The text side of one request.
pub struct TextStream {
    tokenizer: Arc<Tokenizer>,
    decoder: StreamDecoder,
    stops: Vec<String>,
    /// Everything decoded so far.
    text: String,
    /// Bytes of `text` already handed to the client.
    emitted: usize,
    /// Set once a stop string is found: the text ends there.
    stopped_at: Option<usize>,
}

impl TextStream {
    /// A stream decoding with `tokenizer` that ends its text before the first of `stops`.
    pub fn new(tokenizer: Arc<Tokenizer>, stops: Vec<String>) -> Self {
        Self {
            tokenizer,
            decoder: StreamDecoder::new(),
            stops,
            text: String::new(),
            emitted: 0,
            stopped_at: None,
        }
    }

    /// The stream writing out the text of the control tokens `shown`, which text normally
    /// leaves out (a tool-call format's markers).
    pub fn showing_controls(mut self, shown: Vec<u32>) -> Self {
        self.decoder = StreamDecoder::showing(shown);
        self
    }

    /// Whether a stop string has been found (later tokens add no text).
    pub fn stopped(&self) -> bool {
        self.stopped_at.is_some()
    }

    /// Adds a token; returns the text that may be shown now.
    pub fn push(&mut self, token: u32) -> String {
        if self.stopped_at.is_some() {
            return String::new();
        }
        let piece = self
            .decoder
            .push(&self.tokenizer, token)
            .unwrap_or_default();
        self.text.push_str(&piece);
        // A stop string can only end in the new text, but may start before it.
        let from = floor_char(&self.text, self.emitted.saturating_sub(self.longest_stop()));
        let found = self
            .stops
            .iter()
            .filter_map(|s| self.text[from..].find(s.as_str()).map(|i| from + i))
            .min();
        if let Some(at) = found {
            self.stopped_at = Some(at);
            return self.take_until(at);
        }
        let hold = self.held_back();
        self.take_until(self.text.len() - hold)
    }

    /// The rest of the text once the request has finished.
    pub fn finish(&mut self) -> String {
        if let Some(at) = self.stopped_at {
            return self.take_until(at);
        }
        self.text.push_str(&self.decoder.finish());
        self.take_until(self.text.len())
    }

    fn longest_stop(&self) -> usize {
        self.stops.iter().map(String::len).max().unwrap_or(0)
    }

    /// Bytes at the end of the text that are a proper prefix of some stop string.
    fn held_back(&self) -> usize {
        let mut hold = 0;
        for s in &self.stops {
            for (i, _) in s.char_indices().skip(1) {
                if i > hold && self.text.ends_with(&s[..i]) {
                    hold = i;
                }
            }
        }
        hold.min(self.text.len() - self.emitted)
    }

    fn take_until(&mut self, end: usize) -> String {
        let end = floor_char(&self.text, end.max(self.emitted));
        let out = self.text[self.emitted..end].to_string();
        self.emitted = end;
        out
    }
}

/// The largest char boundary at or below `i`.
fn floor_char(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// A scheduler stop test for text stop strings: decodes the last tokens of the completion
/// (enough to hold the longest stop string) and looks for any stop string in them.
pub fn stop_string_test(
    tokenizer: Arc<Tokenizer>,
    stops: Vec<String>,
) -> impl FnMut(&[u32]) -> bool + Send {
    let window = stops.iter().map(String::len).max().unwrap_or(0) + 2;
    move |completion: &[u32]| {
        let tail = &completion[completion.len().saturating_sub(window)..];
        let text = tokenizer.decode(tail, false).unwrap_or_default();
        stops.iter().any(|s| text.contains(s.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_char_stays_on_boundaries() {
        let s = "aé";
        assert_eq!(floor_char(s, 2), 1);
        assert_eq!(floor_char(s, 9), 3);
    }
}
