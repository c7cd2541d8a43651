//! `tak-os-local-csi audit`: a read-only report of the store, for operators.

use std::fmt::Write as _;
use std::path::Path;

use localstore::{Store, StoreOptions};
use serde_json::json;

use crate::config::AuditFormat;

/// Opens the store read-only (no lock, no reconciliation, no writes) and renders a report.
pub fn audit(
    volume_path: &Path,
    node_name: &str,
    format: AuditFormat,
) -> Result<String, localstore::Error> {
    let store = Store::open_read_only(volume_path, StoreOptions::new(node_name))?;
    let records = store.list()?;
    let claims = store.claims()?;
    let found = store.reconciliation();
    Ok(match format {
        AuditFormat::Json => {
            let volumes: Vec<_> = records
                .iter()
                .map(|r| {
                    json!({
                        "volume_id": r.volume_id.to_string(),
                        "name": r.name,
                        "state": r.state.to_string(),
                        "capacity_bytes": r.capacity_bytes,
                        "unpublishable": found.unpublishable.contains(&r.volume_id),
                    })
                })
                .collect();
            let claims: Vec<_> = claims
                .iter()
                .map(|c| json!({"volume_id": c.volume_id.to_string(), "target": c.target}))
                .collect();
            let ids =
                |v: &[localstore::VolumeId]| v.iter().map(ToString::to_string).collect::<Vec<_>>();
            let document = json!({
                "store": store.root(),
                "node": node_name,
                "node_hash": store.node_hash().to_string(),
                "volumes": volumes,
                "claims": claims,
                "orphan_directories": ids(&found.orphan_directories),
                "orphan_claims": ids(&found.orphan_claims),
                "interrupted": found.left_in_place.iter().map(|l| json!({
                    "volume_id": l.volume_id.to_string(),
                    "state": l.state.to_string(),
                    "reason": l.reason,
                })).collect::<Vec<_>>(),
                "unreadable": found.unreadable.iter().map(|u| json!({
                    "path": u.path,
                    "reason": u.reason,
                })).collect::<Vec<_>>(),
                "foreign": ids(&found.foreign),
                "unknown_entries": found.unknown_entries,
            });
            let mut out = serde_json::to_string_pretty(&document).unwrap_or_default();
            out.push('\n');
            out
        }
        AuditFormat::Table => {
            let mut out = String::new();
            let _ = writeln!(
                out,
                "store {} (node {}, hash {})",
                store.root().display(),
                node_name,
                store.node_hash()
            );
            let _ = writeln!(
                out,
                "{:<101}  {:<9}  {:>14}  NAME",
                "VOLUME", "STATE", "CAPACITY"
            );
            for r in &records {
                let mut state = r.state.to_string();
                if found.unpublishable.contains(&r.volume_id) {
                    state.push('!');
                }
                let _ = writeln!(
                    out,
                    "{:<101}  {:<9}  {:>14}  {}",
                    r.volume_id.to_string(),
                    state,
                    r.capacity_bytes,
                    r.name
                );
            }
            for c in &claims {
                let _ = writeln!(out, "claim    {}  -> {}", c.volume_id, c.target.display());
            }
            for id in &found.unpublishable {
                let _ = writeln!(
                    out,
                    "missing  {id}: ready but its data directory is missing (disk not mounted?)"
                );
            }
            for id in &found.orphan_directories {
                let _ = writeln!(out, "orphan   {id}: data directory without a record");
            }
            for id in &found.orphan_claims {
                let _ = writeln!(out, "orphan   {id}: consumer claim without a record");
            }
            for l in &found.left_in_place {
                let _ = writeln!(
                    out,
                    "interrupted {} ({}): {}",
                    l.volume_id, l.state, l.reason
                );
            }
            for u in &found.unreadable {
                let _ = writeln!(out, "unreadable {}: {}", u.path.display(), u.reason);
            }
            for id in &found.foreign {
                let _ = writeln!(out, "foreign  {id}: belongs to another node");
            }
            for p in &found.unknown_entries {
                let _ = writeln!(out, "unknown  {}", p.display());
            }
            let _ = writeln!(out, "{} volumes, {} claims", records.len(), claims.len());
            out
        }
    })
}
