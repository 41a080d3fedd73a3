//! `tandem serve`: the OpenAI-compatible HTTP API, the admin API and `/metrics` (docs/api.md, "Which endpoints are there?").
//!
//! Why it exists: it is how users reach the engine. The server binds its port before the models
//! load, so `/health` answers 503 while loading and orchestrators can wait on it; every
//! rejection is an OpenAI-style error; a client that goes away cancels its request (its event
//! stream is dropped with the response); SIGTERM turns `/health` to 503 ("draining") so load
//! balancers stop sending work, keeps serving for `server.drain_seconds`, then stops accepting
//! connections and gives in-flight requests a grace period to finish.

pub mod admin;
mod api_keys;
mod app_state;
mod chat_render;
mod completion_body;
pub mod error;
mod ids;
mod lifecycle;
mod listen;
mod loads;
mod logprobs_json;
pub mod openai;
mod page;
mod reasoning_fields;
mod reload;
mod render;
mod request_body;
mod responses;
mod responses_input;
mod responses_output;
mod responses_store;
mod routes;
pub mod schema;
pub mod startup;
mod stream;
mod structured;
mod throughput;
mod tokenize;
mod tool_fields;
mod validation;

pub use app_state::AppState;
pub use error::ServerError;
pub use lifecycle::run;
pub(crate) use request_body::read_body;
pub use routes::router;
