//! `bench-layers`: not built yet.

fn main() {
    eprintln!("bench-layers: not built yet");
    std::process::exit(2);
}
