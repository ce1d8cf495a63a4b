//! Upload: each finished snapshot, its index line, `run.json`, the ELF
//! objects it maps and the JIT files kept for it, to S3-compatible object
//! storage (docs/upload.md), apart
//! from the driver; and the store's side of the fleet report.

pub mod jit;
pub mod journal;
pub mod keys;
pub mod run_state;
pub mod send;
pub mod store;
pub mod uploader;

use std::time::Duration;

/// How long the end of a run waits for pending uploads unless told
/// (`--upload-wait`).
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);

/// A run's upload settings (`--upload*`, or a config file's `[upload]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadPlan {
    pub url: String,
    /// The host's name in keys (`--upload-host`, default the kernel's).
    pub host: String,
    /// `--upload-delete`.
    pub delete: bool,
    /// `--upload-wait`.
    pub wait: Duration,
}
