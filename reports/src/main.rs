//! `report`: not built yet.

fn main() {
    eprintln!("report: not built yet");
    std::process::exit(2);
}
