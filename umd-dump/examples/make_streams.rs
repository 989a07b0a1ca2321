//! Writes the example streams into `examples/streams/`.
fn main() -> std::io::Result<()> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/streams");
    std::fs::create_dir_all(dir)?;
    for (name, bytes) in umd_dump::examples::all() {
        std::fs::write(format!("{dir}/{name}"), bytes)?;
        println!("wrote {dir}/{name}");
    }
    Ok(())
}
