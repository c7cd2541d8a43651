//! The generated code in `src/generated/` must be exactly what the proto compiles to.
//!
//! Run with `CSI_PROTO_REGENERATE=1` to rewrite the files instead of comparing them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The one command that rewrites `src/generated/` from `proto/csi.proto`.
const REGENERATE: &str =
    "CSI_PROTO_REGENERATE=1 cargo test -p csi-proto --test integration codegen";

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Compiles the proto with protox and generates Rust with tonic-prost-build; returns the
/// generated files by name.
fn generate() -> BTreeMap<String, Vec<u8>> {
    let proto_dir = crate_dir().join("proto");
    let descriptors = protox::compile(["csi.proto"], [&proto_dir])
        .unwrap_or_else(|err| panic!("proto/csi.proto does not compile: {err:?}"));
    let out = tempfile::tempdir().expect("temp dir");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .build_transport(true)
        .emit_rerun_if_changed(false)
        .out_dir(out.path())
        .compile_fds(descriptors)
        .expect("code generation");
    read_dir(out.path())
}

fn read_dir(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return files,
        Err(err) => panic!("cannot read {}: {err}", dir.display()),
    };
    for entry in entries {
        let entry = entry.expect("directory entry");
        let name = entry.file_name().into_string().expect("UTF-8 file name");
        if name.ends_with(".rs") {
            files.insert(
                name,
                std::fs::read(entry.path()).expect("read generated file"),
            );
        }
    }
    files
}

#[test]
fn codegen_checked_in_code_matches_the_proto() {
    let generated = generate();
    assert_eq!(
        generated.keys().collect::<Vec<_>>(),
        ["csi.v1.rs"],
        "code generation is expected to produce exactly one file"
    );
    let target: PathBuf = crate_dir().join("src").join("generated");

    if std::env::var_os("CSI_PROTO_REGENERATE").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(&target).expect("create src/generated");
        for name in read_dir(&target).into_keys() {
            if !generated.contains_key(&name) {
                std::fs::remove_file(target.join(&name)).expect("remove stale generated file");
            }
        }
        for (name, contents) in &generated {
            std::fs::write(target.join(name), contents).expect("write generated file");
        }
        return;
    }

    let checked_in = read_dir(&target);
    let mut problems = Vec::new();
    for (name, contents) in &generated {
        match checked_in.get(name) {
            None => problems.push(format!("src/generated/{name} is missing")),
            Some(existing) if existing != contents => {
                let line = first_difference(existing, contents);
                problems.push(format!("src/generated/{name} differs from line {line} on"));
            }
            Some(_) => {}
        }
    }
    for name in checked_in
        .keys()
        .filter(|name| !generated.contains_key(*name))
    {
        problems.push(format!("src/generated/{name} is no longer generated"));
    }
    assert!(
        problems.is_empty(),
        "the checked-in generated code is out of date with proto/csi.proto:\n  {}\n\
         regenerate it with:\n  {REGENERATE}\nthen review and commit the result",
        problems.join("\n  ")
    );
}

/// The 1-based line on which two files first differ.
fn first_difference(old: &[u8], new: &[u8]) -> usize {
    let at = old.iter().zip(new).take_while(|(a, b)| a == b).count();
    1 + old[..at].iter().filter(|&&b| b == b'\n').count()
}
