//! Grammars over a byte-level vocabulary (ids 0..256 are the bytes, 256 ends the text):
//! walking each mask must spell exactly what the grammar allows.

use strata_structured::{Grammars, Spec, Vocab, MAX_CACHED_GRAMMARS};

const EOS: u32 = 256;

fn grammars() -> Grammars {
    let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    words.push(b"</s>".to_vec());
    let special = (0..=256).map(|id| id == EOS).collect();
    Grammars::new(Vocab::new(words, special, EOS), |text: &[u8]| {
        text.iter().map(|&b| b as u32).collect()
    })
    .unwrap()
}

/// Generates by always taking the allowed id that `prefer` ranks first; the text and
/// whether the constraint ended it.
fn walk(g: &Grammars, spec: &Spec, prefer: impl Fn(u32) -> i64) -> (String, bool) {
    let mut c = g.constraint(spec).unwrap();
    let mut out = Vec::new();
    for _ in 0..200 {
        let mut logits = vec![0.0f32; 257];
        c.0.mask(&mut logits).unwrap();
        let id = (0..257u32)
            .filter(|&i| logits[i as usize] == 0.0)
            .max_by_key(|&i| prefer(i))
            .unwrap();
        if id == EOS {
            return (String::from_utf8(out).unwrap(), false);
        }
        out.push(id as u8);
        if c.0.commit(id).unwrap() {
            return (String::from_utf8(out).unwrap(), true);
        }
    }
    panic!(
        "no end after 200 tokens: {:?}",
        String::from_utf8_lossy(&out)
    );
}

#[test]
fn choices_regexes_and_schemas_spell_only_what_they_allow() {
    let g = grammars();
    let choice = Spec::Choice(vec!["yes".into(), "no \"quoted\"".into()]);
    // Preferring low bytes picks "no ..." (n < y); high bytes, "yes".
    assert_eq!(walk(&g, &choice, |i| -(i as i64)).0, "no \"quoted\"");
    assert_eq!(walk(&g, &choice, |i| i as i64 % 256).0, "yes");

    let regex = Spec::Regex("[0-9]{3}-[a-c]+".into());
    let (text, _) = walk(&g, &regex, |i| if i == EOS { 1000 } else { i as i64 % 256 });
    assert_eq!(text, "999-c");

    let schema = Spec::JsonSchema(serde_json::json!({
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 5}},
        "required": ["n"], "additionalProperties": false
    }));
    // Ending as soon as allowed gives the shortest valid object, compactly spaced.
    let (text, _) = walk(&g, &schema, |i| if i == EOS { 1000 } else { -(i as i64) });
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v, serde_json::json!({"n": 0}));
    assert_eq!(text, "{\"n\": 0}");
}

#[test]
fn bad_grammars_give_llguidance_s_message_and_the_cache_is_bounded() {
    let g = grammars();
    let e = g.constraint(&Spec::Regex("[a-".into())).err().unwrap();
    assert!(e.contains("regex"), "{e}");
    let e = g.constraint(&Spec::Lark("start: (".into())).err().unwrap();
    assert!(!e.is_empty());
    for n in 0..MAX_CACHED_GRAMMARS + 6 {
        g.constraint(&Spec::Regex(format!("a{{{n}}}"))).unwrap();
    }
    assert_eq!(g.cached(), MAX_CACHED_GRAMMARS);
}

/// A model may have more output rows than its tokenizer has ids (vocabularies padded to a
/// multiple, as Qwen's are): the rows past the tokenizer's ids are masked, never read from
/// the grammar's bit set (which is only the tokenizer's size).
#[test]
fn rows_past_the_tokenizer_are_masked() {
    let g = grammars();
    let mut c = g.constraint(&Spec::Regex("[a-z]+".into())).unwrap();
    let mut logits = vec![0.0f32; 512];
    c.0.mask(&mut logits).unwrap();
    assert!(logits[257..].iter().all(|&l| l == f32::NEG_INFINITY));
    assert_eq!(logits[b'q' as usize], 0.0);
}

/// A round's masks (taken ahead through the drafts, then given back) equal those of a
/// copy that takes the drafts one by one, stop after the first draft the grammar refuses
/// or that completes it, and leave the constraint as it was.
#[test]
fn masks_ahead_of_drafts_equal_a_copy_and_leave_the_grammar_as_it_was() {
    let g = grammars();
    let schema = Spec::JsonSchema(serde_json::json!({
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 5}},
        "required": ["n"], "additionalProperties": false
    }));
    let bytes = |s: &str| s.bytes().map(u32::from).collect::<Vec<u32>>();
    let cases: [(Spec, &str, Vec<u32>, usize); 4] = [
        (
            Spec::Choice(vec!["yes".into(), "no".into()]),
            "",
            bytes("yes"),
            3,
        ),
        // Refused at the third draft: masks for the rows up to it, none after.
        (
            Spec::Choice(vec!["yes".into(), "no".into()]),
            "",
            bytes("yxs"),
            2,
        ),
        // The separator wants its space: refused at the second draft.
        (schema.clone(), "{\"n\"", bytes(":3}zz"), 2),
        // The closing brace completes the grammar: no row after it.
        (schema, "{", bytes("\"n\": 5}"), 7),
    ];
    for (spec, prefix, drafts, want_rows) in cases {
        let mut c = g.constraint(&spec).unwrap();
        for t in bytes(prefix) {
            assert!(!c.0.commit(t).unwrap());
        }
        let before = c.0.allowed(257).unwrap();
        let copy = strata_sched::masks_ahead_of(c.0.fork().as_mut(), &drafts, 257).unwrap();
        let ahead = c.0.masks_ahead(&drafts, 257).unwrap();
        assert_eq!(ahead, copy, "{spec:?} {drafts:?}");
        assert_eq!(ahead.len(), want_rows, "{spec:?} {drafts:?}");
        assert_eq!(ahead[0], before);
        // Given back: the same mask now, and the drafts can be taken for real.
        assert_eq!(c.0.allowed(257).unwrap(), before);
        let mut walked = vec![c.0.allowed(257).unwrap()];
        for &t in &drafts[..want_rows - 1] {
            c.0.commit(t).unwrap();
            walked.push(c.0.allowed(257).unwrap());
        }
        assert_eq!(walked, ahead, "{spec:?} {drafts:?}");
    }
}
