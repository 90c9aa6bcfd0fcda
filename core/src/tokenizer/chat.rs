//! Chat templates (Jinja, as shipped in GGUF metadata and tokenizer_config.json), rendered with
//! minijinja plus the Python string methods HF templates use.

use minijinja::{context, Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::error::{InferError, Result};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn user(content: impl Into<String>) -> Self {
        ChatMessage {
            role: "user".into(),
            content: content.into(),
        }
    }
}

pub(super) fn render(
    template: &str,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String> {
    let mut env = Environment::new();
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |msg: String| -> std::result::Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        },
    );
    let err = |e: Error| InferError::ChatTemplate(format!("{e:#}"));
    env.add_template("chat", template).map_err(err)?;
    let tmpl = env.get_template("chat").map_err(err)?;
    tmpl.render(context! {
        messages => minijinja::Value::from(minijinja::value::Serde(messages)),
        add_generation_prompt => add_generation_prompt,
        bos_token => bos_token,
        eos_token => eos_token,
    })
    .map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are helpful<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] | trim + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn chatml_renders_with_generation_prompt() {
        let out = render(CHATML, &[ChatMessage::user(" Hi ")], true, "", "").unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are helpful<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn raise_exception_and_python_methods_work() {
        let t = "{% if messages[0].role.startswith('x') %}{{ raise_exception('bad role') }}{% endif %}{{ messages[0].content.strip() }}";
        assert_eq!(
            render(t, &[ChatMessage::user(" a ")], false, "", "").unwrap(),
            "a"
        );
        let bad = [ChatMessage {
            role: "xx".into(),
            content: String::new(),
        }];
        let e = render(t, &bad, false, "", "").unwrap_err();
        assert!(e.to_string().contains("bad role"), "{e}");
    }
}
