//! Chat templates: turning a list of chat messages into the exact prompt text a model was
//! fine-tuned on.
//!
//! Models ship their prompt format as a Jinja2 template (`tokenizer.chat_template` in GGUF,
//! `chat_template` in Hugging Face's `tokenizer_config.json`). Those templates are written for
//! Python's Jinja2 as used by `transformers`, so rendering them faithfully needs more than plain
//! Jinja: the `trim_blocks`/`lstrip_blocks` whitespace settings `transformers` uses, the helper
//! functions it injects (`raise_exception`, `strftime_now`), a Python-flavoured `tojson`, and the
//! Python `str`/`dict` methods templates call (`.strip()`, `.startswith()`, `.items()`, ...).
//! This module provides exactly that on top of minijinja, without further dependencies.
//!
//! `template` compiles a template and renders it over `message`s; `python_methods` holds the
//! Python string and dict methods, `tojson` the Python-flavoured filter, and `strftime` the
//! date formatting behind `strftime_now`.

mod message;
mod python_methods;
mod strftime;
mod template;
mod tojson;

pub use message::ChatMessage;
pub use strftime::strftime;
pub use template::{ChatTemplate, ChatTemplateError, TemplateOptions};
