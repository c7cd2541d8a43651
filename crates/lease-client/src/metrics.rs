//! The names of the metrics this crate records through the [`metrics`] facade.
//!
//! The crate installs no recorder or exporter; a binary that wants them installs one. Labels
//! are bounded: `operation` is an operation name from the `.proto` (`lookup`, `renew_mount`,
//! ...), `outcome` one of a handful of words listed with each metric. No volume IDs, paths or
//! request IDs are ever labels.

/// Counter: logical calls, by `operation` and `outcome` (`ok`, `refused`, `uncertain`,
/// `unavailable`, `unauthorized`, `busy`, `rejected`, `error`).
pub const CALLS: &str = "lease_client_calls_total";
/// Histogram: seconds per logical call, admission and retries included, by `operation`.
pub const CALL_SECONDS: &str = "lease_client_call_duration_seconds";
/// Counter: attempts after the first of a call, by `operation`.
pub const RETRIES: &str = "lease_client_retries_total";
/// Counter: attempts sent to another endpoint than the attempt before, by `operation`.
pub const ENDPOINT_CHANGES: &str = "lease_client_endpoint_changes_total";
/// Counter: calls that ended uncertain, by `operation`.
pub const UNCERTAIN: &str = "lease_client_uncertain_total";
/// Counter: mount lease renewals attempted by the renewal task, by `outcome` (`ok`,
/// `failed`).
pub const RENEWALS: &str = "lease_client_renewals_total";
/// Counter: renewals that failed, by `outcome` (`refused`, `uncertain`, `unavailable`,
/// `unauthorized`, `busy`, `rejected`, `error`).
pub const RENEWAL_FAILURES: &str = "lease_client_renewal_failures_total";
/// Counter: mount leases counted as lost, by `outcome` (`expired`, `revoked`).
pub const LEASES_LOST: &str = "lease_client_leases_lost_total";
/// Counter: releases, by `outcome` (`released`, `deferred`).
pub const RELEASES: &str = "lease_client_releases_total";
