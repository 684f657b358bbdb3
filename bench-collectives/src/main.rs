//! `bench-collectives`: not built yet.

fn main() {
    eprintln!("bench-collectives: not built yet");
    std::process::exit(2);
}
