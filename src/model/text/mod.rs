pub mod chat_template;
pub mod tokenizer;
