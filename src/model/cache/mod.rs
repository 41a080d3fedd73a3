pub mod kv_cache;
pub mod prefix_store;
