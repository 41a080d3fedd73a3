pub mod chat_template;
pub mod harmony;
pub mod tokenizer;
pub mod vocab_map;
