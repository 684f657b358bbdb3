//! `bench-pipeline`: not built yet.

fn main() {
    eprintln!("bench-pipeline: not built yet");
    std::process::exit(2);
}
