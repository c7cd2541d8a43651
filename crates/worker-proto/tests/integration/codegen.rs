//! `src/generated/` must hold exactly what `proto/worker.proto` compiles to.
//!
//! With `WORKER_PROTO_REGENERATE=1` the test rewrites the checked-in files instead.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const HOW_TO_REGENERATE: &str =
    "WORKER_PROTO_REGENERATE=1 cargo nextest run -p tak-os-worker-proto codegen";

/// Fields that carry file data are `bytes::Bytes`, so a decoded 1 MiB read or write shares
/// the received buffer instead of copying it.
const BYTES_FIELDS: [&str; 2] = [
    ".takos.worker.v1.ReadReply.data",
    ".takos.worker.v1.WriteRequest.data",
];

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn generated_dir() -> PathBuf {
    manifest_dir().join("src/generated")
}

fn compile() -> BTreeMap<String, Vec<u8>> {
    let fds = protox::compile(["worker.proto"], [manifest_dir().join("proto")])
        .unwrap_or_else(|err| panic!("proto/worker.proto does not compile: {err:?}"));
    let out = tempfile::tempdir().expect("temp dir");
    prost_build::Config::new()
        .out_dir(out.path())
        .bytes(BYTES_FIELDS)
        .compile_fds(fds)
        .expect("prost code generation");
    rust_files(out.path())
}

fn rust_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return BTreeMap::new();
    };
    entries
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "rs"))
        .map(|path| {
            let name = path
                .file_name()
                .expect("file name")
                .to_string_lossy()
                .into_owned();
            let contents = std::fs::read(&path).expect("read generated file");
            (name, contents)
        })
        .collect()
}

#[test]
fn codegen_generated_code_is_up_to_date() {
    let fresh = compile();
    assert_eq!(
        fresh.keys().map(String::as_str).collect::<Vec<_>>(),
        ["takos.worker.v1.rs"],
        "one package, one generated file"
    );
    let dir = generated_dir();

    if std::env::var("WORKER_PROTO_REGENERATE").as_deref() == Ok("1") {
        std::fs::create_dir_all(&dir).expect("create src/generated");
        for stale in rust_files(&dir)
            .keys()
            .filter(|name| !fresh.contains_key(*name))
        {
            std::fs::remove_file(dir.join(stale)).expect("remove stale file");
        }
        for (name, contents) in &fresh {
            std::fs::write(dir.join(name), contents).expect("write generated file");
        }
        return;
    }

    let current = rust_files(&dir);
    let mut stale: Vec<String> = fresh
        .iter()
        .filter(|(name, contents)| current.get(*name) != Some(*contents))
        .map(|(name, _)| name.clone())
        .collect();
    stale.extend(
        current
            .keys()
            .filter(|name| !fresh.contains_key(*name))
            .cloned(),
    );
    assert!(
        stale.is_empty(),
        "src/generated/ is out of date with proto/worker.proto ({}); run\n  {HOW_TO_REGENERATE}\n\
         and commit the result",
        stale.join(", ")
    );
}
