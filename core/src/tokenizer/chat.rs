//! Chat templates (Jinja, as shipped in GGUF metadata and tokenizer_config.json), rendered with
//! minijinja plus the Python string methods HF templates use.

use minijinja::{context, Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::error::{InferError, Result};

/// One message as chat templates read it. The tool fields follow OpenAI's shapes, as HF
/// templates expect them: an assistant's `tool_calls` (`{id, type, function: {name,
/// arguments}}`, arguments as a JSON object) and a tool reply's `tool_call_id`. Absent fields
/// are left out, so templates see them as undefined.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            ..Default::default()
        }
    }

    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }
}

/// Whether a template shows the model a request's `tools` (templates without it get them
/// written into the system message instead).
pub fn template_takes_tools(template: &str) -> bool {
    template.contains("tools")
}

/// The largest chat template accepted: real ones are a few KiB (the longest shipped, ~20 KiB).
pub const MAX_TEMPLATE_BYTES: usize = 256 << 10;

/// Template instructions one render may run (minijinja's fuel): real templates take a few
/// hundred per message; this bounds a looping or hostile template to well under a second.
const RENDER_FUEL: u64 = 20_000_000;

/// Rendered text one render may produce, whatever the template does with its input.
pub const MAX_RENDERED_BYTES: usize = 64 << 20;

/// A template that is too large, does not parse, or does not render a short conversation
/// within the fuel budget (a template that loops forever), as a `ChatTemplate` error. A
/// template that raises for the sample conversation is accepted: it may want other roles.
pub(super) fn check(template: &str) -> Result<()> {
    check_size(template)?;
    let mut env = Environment::new();
    env.add_template("chat", template)
        .map_err(|e| InferError::ChatTemplate(format!("{e:#}")))?;
    let sample = [
        ChatMessage::new("system", "You are helpful."),
        ChatMessage::user("Hello"),
        ChatMessage::new("assistant", "Hi!"),
        ChatMessage::user("Bye"),
    ];
    match render(template, &sample, None, None, true, "<s>", "</s>") {
        Err(InferError::ChatTemplate(m)) if m.contains(BUDGET_MARK) => {
            Err(InferError::ChatTemplate(format!(
                "the chat template does not render a four-message conversation within its budget: {m}"
            )))
        }
        _ => Ok(()),
    }
}

/// A template over `MAX_TEMPLATE_BYTES`, as a `ChatTemplate` error.
pub(super) fn check_size(template: &str) -> Result<()> {
    if template.len() > MAX_TEMPLATE_BYTES {
        return Err(InferError::ChatTemplate(format!(
            "the chat template is {} bytes, more than the {MAX_TEMPLATE_BYTES} any real one needs",
            template.len()
        )));
    }
    Ok(())
}

/// Marks the errors of a render that ran out of its budget (fuel or output size).
const BUDGET_MARK: &str = "render budget";

/// Where a render writes: refuses to grow past `MAX_RENDERED_BYTES`.
struct BoundedText<'a>(&'a mut Vec<u8>);

impl std::io::Write for BoundedText<'_> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + b.len() > MAX_RENDERED_BYTES {
            return Err(std::io::Error::other(BUDGET_MARK));
        }
        self.0.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Names the template context sets itself; `chat_template_kwargs` may not set them.
const RESERVED: [&str; 5] = [
    "messages",
    "tools",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
];

/// Renders a chat template as transformers' `apply_chat_template` does: the messages, tools and
/// `add_generation_prompt`, the tokenizer's BOS and EOS text, `raise_exception`, `strftime_now`
/// and Python's string methods, plus extra variables (`chat_template_kwargs`).
pub fn render(
    template: &str,
    messages: &[ChatMessage],
    tools: Option<&serde_json::Value>,
    kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String> {
    if let Some(k) = kwargs.and_then(|k| k.keys().find(|k| RESERVED.contains(&k.as_str()))) {
        return Err(InferError::ChatTemplate(format!(
            "chat_template_kwargs may not set `{k}`: the request sets it"
        )));
    }
    let mut env = Environment::new();
    env.set_fuel(Some(RENDER_FUEL));
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |msg: String| -> std::result::Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        },
    );
    // Llama 3.x templates put today's date in the system prompt, as HF's renderer allows.
    env.add_function("strftime_now", |format: String| {
        strftime(&format, now_utc())
    });
    let err = |e: Error| InferError::ChatTemplate(format!("{e:#}"));
    env.add_template("chat", template).map_err(err)?;
    let tmpl = env.get_template("chat").map_err(err)?;
    // Extra variables first: the template's own (above, refused in kwargs) complete them.
    let extra =
        minijinja::Value::from(minijinja::value::Serde(kwargs.cloned().unwrap_or_default()));
    let ctx = context! {
        messages => minijinja::Value::from(minijinja::value::Serde(messages)),
        tools => tools.map(|t| minijinja::Value::from(minijinja::value::Serde(t))),
        add_generation_prompt => add_generation_prompt,
        bos_token => bos_token,
        eos_token => eos_token,
        ..extra
    };
    let mut out = Vec::new();
    let rendered = tmpl
        .render_captured_to(ctx, BoundedText(&mut out))
        .map(drop);
    match rendered {
        // minijinja writes whole `str`s: the bytes are UTF-8.
        Ok(()) => String::from_utf8(out)
            .map_err(|_| InferError::ChatTemplate("the template rendered invalid UTF-8".into())),
        Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(InferError::ChatTemplate(format!(
            "the chat template ran out of its {BUDGET_MARK} ({RENDER_FUEL} instructions)"
        ))),
        Err(e) if e.kind() == ErrorKind::WriteFailure => Err(InferError::ChatTemplate(format!(
            "the chat template's output passed its {BUDGET_MARK} ({MAX_RENDERED_BYTES} bytes)"
        ))),
        Err(e) => Err(err(e)),
    }
}

/// (year, month 1-12, day, hour, minute, second) in UTC.
type DateTime = (i64, u32, u32, u32, u32, u32);

#[expect(
    clippy::cast_possible_truncation,
    reason = "days of a month, months, hours, minutes and seconds are small"
)]
fn now_utc() -> DateTime {
    let secs = web_time::SystemTime::now()
        .duration_since(web_time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        year,
        month,
        day,
        (rem / 3600) as u32,
        (rem % 3600 / 60) as u32,
        (rem % 60) as u32,
    )
}

/// The strftime subset chat templates use: %Y %y %m %d %e %b %B %H %M %S %%.
fn strftime(format: &str, (y, mo, d, h, mi, s): DateTime) -> std::result::Result<String, Error> {
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
    let month = MONTHS[(mo as usize).clamp(1, 12) - 1];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out += &y.to_string(),
            Some('y') => out += &format!("{:02}", y.rem_euclid(100)),
            Some('m') => out += &format!("{mo:02}"),
            Some('d') => out += &format!("{d:02}"),
            Some('e') => out += &format!("{d:>2}"),
            Some('b') => out += &month[..3],
            Some('B') => out += month,
            Some('H') => out += &format!("{h:02}"),
            Some('M') => out += &format!("{mi:02}"),
            Some('S') => out += &format!("{s:02}"),
            Some('%') => out.push('%'),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "strftime_now: unsupported directive %{}",
                        other.map(String::from).unwrap_or_default()
                    ),
                ))
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_formats_like_python() {
        let t = (2024, 7, 26, 9, 5, 3);
        assert_eq!(strftime("%d %b %Y", t).unwrap(), "26 Jul 2024");
        assert_eq!(
            strftime("%B %e, %y %H:%M:%S %%", t).unwrap(),
            "July 26, 24 09:05:03 %"
        );
        assert!(strftime("%Q", t).is_err());
        let (y, mo, d, ..) = now_utc();
        assert!(y >= 2025 && (1..=12).contains(&mo) && (1..=31).contains(&d));
        let rendered = render("{{ strftime_now('%Y') }}", &[], None, None, false, "", "").unwrap();
        assert_eq!(rendered, y.to_string());
    }

    const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are helpful<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] | trim + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn chatml_renders_with_generation_prompt() {
        let out = render(
            CHATML,
            &[ChatMessage::user(" Hi ")],
            None,
            None,
            true,
            "",
            "",
        )
        .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are helpful<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn tools_render_in_the_order_given_and_with_indent() {
        let tools = serde_json::json!([{"type": "function", "function": {"name": "f"}}]);
        let t =
            "{% if tools %}{{ tools[0] | tojson }}|{{ tools[0] | tojson(indent=2) }}{% endif %}";
        let out = render(t, &[], Some(&tools), None, false, "", "").unwrap();
        assert_eq!(
            out,
            "{\"type\": \"function\", \"function\": {\"name\": \"f\"}}|{\n  \"type\": \"function\",\n  \"function\": {\n    \"name\": \"f\"\n  }\n}"
        );
        assert_eq!(render(t, &[], None, None, false, "", "").unwrap(), "");
    }

    #[test]
    fn raise_exception_and_python_methods_work() {
        let t = "{% if messages[0].role.startswith('x') %}{{ raise_exception('bad role') }}{% endif %}{{ messages[0].content.strip() }}";
        assert_eq!(
            render(t, &[ChatMessage::user(" a ")], None, None, false, "", "").unwrap(),
            "a"
        );
        let bad = [ChatMessage::new("xx", "")];
        let e = render(t, &bad, None, None, false, "", "").unwrap_err();
        assert!(e.to_string().contains("bad role"), "{e}");
    }

    #[test]
    fn chat_template_kwargs_reach_the_template_and_reserved_names_are_refused() {
        // The tail of Qwen3's template: an empty thought when thinking is switched off.
        let t = "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}";
        let on = render(t, &[], None, None, true, "", "").unwrap();
        assert_eq!(on, "<|im_start|>assistant\n");
        let off: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(r#"{"enable_thinking": false}"#).unwrap();
        let out = render(t, &[], None, Some(&off), true, "", "").unwrap();
        assert_eq!(out, "<|im_start|>assistant\n<think>\n\n</think>\n\n");
        let bad: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(r#"{"messages": []}"#).unwrap();
        let e = render(t, &[], None, Some(&bad), true, "", "").unwrap_err();
        assert!(e.to_string().contains("may not set `messages`"), "{e}");
    }
}
