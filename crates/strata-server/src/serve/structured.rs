//! Structured outputs on both endpoints: OpenAI's `response_format` and vLLM's `guided_json`,
//! `guided_regex`, `guided_choice` and `guided_grammar` (llguidance's Lark syntax), compiled
//! before the request reaches the engine so that a bad grammar is a 400 naming its field.

use serde_json::Value;
use strata_structured::Spec;

use strata_engine::GenerationRequest;

use super::api::Common;
use super::error::ApiError;
use super::routes::AppState;

/// Choices `guided_choice` may list.
pub const MAX_CHOICES: usize = 1024;

/// The form the request asks its output to take, and the field that asked; `None` for
/// free text. At most one field may ask.
pub fn requested(c: &Common) -> Result<Option<(&'static str, Spec)>, ApiError> {
    let mut found: Vec<(&'static str, Spec)> = Vec::new();
    if let Some(spec) = response_format(c.response_format.as_ref())? {
        found.push(("response_format", spec));
    }
    if let Some(v) = c.guided_json.as_ref().filter(|v| !v.is_null()) {
        let schema = match v {
            // vLLM takes the schema as an object or as its JSON text.
            Value::String(s) => serde_json::from_str(s)
                .map_err(|e| ApiError::invalid("guided_json", format!("not a JSON Schema: {e}")))?,
            other => other.clone(),
        };
        found.push(("guided_json", Spec::JsonSchema(schema)));
    }
    if let Some(r) = &c.guided_regex {
        found.push(("guided_regex", Spec::Regex(r.clone())));
    }
    if let Some(choices) = &c.guided_choice {
        if choices.is_empty() || choices.len() > MAX_CHOICES {
            return Err(ApiError::invalid(
                "guided_choice",
                format!("guided_choice takes 1 to {MAX_CHOICES} strings"),
            ));
        }
        found.push(("guided_choice", Spec::Choice(choices.clone())));
    }
    if let Some(g) = &c.guided_grammar {
        found.push(("guided_grammar", Spec::Lark(g.clone())));
    }
    match found.len() {
        0 | 1 => Ok(found.pop()),
        _ => Err(ApiError::invalid(
            found[1].0,
            format!(
                "{} and {} both constrain the output: send one",
                found[0].0, found[1].0
            ),
        )),
    }
}

/// `response_format`: `text` (or nothing) is free text; `json_object` any JSON object;
/// `json_schema` JSON under `json_schema.schema`.
fn response_format(f: Option<&Value>) -> Result<Option<Spec>, ApiError> {
    let Some(f) = f.filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    let bad = |m: &str| Err(ApiError::invalid("response_format", m.to_string()));
    let Some(obj) = f.as_object() else {
        return bad("response_format must be an object with a type");
    };
    match obj.get("type").and_then(Value::as_str) {
        None if obj.is_empty() => Ok(None),
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Spec::JsonObject)),
        Some("json_schema") => {
            let Some(js) = obj.get("json_schema").and_then(Value::as_object) else {
                return bad("a json_schema response_format needs a json_schema object");
            };
            match js.get("schema") {
                Some(s) if s.is_object() || s.is_boolean() => Ok(Some(Spec::JsonSchema(s.clone()))),
                // OpenAI allows a named format without a schema: any JSON.
                None | Some(Value::Null) => Ok(Some(Spec::JsonObject)),
                Some(_) => bad("json_schema.schema must be a JSON Schema object"),
            }
        }
        Some(other) => bad(&format!(
            "response_format type {other:?} is not one of text, json_object, json_schema"
        )),
        None => bad("response_format needs a type"),
    }
}

/// Compiles what `c` asks for into `gens`' constraints (one compilation, forked for each
/// prompt). Compiling runs off the async workers: a large schema, or the vocabulary's first
/// grammar, takes a while.
pub async fn constrain(
    st: &AppState,
    c: &Common,
    gens: &mut [GenerationRequest],
) -> Result<(), ApiError> {
    let Some((field, spec)) = requested(c)? else {
        return Ok(());
    };
    let constraint = compile(st, field, spec).await?;
    for g in gens.iter_mut() {
        g.constraint = Some(constraint.clone());
    }
    Ok(())
}

/// Compiles `spec` off the async workers; a grammar that does not compile is a 400 naming
/// `field`.
pub async fn compile(
    st: &AppState,
    field: &'static str,
    spec: Spec,
) -> Result<strata_sched::Constraint, ApiError> {
    let engine = st.engine.clone();
    tokio::task::spawn_blocking(move || engine.constraint(&spec))
        .await
        .map_err(|e| ApiError::invalid(field, format!("compiling the grammar failed: {e}")))?
        .map_err(|e| ApiError::invalid(field, e))
}
