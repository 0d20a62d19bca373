//! Gemma-4's forcing grammar: a tool's JSON Schema lowered into Lark rules over Gemma's
//! argument syntax (bare keys, strings between `<|"|>` control tokens, JSON scalars, `[...]`
//! and `{...}` with bare commas), so a forced call always parses and its arguments validate.
//!
//! Scalars other than strings are JSON in this syntax too, so their rules are llguidance's
//! `%json` of the scalar's schema (bounds, enums and `multipleOf` included). Strings, arrays
//! and objects are spelled out here. Keywords the lowering does not know (`$ref`,
//! `patternProperties`, `not`, ...) make the schema unforceable: the request is then refused
//! rather than forced into output that may not validate.

use serde_json::Value;

use super::format::lark_literal;

/// Longest `maxItems` spelled out as counts; past it an array only keeps its `minItems`.
const MAX_SPELLED_ITEMS: u64 = 16;

/// Keywords that change what validates and that the lowering does not express.
const UNSUPPORTED: &[&str] = &[
    "$ref",
    "allOf",
    "not",
    "if",
    "patternProperties",
    "dependentRequired",
    "dependentSchemas",
    "uniqueItems",
    "contains",
    "prefixItems",
    "minProperties",
    "maxProperties",
    "format",
];

/// Rules under construction: each object, array and scalar gets a rule of its own.
pub struct Lowering {
    /// The `<|"|>` token's id (a string's marks).
    quote: u32,
    rules: Vec<String>,
}

impl Lowering {
    /// A lowering whose strings are marked with token `quote`.
    pub fn new(quote: u32) -> Self {
        Self {
            quote,
            rules: Vec::new(),
        }
    }

    /// The rules made so far, one a line.
    pub fn rules(&self) -> String {
        self.rules.iter().map(|r| format!("{r}\n")).collect()
    }

    fn rule(&mut self, body: String) -> String {
        let name = format!("g_{}", self.rules.len());
        self.rules.push(format!("{name}: {body}"));
        name
    }

    fn quoted(&self, inner: &str) -> String {
        format!("<[{q}]> {inner} <[{q}]>", q = self.quote)
    }

    /// A Lark expression for the values `schema` allows; `None` when it uses a keyword
    /// the lowering cannot express.
    pub fn value(&mut self, schema: &Value) -> Option<String> {
        let s = match schema {
            Value::Bool(true) => return Some(self.any()),
            Value::Object(s) => s,
            _ => return None,
        };
        if UNSUPPORTED.iter().any(|k| s.contains_key(*k)) {
            return None;
        }
        if let Some(items) = s.get("enum").and_then(Value::as_array) {
            return self.literals(items);
        }
        if let Some(c) = s.get("const") {
            return self.literals(std::slice::from_ref(c));
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(alts) = s.get(key).and_then(Value::as_array) {
                let alts: Option<Vec<String>> = alts.iter().map(|a| self.value(a)).collect();
                return Some(self.rule(alts?.join(" | ")));
            }
        }
        match s.get("type") {
            Some(Value::String(t)) => self.typed(t, schema),
            Some(Value::Array(ts)) => {
                let alts: Option<Vec<String>> =
                    ts.iter().map(|t| self.typed(t.as_str()?, schema)).collect();
                Some(self.rule(alts?.join(" | ")))
            }
            None if s.contains_key("properties") => self.typed("object", schema),
            None if s.contains_key("items") => self.typed("array", schema),
            None => Some(self.any()),
            Some(_) => None,
        }
    }

    fn typed(&mut self, t: &str, schema: &Value) -> Option<String> {
        match t {
            "string" => self.string(schema),
            "integer" | "number" | "boolean" | "null" => {
                let mut scalar = schema.clone();
                scalar["type"] = Value::from(t);
                Some(self.rule(format!("%json {scalar}")))
            }
            "array" => self.array(schema),
            "object" => self.object(schema),
            _ => None,
        }
    }

    /// Enum or const values: strings marked, the rest as their JSON text.
    fn literals(&mut self, items: &[Value]) -> Option<String> {
        let alts: Vec<String> = items
            .iter()
            .map(|v| match v {
                Value::String(s) => Some(self.quoted(&lark_literal(s))),
                Value::Array(_) | Value::Object(_) => None,
                other => Some(lark_literal(&other.to_string())),
            })
            .collect::<Option<_>>()?;
        Some(self.rule(alts.join(" | ")))
    }

    fn string(&mut self, schema: &Value) -> Option<String> {
        let body = match schema.get("pattern").and_then(Value::as_str) {
            Some(p) => {
                let p = p.strip_prefix('^').unwrap_or(p);
                let p = p.strip_suffix('$').unwrap_or(p);
                format!("/{}/", p.replace('/', "\\/"))
            }
            None => {
                let min = schema.get("minLength").and_then(Value::as_u64).unwrap_or(0);
                match schema.get("maxLength").and_then(Value::as_u64) {
                    Some(max) => format!("/(?s:.){{{min},{max}}}/"),
                    None => format!("/(?s:.){{{min},}}/"),
                }
            }
        };
        let inner = self.rule(body);
        Some(self.rule(self.quoted(&inner)))
    }

    fn array(&mut self, schema: &Value) -> Option<String> {
        let item = match schema.get("items") {
            None => self.any(),
            Some(i) => self.value(i)?,
        };
        let min = schema.get("minItems").and_then(Value::as_u64).unwrap_or(0);
        let max = schema.get("maxItems").and_then(Value::as_u64);
        let run = |n: u64| vec![item.as_str(); n as usize].join(" \",\" ");
        let body = match max {
            Some(max) if max <= MAX_SPELLED_ITEMS && min <= max => (min..=max)
                .map(|n| format!("\"[\" {} \"]\"", run(n)))
                .collect::<Vec<_>>()
                .join(" | "),
            _ if min == 0 => format!("\"[\" ({item} (\",\" {item})*)? \"]\""),
            _ => format!("\"[\" {} (\",\" {item})* \"]\"", run(min)),
        };
        Some(self.rule(body))
    }

    /// Properties in the schema's order, the required ones first; each optional one may be
    /// left out. Keys outside `properties` are never written.
    fn object(&mut self, schema: &Value) -> Option<String> {
        let empty = serde_json::Map::new();
        let props = schema
            .get("properties")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if required.iter().any(|r| !props.contains_key(*r)) {
            return None; // a required key with no schema: not forced here
        }
        let mut items = Vec::new();
        let mut optional = Vec::new();
        for (key, sub) in props {
            let key_ok = !key.is_empty()
                && key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !key_ok {
                return None; // a bare key must read back as itself
            }
            let item = format!("{} {}", lark_literal(&format!("{key}:")), self.value(sub)?);
            match required.contains(&key.as_str()) {
                true => items.push(item),
                false => optional.push(item),
            }
        }
        let body = if items.is_empty() && optional.is_empty() {
            "\"{\" \"}\"".to_string()
        } else if !items.is_empty() {
            let tail: String = optional.iter().map(|o| format!(" (\",\" {o})?")).collect();
            format!("\"{{\" {}{tail} \"}}\"", items.join(" \",\" "))
        } else {
            // No required key: any ordered subset of the optional ones, the first present
            // one leading.
            let alts: Vec<String> = (0..optional.len())
                .map(|i| {
                    let tail: String = optional[i + 1..]
                        .iter()
                        .map(|o| format!(" (\",\" {o})?"))
                        .collect();
                    format!("{}{tail}", optional[i])
                })
                .collect();
            format!("\"{{\" ({})? \"}}\"", alts.join(" | "))
        };
        Some(self.rule(body))
    }

    /// Any value in Gemma's syntax (a schema of `{}` or `true`).
    fn any(&mut self) -> String {
        if let Some(r) = self.rules.iter().position(|r| r.starts_with("g_any:")) {
            return self.rules[r][..5].to_string();
        }
        let s = self.quoted("/(?s:.)*/");
        self.rules.push(format!(
            "g_any: {s} | %json {{\"type\": [\"number\", \"boolean\", \"null\"]}} \
             | \"[\" (g_any (\",\" g_any)*)? \"]\" \
             | \"{{\" (/[A-Za-z_][A-Za-z0-9_]*/ \":\" g_any (\",\" /[A-Za-z_][A-Za-z0-9_]*/ \":\" g_any)*)? \"}}\""
        ));
        "g_any".into()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};
    use strata_structured::{Grammars, Spec, Vocab};

    use super::super::format::ToolFormat;
    use super::super::gemma4::Gemma4;
    use super::super::Tool;

    /// Bytes are ids 0..256, the end 256, then Gemma-4's three markers as control tokens.
    const MARKERS: [&str; 3] = ["<|tool_call>", "<tool_call|>", "<|\"|>"];

    fn grammars() -> Grammars {
        let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        words.push(b"<eos>".to_vec());
        words.extend(MARKERS.iter().map(|m| m.as_bytes().to_vec()));
        let special = [vec![false; 256], vec![true; 4]].concat();
        Grammars::new(Vocab::new(words, special, 256), |t: &[u8]| {
            t.iter().map(|&b| u32::from(b)).collect()
        })
        .unwrap()
    }

    fn token_id(m: &str) -> Option<u32> {
        MARKERS.iter().position(|x| *x == m).map(|i| 257 + i as u32)
    }

    /// The text as ids: markers as their control tokens, the rest as bytes.
    fn ids(mut text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        while !text.is_empty() {
            if let Some((i, m)) = MARKERS
                .iter()
                .enumerate()
                .find(|(_, m)| text.starts_with(**m))
            {
                out.push(257 + i as u32);
                text = &text[m.len()..];
            } else {
                let c = text.chars().next().unwrap();
                out.extend(c.to_string().bytes().map(u32::from));
                text = &text[c.len_utf8()..];
            }
        }
        out
    }

    fn text(ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &t in ids {
            match t {
                0..=255 => bytes.push(t as u8),
                257.. => bytes.extend(MARKERS[(t - 257) as usize].as_bytes()),
                _ => {}
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn accepts(g: &Grammars, lark: &str, text: &str) -> bool {
        let mut c = g.constraint(&Spec::Lark(lark.into())).unwrap();
        for t in ids(text) {
            let mut logits = vec![0.0f32; 260];
            if c.0.mask(&mut logits).is_err() || logits[t as usize] == f32::NEG_INFINITY {
                return false;
            }
            c.0.commit(t).unwrap();
        }
        let mut logits = vec![0.0f32; 260];
        c.0.mask(&mut logits).is_ok() && logits[256] == 0.0
    }

    fn weather() -> Value {
        json!({"type": "object", "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 12},
            "unit": {"enum": ["c", "f"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
            "exact": {"type": "boolean"}},
            "required": ["city", "unit", "days"]})
    }

    fn tools() -> Vec<Tool> {
        vec![
            Tool {
                name: "weather".into(),
                parameters: weather(),
            },
            Tool {
                name: "now".into(),
                parameters: json!({"type": "object", "properties": {}}),
            },
        ]
    }

    /// The arguments as the schema wants them (written out, not through a validator).
    fn valid(call: &super::super::ParsedCall) -> bool {
        let a = &call.arguments;
        match call.name.as_str() {
            "now" => a == &json!({}),
            "weather" => {
                let city = a["city"].as_str().map_or(0, |c| c.chars().count());
                let tags = a.get("tags").map_or(Some(0), |t| {
                    let t = t.as_array()?;
                    let short = t
                        .iter()
                        .all(|x| x.as_str().is_some_and(|s| s.chars().count() <= 4));
                    short.then_some(t.len())
                });
                (1..=12).contains(&city)
                    && ["c", "f"].contains(&a["unit"].as_str().unwrap_or(""))
                    && a["days"].as_i64().is_some_and(|d| (1..=7).contains(&d))
                    && tags.is_some_and(|n| n <= 2)
                    && a.get("exact").is_none_or(Value::is_boolean)
                    && a.as_object()
                        .unwrap()
                        .keys()
                        .all(|k| ["city", "unit", "days", "tags", "exact"].contains(&k.as_str()))
            }
            _ => false,
        }
    }

    #[test]
    fn the_grammar_takes_valid_calls_and_refuses_the_rest() {
        let g = grammars();
        let lark = Gemma4.grammar(&tools(), false, &token_id).unwrap();
        let q = "<|\"|>";
        let good = [
            format!("<|tool_call>call:weather{{city:{q}Paris{q},unit:{q}c{q},days:3}}<tool_call|>"),
            format!(
                "<|tool_call>call:weather{{city:{q}Oslo{q},unit:{q}f{q},days:7,tags:[{q}a{q},{q}bb{q}],exact:true}}<tool_call|>"
            ),
            "<|tool_call>call:now{}<tool_call|>".to_string(),
        ];
        for t in &good {
            assert!(accepts(&g, &lark, t), "{t}");
            let (before, calls) = Gemma4.parse(t).unwrap();
            assert!(
                before.is_empty() && calls.len() == 1 && valid(&calls[0]),
                "{t}"
            );
        }
        let bad = [
            // Out of range, not in the enum, a required key missing, an unknown key, an
            // unknown tool, a string too long, a string without its control-token marks.
            format!("<|tool_call>call:weather{{city:{q}Paris{q},unit:{q}c{q},days:9}}<tool_call|>"),
            format!("<|tool_call>call:weather{{city:{q}Paris{q},unit:{q}k{q},days:3}}<tool_call|>"),
            format!("<|tool_call>call:weather{{city:{q}Paris{q},days:3}}<tool_call|>"),
            format!("<|tool_call>call:weather{{city:{q}P{q},unit:{q}c{q},days:3,x:1}}<tool_call|>"),
            "<|tool_call>call:later{}<tool_call|>".to_string(),
            format!("<|tool_call>call:weather{{city:{q}Llanfairpwllgwyngyll{q},unit:{q}c{q},days:3}}<tool_call|>"),
            "<|tool_call>call:weather{city:<|\"Paris\",unit:\"c\",days:3}<tool_call|>".to_string(),
        ];
        for t in &bad {
            assert!(!accepts(&g, &lark, t), "{t}");
        }
        // Parallel calls, back to back.
        let lark = Gemma4.grammar(&tools(), true, &token_id).unwrap();
        assert!(accepts(&g, &lark, &format!("{}{}", good[2], good[0])));
    }

    /// Random walks through the grammar: whatever tokens it lets through, the answer parses
    /// into calls whose arguments follow the schema.
    #[test]
    fn every_walk_through_the_grammar_parses_and_validates() {
        let g = grammars();
        let lark = Gemma4.grammar(&tools(), true, &token_id).unwrap();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut finished = 0;
        for _ in 0..60 {
            let mut c = g.constraint(&Spec::Lark(lark.clone())).unwrap();
            let mut out = Vec::new();
            for _ in 0..400 {
                let mut logits = vec![0.0f32; 260];
                c.0.mask(&mut logits).unwrap();
                let allowed: Vec<u32> =
                    (0..260u32).filter(|&t| logits[t as usize] == 0.0).collect();
                // Ending, markers and structure half the time, so walks finish.
                let rare: Vec<u32> = allowed
                    .iter()
                    .copied()
                    .filter(|&t| t >= 256 || b"{}[],:".contains(&(t as u8)))
                    .collect();
                let pool = if !rare.is_empty() && next() % 2 == 0 {
                    &rare
                } else {
                    &allowed
                };
                let t = pool[(next() % pool.len() as u64) as usize];
                if t == 256 {
                    break;
                }
                out.push(t);
                c.0.commit(t).unwrap();
            }
            let mut logits = vec![0.0f32; 260];
            c.0.mask(&mut logits).unwrap();
            if logits[256] != 0.0 {
                continue; // cut off before the end: nothing to check
            }
            finished += 1;
            let answer = text(&out);
            let (before, calls) = Gemma4.parse(&answer).expect(&answer);
            assert!(before.is_empty(), "{answer}");
            assert!(calls.iter().all(valid), "{answer}: {calls:?}");
        }
        assert!(finished >= 30, "only {finished} walks finished");
    }
}
