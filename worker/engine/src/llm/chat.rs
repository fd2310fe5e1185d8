//! Chat templates: the Jinja template a GGUF file carries
//! (`tokenizer.chat_template`), rendered as its authors wrote it with
//! minijinja (plus Python's string methods, which many templates call).

use minijinja::{Environment, ErrorKind, context};
use serde::Serialize;

use crate::ModelError;

/// Roles a chat message may have.
pub const ROLES: &[&str] = &["system", "user", "assistant", "tool", "developer"];

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool` or `developer`.
    pub role: String,
    /// The text.
    pub content: String,
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

/// Name of the template inside the environment.
const NAME: &str = "chat";

fn raise_exception(msg: String) -> Result<String, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
}

impl ChatTemplate {
    /// Compiles `source`; `bos` and `eos` are the texts templates see as
    /// `bos_token` and `eos_token`.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self, ModelError> {
        let mut env = Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(NAME, source.to_owned())
            .map_err(|e| ModelError::Invalid {
                family: "llm-generation",
                reason: format!("tokenizer.chat_template does not compile: {e}"),
            })?;
        Ok(Self {
            env,
            bos: bos.to_owned(),
            eos: eos.to_owned(),
        })
    }

    /// Renders `messages` with `add_generation_prompt` set, ready for the
    /// assistant's reply.
    pub fn render(&self, messages: &[ChatMessage]) -> Result<String, ModelError> {
        for (i, m) in messages.iter().enumerate() {
            if !ROLES.contains(&m.role.as_str()) {
                return Err(ModelError::BadInput(format!(
                    "message {i} has role {:?}; expected one of {}",
                    m.role,
                    ROLES.join(", ")
                )));
            }
        }
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| ModelError::Invalid {
                family: "llm-generation",
                reason: e.to_string(),
            })?;
        tmpl.render(context! {
            messages => messages,
            add_generation_prompt => true,
            bos_token => self.bos,
            eos_token => self.eos,
        })
        .map_err(|e| ModelError::BadInput(format!("chat template: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMOL: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    fn msg(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }

    #[test]
    fn renders_smollm2_template() -> Result<(), ModelError> {
        let t = ChatTemplate::new(SMOL, "<|im_start|>", "<|im_end|>")?;
        let out = t.render(&[msg("user", "Hi")])?;
        assert_eq!(
            out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let out = t.render(&[msg("system", "Be brief."), msg("user", "Hi")])?;
        assert!(out.starts_with("<|im_start|>system\nBe brief.<|im_end|>\n"));
        Ok(())
    }

    #[test]
    fn unknown_roles_and_raised_errors_are_bad_input() -> Result<(), ModelError> {
        let t = ChatTemplate::new(SMOL, "", "")?;
        let err = t.render(&[msg("wizard", "Hi")]);
        assert!(matches!(err, Err(ModelError::BadInput(m)) if m.contains("wizard")));
        let t = ChatTemplate::new(
            "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}{{ messages[0].content.strip() }}",
            "",
            "",
        )?;
        assert_eq!(t.render(&[msg("user", "  x  ")])?, "x");
        let err = t.render(&[msg("assistant", "x")]);
        assert!(matches!(err, Err(ModelError::BadInput(m)) if m.contains("first must be user")));
        Ok(())
    }
}
