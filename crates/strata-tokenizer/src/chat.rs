//! Chat prompts from message lists, with the model's own Jinja template.

use minijinja::{context, Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::TokenizerError;

/// One message of a conversation, as the chat template receives it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Who speaks: `system`, `user`, `assistant` (whatever roles the template knows).
    pub role: String,
    /// The message's text.
    pub content: String,
}

/// Gemma's turn format, used for Gemma models whose files carry no template (the Gemma-3
/// 270M GGUF, for one). A system message is folded into the first user turn as Gemma's own
/// template does.
pub const GEMMA_TEMPLATE: &str = "{{ bos_token }}\
{%- if messages and messages[0].role == 'system' -%}\
{%- set first_user_prefix = messages[0].content + '\\n\\n' -%}{%- set rest = messages[1:] -%}\
{%- else -%}{%- set first_user_prefix = '' -%}{%- set rest = messages -%}{%- endif -%}\
{%- for m in rest -%}\
{%- if (m.role == 'user') != (loop.index0 % 2 == 0) -%}\
{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}\
{%- endif -%}\
{{ '<start_of_turn>' + ('model' if m.role == 'assistant' else m.role) + '\\n' \
+ (first_user_prefix if loop.first else '') + (m.content | trim) + '<end_of_turn>\\n' }}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}";

/// Template instructions one rendering may run: a bound on a hostile template (one that
/// loops a billion times) far above what a real template spends on any conversation that
/// fits in a request body (a test renders 20,000 turns within it).
pub const TEMPLATE_FUEL: u64 = 50_000_000;

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

fn raise_exception(msg: String) -> Result<String, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

impl ChatTemplate {
    /// Compiles `source`; `bos`/`eos` are the texts of those tokens, which templates print.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self, TokenizerError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        // A template comes with the model file: one that loops without end must fail a
        // request, not hold a worker forever.
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", |fmt: String| strftime_today(&fmt));
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| TokenizerError::Template(e.to_string()))?;
        Ok(Self {
            env,
            bos: bos.to_string(),
            eos: eos.to_string(),
        })
    }

    /// Renders the prompt for `messages`, ending with the assistant's turn opener when
    /// `add_generation_prompt`.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| TokenizerError::Template(e.to_string()))?;
        tmpl.render(context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos,
            eos_token => self.eos,
        })
        .map_err(|e| TokenizerError::Template(e.to_string()))
    }
}

/// Today's date (UTC) for templates that print one; supports %Y %m %d %e %b %B.
fn strftime_today(fmt: &str) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let name = MONTHS[(m - 1) as usize];
    fmt.replace("%Y", &y.to_string())
        .replace("%m", &format!("{m:02}"))
        .replace("%d", &format!("{d:02}"))
        .replace("%e", &d.to_string())
        .replace("%B", name)
        .replace("%b", &name[..3])
}

/// Days since 1970-01-01 -> (year, month, day) in the proleptic Gregorian calendar.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_endless_template_fails_and_real_ones_fit_the_fuel() {
        // 10^12 iterations: a template that would never finish.
        let endless = "{% for i in range(10000) %}{% for j in range(10000) %}\
                       {% for k in range(10000) %}{% endfor %}{% endfor %}{% endfor %}";
        let t = ChatTemplate::new(endless, "<s>", "</s>").unwrap();
        let err = t.render(&[], false).unwrap_err().to_string();
        assert!(err.contains("fuel"), "{err}");
        // A long conversation through Gemma's template stays within it.
        let turns: Vec<ChatMessage> = (0..20_000)
            .map(|i| ChatMessage {
                role: if i % 2 == 0 { "user" } else { "assistant" }.into(),
                content: format!("turn {i}"),
            })
            .collect();
        let t = ChatTemplate::new(GEMMA_TEMPLATE, "<bos>", "<eos>").unwrap();
        let text = t.render(&turns, true).unwrap();
        assert!(text.ends_with("<start_of_turn>model\n"));
    }

    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_787), (2026, 11, 30));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn gemma_template_folds_system_and_opens_model_turn() {
        let t = ChatTemplate::new(GEMMA_TEMPLATE, "<bos>", "<eos>").unwrap();
        let msgs = [
            ChatMessage {
                role: "system".into(),
                content: "Be brief.".into(),
            },
            ChatMessage {
                role: "user".into(),
                content: "Hi".into(),
            },
        ];
        assert_eq!(
            t.render(&msgs, true).unwrap(),
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
        );
        let bad = [ChatMessage {
            role: "assistant".into(),
            content: "x".into(),
        }];
        assert!(t
            .render(&bad, true)
            .unwrap_err()
            .to_string()
            .contains("alternate"));
    }
}
