//! Integration tests: one binary, a module per feature, real `redis-server` processes.
//!
//! `harness` starts a shared standalone server and a shared 3-master/3-replica cluster once per
//! test binary (killed by PID when the binary exits); a test that pauses or kills a node starts a
//! server or cluster of its own.

mod answer_headers;
mod audit;
mod auth;
mod binary;
mod browser;
mod check;
mod client_cache;
mod client_cache_raw;
mod client_lib;
mod conformance;
mod degraded;
mod deploy;
mod direct_reads;
mod drain;
mod fast_path;
mod feed;
mod feed_partition;
mod fleet;
mod floors;
mod harden;
mod harness;
mod heal;
mod hot_keys;
mod http_api;
mod http_e2e;
mod listener;
mod memory;
mod near_cache;
mod ops;
mod overload;
mod partition;
mod placement;
mod placement_window;
mod pooled_floors;
mod redis_security;
mod redis_store;
mod reload;
mod resize;
mod resp_budgets;
mod resp_clients;
mod resp_cluster;
mod resp_conn;
mod route;
mod scrub;
mod sdk;
mod session;
mod split;
mod spool;
mod startup;
mod status_page;
mod telemetry;
mod tls_pki;
mod tls_probe;
mod upgrade;
mod versions;
mod warm_up;
mod write_floors;
