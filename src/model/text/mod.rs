pub mod chat_template;
pub mod tokenizer;
pub mod vocab_map;
