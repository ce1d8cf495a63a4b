//! Upload: each finished snapshot, its index line, `run.json` and the ELF
//! objects it maps, to S3-compatible object storage (docs/upload.md), apart
//! from the driver; and the store's side of the fleet report.

pub mod keys;
pub mod store;
