//! `refgpu-sim`: the reference GPU co-simulation server (see the crate
//! docs and `platform-linux/README.md`).

use std::process::ExitCode;

fn main() -> ExitCode {
    let opts = match refgpu_sim::parse_args(std::env::args().skip(1)) {
        Ok(o) => o,
        // --help and --version (exit code 0) and every parse error (2),
        // printed by clap with the usage.
        Err(refgpu_sim::ArgError::Cli(e)) => {
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
        Err(e) => {
            eprintln!("refgpu-sim: {e}\n\n{}", refgpu_sim::usage());
            return ExitCode::from(2);
        }
    };
    if opts.shared_ram.is_some() {
        return serve(refgpu_sim::SharedRamServer::new(opts), |s| s.run());
    }
    serve(refgpu_sim::Server::new(opts), |s| s.run())
}

/// Runs a server that started, or reports why it did not.
fn serve<S>(
    server: Result<S, refgpu_sim::ServerError>,
    run: impl FnOnce(&mut S) -> Result<(), refgpu_sim::ServerError>,
) -> ExitCode {
    let mut server = match server {
        Ok(s) => s,
        Err(e) => {
            eprintln!("refgpu-sim: {e}");
            return ExitCode::FAILURE;
        }
    };
    match run(&mut server) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("refgpu-sim: {e}");
            ExitCode::FAILURE
        }
    }
}
