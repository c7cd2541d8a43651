//! Prints this thread's mount table as `mountinfo` parses it.
//!
//! ```sh
//! cargo run -p tak-os-mountinfo --example mounts            # all mounts
//! cargo run -p tak-os-mountinfo --example mounts -- /var    # the mount containing /var, and below it
//! ```
#![allow(
    clippy::print_stdout,
    reason = "printing the table is the example's job"
)]

use std::path::Path;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let bytes = tak_os_mountinfo::read_self()?;
    let table = tak_os_mountinfo::MountTable::parse(&bytes)?;
    let below = std::env::args_os().nth(1);
    println!(
        "{:>5} {:>5} {:>7}  {:<40} {:<12} {:<20} {:<16} PROPAGATION",
        "ID", "PARENT", "DEVICE", "MOUNT POINT", "TYPE", "SOURCE", "ROOT"
    );
    let mounts: Vec<_> = match &below {
        Some(path) => {
            let path = Path::new(path);
            table
                .containing(path)
                .into_iter()
                .chain(table.mounts_at_or_below(path))
                .collect()
        }
        None => table.iter().collect(),
    };
    for mount in mounts {
        let propagation = match (mount.shared(), mount.master()) {
            (Some(peer), _) => format!("shared:{peer}"),
            (None, Some(master)) => format!("slave:{master}"),
            (None, None) => "private".to_owned(),
        };
        println!(
            "{:>5} {:>5} {:>7}  {:<40} {:<12} {:<20} {:<16} {}{}",
            mount.mount_id(),
            mount.parent_id(),
            format!("{}:{}", mount.major(), mount.minor()),
            mount.mount_point().display(),
            mount.fs_type().to_string_lossy(),
            mount.source().to_string_lossy(),
            mount.root().display(),
            propagation,
            if mount.is_read_only() { " ro" } else { "" },
        );
    }
    println!("{} mounts", table.len());
    Ok(())
}
