//! Gemma-4: `<|tool_call>call:NAME{key:value,...}<tool_call|>`, its own argument syntax
//! (as the model's chat template writes it): bare keys, strings between `<|"|>` marks,
//! JSON numbers, `true`, `false`, `null`, lists `[...]` and objects `{...}`.

use serde_json::{Map, Number, Value};

use super::format::{
    alternatives_with, hold_at_marker, lark_literal, ParsedCall, TokenId, ToolFormat,
};
use super::gemma4_grammar::Lowering;
use super::Tool;

const OPEN: &str = "<|tool_call>call:";
const CLOSE: &str = "<tool_call|>";
const QUOTE: &str = "<|\"|>";

/// The Gemma-4 format.
pub struct Gemma4;

impl ToolFormat for Gemma4 {
    fn name(&self) -> &'static str {
        "gemma4"
    }

    fn detects(&self, template: &str) -> bool {
        template.contains("<|tool_call>")
    }

    fn parse(&self, text: &str) -> Option<(String, Vec<ParsedCall>)> {
        let start = text.find(OPEN)?;
        let mut calls = Vec::new();
        let mut rest = &text[start..];
        while let Some(body) = rest.strip_prefix(OPEN) {
            let brace = body.find('{')?;
            let name = body[..brace].trim().to_string();
            let mut p = Parser { s: &body[brace..] };
            let arguments = p.object()?;
            let after = p.s.strip_prefix(CLOSE).unwrap_or(p.s);
            calls.push(ParsedCall { name, arguments });
            rest = after.trim_start();
        }
        if !rest.is_empty() {
            return None;
        }
        Some((text[..start].to_string(), calls))
    }

    fn plain_prefix(&self, text: &str) -> usize {
        hold_at_marker(text, "<|tool_call>")
    }

    fn grammar(&self, tools: &[Tool], parallel: bool, token_id: &TokenId) -> Option<String> {
        // The markers are control tokens, matched by id; the arguments are lowered from
        // each tool's schema into Gemma's syntax (`gemma4_grammar.rs`).
        let (open, close) = (token_id("<|tool_call>")?, token_id(CLOSE)?);
        let mut lower = Lowering::new(token_id(QUOTE)?);
        let call = |i: usize, t: &Tool| {
            let head = lark_literal(&format!("call:{}", t.name));
            format!("<[{open}]> {head} args_{i} <[{close}]>")
        };
        let g = alternatives_with(tools, parallel, "", call, |t| lower.value(&t.parameters))?;
        Some(g + &lower.rules())
    }

    fn control_markers(&self) -> &'static [&'static str] {
        &["<|tool_call>", "<tool_call|>", QUOTE]
    }

    fn example(&self) -> &'static str {
        "To call a function, write <|tool_call>call:NAME{key:value,...}<tool_call|>, strings between <|\"|> marks."
    }

    fn write_call(&self, name: &str, arguments: &Value) -> String {
        let mut out = format!("{OPEN}{name}{{");
        if let Some(obj) = arguments.as_object() {
            let mut keys: Vec<&String> = obj.keys().collect();
            keys.sort();
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out += &format!("{k}:{}", write_value(&obj[k]));
            }
        }
        out + "}" + CLOSE
    }
}

fn write_value(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{QUOTE}{s}{QUOTE}"),
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(write_value).collect::<Vec<_>>().join(",")
        ),
        Value::Object(o) => {
            let mut keys: Vec<&String> = o.keys().collect();
            keys.sort();
            let items: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{k}:{}", write_value(&o[k])))
                .collect();
            format!("{{{}}}", items.join(","))
        }
        other => other.to_string(),
    }
}

/// A recursive-descent reader of Gemma's argument syntax, into JSON. Depth is bounded by
/// the output's length, which `max_tokens` bounds.
struct Parser<'a> {
    s: &'a str,
}

impl Parser<'_> {
    fn eat(&mut self, t: &str) -> bool {
        match self.s.strip_prefix(t) {
            Some(r) => {
                self.s = r;
                true
            }
            None => false,
        }
    }

    fn object(&mut self) -> Option<Value> {
        if !self.eat("{") {
            return None;
        }
        let mut map = Map::new();
        if self.eat("}") {
            return Some(Value::Object(map));
        }
        loop {
            let key = if self.eat(QUOTE) {
                self.string_body()?
            } else {
                let end = self.s.find(':')?;
                let k = self.s[..end].trim().to_string();
                self.s = &self.s[end..];
                k
            };
            if !self.eat(":") {
                return None;
            }
            let v = self.value()?;
            map.insert(key, v);
            if self.eat("}") {
                return Some(Value::Object(map));
            }
            if !self.eat(",") {
                return None;
            }
        }
    }

    fn string_body(&mut self) -> Option<String> {
        let end = self.s.find(QUOTE)?;
        let text = self.s[..end].to_string();
        self.s = &self.s[end + QUOTE.len()..];
        Some(text)
    }

    fn value(&mut self) -> Option<Value> {
        if self.eat(QUOTE) {
            return self.string_body().map(Value::String);
        }
        if self.s.starts_with('{') {
            return self.object();
        }
        if self.eat("[") {
            let mut items = Vec::new();
            if self.eat("]") {
                return Some(Value::Array(items));
            }
            loop {
                items.push(self.value()?);
                if self.eat("]") {
                    return Some(Value::Array(items));
                }
                if !self.eat(",") {
                    return None;
                }
            }
        }
        for (word, v) in [
            ("true", Value::Bool(true)),
            ("false", Value::Bool(false)),
            ("null", Value::Null),
        ] {
            if self.eat(word) {
                return Some(v);
            }
        }
        let end = self
            .s
            .find(|c: char| !(c.is_ascii_digit() || "+-.eE".contains(c)))
            .unwrap_or(self.s.len());
        let n: Number = serde_json::from_str(&self.s[..end]).ok()?;
        self.s = &self.s[end..];
        Some(Value::Number(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_gemma_calls() {
        // As the Gemma-4 chat template writes a call (tests/fixtures/templates/gemma4.jinja).
        let out = "<|tool_call>call:get_weather{city:<|\"|>Paris, FR<|\"|>,days:3,opts:{metric:true,tags:[<|\"|>a<|\"|>,2.5]}}<tool_call|>";
        let (text, calls) = Gemma4.parse(out).unwrap();
        assert_eq!(text, "");
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(
            calls[0].arguments,
            json!({"city": "Paris, FR", "days": 3, "opts": {"metric": true, "tags": ["a", 2.5]}})
        );
        assert_eq!(Gemma4.write_call("get_weather", &calls[0].arguments), out);
        assert!(Gemma4.parse("<|tool_call>call:f{a:}<tool_call|>").is_none());
        assert!(Gemma4.parse("plain").is_none());
    }
}
