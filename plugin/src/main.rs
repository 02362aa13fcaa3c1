//! The `ipkeep` CNI IPAM plugin binary: environment and stdin in, one library call, reply out.

use std::io::Write;

fn main() {
    let getenv = |name: &str| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
    let reply = ipkeep_plugin::skel::run(
        &getenv,
        &mut std::io::stdin().lock(),
        std::time::SystemTime::now(),
        &ipkeep_plugin::neighbour::Kernel,
    );
    // Nothing useful can be done if the runtime closed our output pipes.
    let _ = std::io::stdout().lock().write_all(reply.stdout.as_bytes());
    let _ = std::io::stderr().lock().write_all(reply.stderr.as_bytes());
    std::process::exit(reply.exit_code);
}
