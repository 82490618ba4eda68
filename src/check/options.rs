//! [`CheckOptions`]: what a one-instance `hotsplit check` run does, apart from the run itself
//! (`run.rs`) and the services it starts (`services.rs`), which both read it.

use std::path::PathBuf;
use std::time::Duration;

use hotsplit_devcluster::TlsFiles;

use super::report::Mode;

/// What to run.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// Total duration of the workload phases (modes and presence). Default: 60 s.
    pub duration: Duration,
    /// Seed of the fault schedule and the readers' choices. Default: 1.
    pub seed: u64,
    /// Hot keys per mode. Default: 2.
    pub keys: u32,
    /// Reader sessions per mode. Default: 8.
    pub readers: u32,
    /// The modes to run (`--mode`), each against the services it runs against; the presence
    /// experiment runs only with none named. Default: empty, every mode but `client-cache`
    /// and the presence experiment.
    pub modes: Vec<Mode>,
    /// Copies per hot key. Default: 8.
    pub copies: u32,
    /// Where to write the report, the JSON summary and the histories. Default: none.
    pub out: Option<PathBuf>,
    /// The bearer token the run's service asks for (`[auth] tokens_file` with this token, every
    /// scope) and every request of the run sends. Default: none, a random one.
    pub token: Option<String>,
    /// TLS end to end: the cluster's nodes serve clients, replication and the bus with these
    /// files only, and the service and every connection of the run's own (samples, faults)
    /// speak TLS with them. Default: none, plain TCP.
    pub tls: Option<TlsFiles>,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            duration: Duration::from_secs(60),
            seed: 1,
            keys: 2,
            readers: 8,
            modes: Vec::new(),
            copies: 8,
            out: None,
            token: None,
            tls: None,
        }
    }
}
