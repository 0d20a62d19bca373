//! The request fields that adjust logits before each draw (`presence_penalty`,
//! `frequency_penalty`, `repetition_penalty`, `logit_bias`, `min_tokens`) and
//! `stop_token_ids`, checked into the engine's form. Each list is bounded: the host applies
//! them to every row it draws.

use strata_kernels::sampling::LogitControls;

use super::api::Common;
use super::error::ApiError;

/// Entries of `logit_bias` at most (vLLM's and llama.cpp's servers take any number; OpenAI
/// takes 300; every entry costs host time at every token).
pub const MAX_LOGIT_BIAS: usize = 1024;
/// Ids of `stop_token_ids` at most (checked after every token).
pub const MAX_STOP_TOKEN_IDS: usize = 64;

/// The controls and stop ids of `c`, for a request of up to `max_tokens` tokens over a
/// vocabulary of `vocab` ids; 400 naming the field that is out of range.
pub fn parse(
    c: &Common,
    max_tokens: usize,
    vocab: usize,
) -> Result<(LogitControls, Vec<u32>), ApiError> {
    let min_tokens = c.min_tokens.unwrap_or(0) as usize;
    if min_tokens > max_tokens {
        return Err(ApiError::invalid(
            "min_tokens",
            format!("min_tokens ({min_tokens}) must not exceed max_tokens ({max_tokens})"),
        ));
    }
    let controls = LogitControls {
        presence_penalty: c.presence_penalty.unwrap_or(0.0),
        frequency_penalty: c.frequency_penalty.unwrap_or(0.0),
        repetition_penalty: c.repetition_penalty.unwrap_or(1.0),
        logit_bias: logit_bias(c.logit_bias.as_ref())?,
        min_tokens,
    };
    controls
        .validate(vocab)
        .map_err(|(field, why)| ApiError::invalid(field, why))?;
    let stop_token_ids = c.stop_token_ids.clone().unwrap_or_default();
    if stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
        return Err(ApiError::invalid(
            "stop_token_ids",
            format!("at most {MAX_STOP_TOKEN_IDS} stop_token_ids"),
        ));
    }
    if let Some(bad) = stop_token_ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid(
            "stop_token_ids",
            format!("stop token id {bad} is outside the vocabulary of {vocab}"),
        ));
    }
    Ok((controls, stop_token_ids))
}

/// `logit_bias` as OpenAI sends it: an object from token ids (decimal strings) to numbers;
/// `null` or `{}` for none. Sorted by id, so the order applied does not depend on the body.
fn logit_bias(v: Option<&serde_json::Value>) -> Result<Vec<(u32, f32)>, ApiError> {
    let bad = |why: String| ApiError::invalid("logit_bias", why);
    let map = match v {
        None | Some(serde_json::Value::Null) => return Ok(Vec::new()),
        Some(serde_json::Value::Object(m)) => m,
        Some(_) => return Err(bad("logit_bias must map token ids to biases".into())),
    };
    if map.len() > MAX_LOGIT_BIAS {
        return Err(bad(format!("at most {MAX_LOGIT_BIAS} logit_bias entries")));
    }
    let mut bias = map
        .iter()
        .map(|(k, b)| {
            let id: u32 = k
                .parse()
                .map_err(|_| bad(format!("logit_bias key {k:?} is not a token id")))?;
            let b = b
                .as_f64()
                .ok_or_else(|| bad(format!("logit_bias of token {id} is not a number")))?;
            Ok((id, b as f32))
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    bias.sort_unstable_by_key(|&(id, _)| id);
    // "07" and "7" name the same id: one entry per id.
    if bias.windows(2).any(|w| w[0].0 == w[1].0) {
        return Err(bad("logit_bias names a token id twice".into()));
    }
    Ok(bias)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn common(v: serde_json::Value) -> Common {
        serde_json::from_value(v).unwrap()
    }

    fn field_of(v: serde_json::Value, max_tokens: usize) -> String {
        parse(&common(v), max_tokens, 100)
            .unwrap_err()
            .param
            .unwrap()
            .into_owned()
    }

    #[test]
    fn fields_reach_the_controls() {
        let c = common(json!({
            "presence_penalty": 0.5, "frequency_penalty": -1, "repetition_penalty": 1.3,
            "logit_bias": {"7": 5, "3": -100}, "min_tokens": 2, "stop_token_ids": [9],
        }));
        let (ctl, stop) = parse(&c, 4, 100).unwrap();
        assert_eq!(ctl.logit_bias, vec![(3, -100.0), (7, 5.0)]);
        assert_eq!(
            (
                ctl.presence_penalty,
                ctl.frequency_penalty,
                ctl.repetition_penalty
            ),
            (0.5, -1.0, 1.3)
        );
        assert_eq!((ctl.min_tokens, stop), (2, vec![9]));
        let (ctl, stop) = parse(&common(json!({"logit_bias": null})), 4, 100).unwrap();
        assert!(ctl.is_neutral() && stop.is_empty());
    }

    #[test]
    fn out_of_range_names_the_field() {
        assert_eq!(
            field_of(json!({"presence_penalty": 2.1}), 4),
            "presence_penalty"
        );
        assert_eq!(
            field_of(json!({"frequency_penalty": -3}), 4),
            "frequency_penalty"
        );
        assert_eq!(
            field_of(json!({"repetition_penalty": 0}), 4),
            "repetition_penalty"
        );
        assert_eq!(field_of(json!({"logit_bias": {"100": 1}}), 4), "logit_bias");
        assert_eq!(
            field_of(json!({"logit_bias": {"1": 100.5}}), 4),
            "logit_bias"
        );
        assert_eq!(field_of(json!({"logit_bias": {"x": 1}}), 4), "logit_bias");
        assert_eq!(
            field_of(json!({"logit_bias": {"7": 1, "07": 2}}), 4),
            "logit_bias"
        );
        assert_eq!(field_of(json!({"logit_bias": [1]}), 4), "logit_bias");
        let many: serde_json::Map<String, serde_json::Value> = (0..=MAX_LOGIT_BIAS)
            .map(|i| (i.to_string(), json!(1)))
            .collect();
        assert_eq!(
            parse(&common(json!({ "logit_bias": many })), 4, 1 << 20)
                .unwrap_err()
                .param
                .as_deref(),
            Some("logit_bias")
        );
        assert_eq!(field_of(json!({"min_tokens": 5}), 4), "min_tokens");
        assert_eq!(
            field_of(json!({"stop_token_ids": [100]}), 4),
            "stop_token_ids"
        );
        let ids: Vec<u32> = (0..=MAX_STOP_TOKEN_IDS as u32).collect();
        assert_eq!(
            field_of(json!({ "stop_token_ids": ids }), 4),
            "stop_token_ids"
        );
    }
}
