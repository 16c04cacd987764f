// Generates the node protocol's Rust code (tonic) and the envd data plane's (connectrpc with
// buffa messages). protoc comes from the vendored binary crate so the build works offline on a
// machine without protobuf-compiler; an explicit PROTOC still wins.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()?;
        // SAFETY: build scripts are single-threaded at this point.
        unsafe { std::env::set_var("PROTOC", protoc) };
    }
    println!("cargo:rerun-if-changed=proto/node.proto");
    tonic_prost_build::configure().compile_protos(&["proto/node.proto"], &["proto"])?;

    println!("cargo:rerun-if-changed=proto/envd");
    // google/protobuf/timestamp.proto (imported by filesystem.proto) ships with the vendored protoc.
    let wkt = protoc_bin_vendored::include_path()?;
    connectrpc_build::Config::new()
        .files(&["proto/envd/process.proto", "proto/envd/filesystem.proto"])
        .includes(&[std::path::PathBuf::from("proto/envd"), wkt])
        .include_file("_envd_connectrpc.rs")
        .compile()?;
    Ok(())
}
