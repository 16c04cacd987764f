//! The shared domain: ids, pool keys, lifetime rules, records, and the one error type.

pub mod builds;
pub mod checkpoint;
pub mod domains;
pub mod error;
pub mod ids;
pub mod lease;
pub mod logs;
pub mod mask;
pub mod network;
pub mod pool;
pub mod sandbox;
pub mod transforms;

pub use checkpoint::{MAX_CHECKPOINT_NAME, stamped_name, validate_checkpoint_name};
pub use error::{Error, ErrorKind, Result};
pub use lease::LeasePolicy;
pub use pool::{PoolKey, PoolTarget, SizeTier};
pub use sandbox::{
    CheckpointFilter, CheckpointRecord, DEFAULT_NAMESPACE, InventoryChange, InventoryEvent,
    Lifecycle, LostClaim, NodeInfo, NodeLimits, OnTimeout, PauseChange, PauseMode, PausedSince,
    Phase, PoolStatus, SandboxRecord, SandboxStats, TemplateInfo, TemplateUsage, VolumeMount,
    claim_ref, split_claim_ref,
};
