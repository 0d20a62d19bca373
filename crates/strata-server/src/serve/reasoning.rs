//! `--reasoning-parser`: a chat answer's thinking part, split off into `reasoning_content`
//! (as vLLM and SGLang name it), whole or streamed (`delta.reasoning_content`).
//!
//! One splitter serves both: the whole answer is the stream of its text ending at once,
//! so reassembled deltas equal the unstreamed message. Tool calls are read from the content
//! part only.

use super::tools::hold_at_marker;

/// A model family's thinking markers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasoningParser {
    /// Qwen3: `<think>...</think>` at the start of the answer; an answer without the end
    /// marker is all content (thinking switched off).
    Qwen3,
    /// DeepSeek-R1 style: the template opens `<think>` in the prompt, so the answer is
    /// thinking up to `</think>` (its own `<think>` dropped if it writes one); an answer
    /// without the end marker is all thinking.
    DeepSeekR1,
    /// Gemma-4: `<|channel>thought\n...<channel|>` at the start of the answer; without the
    /// opening marker the answer is all content.
    Gemma4,
}

/// The names `--reasoning-parser` takes.
pub const NAMES: &str = "qwen3, deepseek_r1, gemma4";

impl ReasoningParser {
    /// The parser named `name`.
    pub fn by_name(name: &str) -> Option<Self> {
        match name {
            "qwen3" => Some(Self::Qwen3),
            "deepseek_r1" => Some(Self::DeepSeekR1),
            "gemma4" => Some(Self::Gemma4),
            _ => None,
        }
    }

    fn start(self) -> &'static str {
        match self {
            Self::Qwen3 | Self::DeepSeekR1 => "<think>",
            Self::Gemma4 => "<|channel>thought",
        }
    }

    fn end(self) -> &'static str {
        match self {
            Self::Qwen3 | Self::DeepSeekR1 => "</think>",
            Self::Gemma4 => "<channel|>",
        }
    }

    /// Whether the answer thinks only when it opens with the start marker.
    fn start_required(self) -> bool {
        self != Self::DeepSeekR1
    }

    /// The markers that are control tokens in the family's vocabulary: their text must be
    /// kept in the decoded answer for the split to see them.
    pub fn control_markers(self) -> &'static [&'static str] {
        match self {
            Self::Qwen3 | Self::DeepSeekR1 => &["<think>", "</think>"],
            Self::Gemma4 => &["<|channel>", "<channel|>"],
        }
    }

    /// Splits a whole answer into (thinking, content); thinking is `None` when the answer
    /// has none.
    pub fn split(self, text: &str) -> (Option<String>, String) {
        let mut s = Splitter::new(self);
        let (mut reasoning, mut content) = s.push(text);
        let (r, c) = s.finish();
        reasoning.push_str(&r);
        content.push_str(&c);
        (s.thought.then_some(reasoning), content)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Not yet known whether the answer opens with thinking.
    Start,
    /// Inside the thinking part.
    Thinking,
    /// Past it: content.
    Content,
}

/// Splits an answer's text as it arrives into thinking and content deltas, holding back
/// only text that may be the start of a marker.
#[derive(Clone, Debug)]
pub struct Splitter {
    parser: ReasoningParser,
    state: State,
    held: String,
    /// Whether a thinking part was found (its text may still be empty).
    thought: bool,
    /// The newline after Gemma-4's `thought` label is the label's, not the thinking's.
    skip_newline: bool,
}

impl Splitter {
    /// A splitter at the start of an answer.
    pub fn new(parser: ReasoningParser) -> Self {
        Self {
            parser,
            state: State::Start,
            held: String::new(),
            thought: false,
            skip_newline: false,
        }
    }

    /// The next piece of the answer: the (thinking, content) text it releases.
    pub fn push(&mut self, text: &str) -> (String, String) {
        self.held.push_str(text);
        let (mut reasoning, mut content) = (String::new(), String::new());
        loop {
            match self.state {
                State::Start => {
                    let lead = self.held.len() - self.held.trim_start().len();
                    let rest = &self.held[lead..];
                    let start = self.parser.start();
                    if let Some(after) = rest.strip_prefix(start) {
                        self.held = after.to_string();
                        self.begin_thinking();
                        continue;
                    }
                    if start.starts_with(rest) {
                        return (reasoning, content); // may still become the marker
                    }
                    match self.parser.start_required() {
                        true => self.state = State::Content,
                        false => self.begin_thinking(),
                    }
                }
                State::Thinking => {
                    if self.skip_newline {
                        if self.held.is_empty() {
                            return (reasoning, content);
                        }
                        if let Some(after) = self.held.strip_prefix('\n') {
                            self.held = after.to_string();
                        }
                        self.skip_newline = false;
                    }
                    let end = self.parser.end();
                    let plain = hold_at_marker(&self.held, end);
                    reasoning.extend(self.held.drain(..plain));
                    match self.held.strip_prefix(end) {
                        Some(after) => {
                            self.held = after.to_string();
                            self.state = State::Content;
                        }
                        None => return (reasoning, content),
                    }
                }
                State::Content => {
                    content.push_str(&self.held);
                    self.held.clear();
                    return (reasoning, content);
                }
            }
        }
    }

    fn begin_thinking(&mut self) {
        self.state = State::Thinking;
        self.thought = true;
        // DeepSeek-R1 may still write its own `<think>`, as a leading marker.
        if self.parser == ReasoningParser::DeepSeekR1 {
            if let Some(after) = self.held.trim_start().strip_prefix("<think>") {
                self.held = after.to_string();
            }
        }
        self.skip_newline = self.parser == ReasoningParser::Gemma4;
    }

    /// The end of the answer: what was held back, as thinking or content.
    pub fn finish(&mut self) -> (String, String) {
        let held = std::mem::take(&mut self.held);
        match self.state {
            State::Start if !self.parser.start_required() => {
                self.thought = true;
                let held = held.trim_start();
                (
                    held.strip_prefix("<think>").unwrap_or(held).to_string(),
                    String::new(),
                )
            }
            State::Start | State::Content => (String::new(), held),
            State::Thinking => (held, String::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ReasoningParser::*;

    #[test]
    fn each_family_splits_its_answers() {
        let cases = [
            (
                Qwen3,
                "<think>\nadd them\n</think>\n\n4",
                Some("\nadd them\n"),
                "\n\n4",
            ),
            (Qwen3, "just 4", None, "just 4"),
            (Qwen3, "<think>cut off", Some("cut off"), ""),
            (Qwen3, "4 <think>x</think>", None, "4 <think>x</think>"),
            (DeepSeekR1, "add them</think>4", Some("add them"), "4"),
            (
                DeepSeekR1,
                "<think>add them</think>4",
                Some("add them"),
                "4",
            ),
            (DeepSeekR1, "no end marker", Some("no end marker"), ""),
            (
                Gemma4,
                "<|channel>thought\nadd them<channel|>4",
                Some("add them"),
                "4",
            ),
            (Gemma4, "4", None, "4"),
            (Gemma4, "<|channel>thought\n<channel|>4", Some(""), "4"),
            (Gemma4, "<|chan", None, "<|chan"),
        ];
        for (p, text, reasoning, content) in cases {
            let want = (reasoning.map(String::from), content.to_string());
            assert_eq!(p.split(text), want, "{p:?} {text:?}");
        }
    }

    /// Streamed in pieces of every size, the deltas add up to the whole answer's split.
    #[test]
    fn streamed_pieces_add_up_to_the_whole_split() {
        let texts = [
            (Qwen3, "<think>\nadd them\n</think>\n\n4 and </thin"),
            (Qwen3, "  plain <think> text"),
            (DeepSeekR1, "<think>a</think>b</think>c"),
            (DeepSeekR1, "thinking only"),
            (Gemma4, "<|channel>thought\nx<channel|>y<|channel>z"),
            (Gemma4, "<|channel>thought"),
        ];
        for (p, text) in texts {
            let whole = p.split(text);
            let chars: Vec<char> = text.chars().collect();
            for size in 1..=chars.len() {
                let mut s = Splitter::new(p);
                let (mut r, mut c) = (String::new(), String::new());
                for piece in chars.chunks(size) {
                    let (dr, dc) = s.push(&piece.iter().collect::<String>());
                    r += &dr;
                    c += &dc;
                }
                let (dr, dc) = s.finish();
                r += &dr;
                c += &dc;
                let got = (s.thought.then_some(r), c);
                assert_eq!(got, whole, "{p:?} {text:?} in pieces of {size}");
            }
        }
    }

    #[test]
    fn names() {
        assert_eq!(ReasoningParser::by_name("qwen3"), Some(Qwen3));
        assert_eq!(ReasoningParser::by_name("deepseek_r1"), Some(DeepSeekR1));
        assert_eq!(ReasoningParser::by_name("gemma4"), Some(Gemma4));
        assert_eq!(ReasoningParser::by_name("r1"), None);
    }
}
