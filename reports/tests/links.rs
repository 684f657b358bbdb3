//! `report html` over a real `bench-collectives links` run (five namespaces,
//! host 2 at 250 Mbit/s, the others at 1 Gbit/s) and a run that recorded its
//! reference: the heat map marks exactly rank 2's pairs and names it; the
//! reference and the peak's share are on the page.

mod common;
use common::*;

#[test]
fn the_heat_map_marks_the_slow_host_and_the_reference_is_named() {
    let out = scratch("links-html").join("report.html");
    let links = fixture("real-16-links");
    let reference = fixture("real-16-reference");
    let o = report(&[
        "html",
        links.to_str().unwrap(),
        reference.to_str().unwrap(),
        "--output-file",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let html = std::fs::read_to_string(&out).unwrap();
    assert!(html.contains("<section id=\"links\">"), "no links section");
    // 20 ordered pairs of 5 ranks, the 8 with rank 2 below 70% of the median.
    assert!(html.matches("<rect ").count() >= 25, "no heat map");
    assert_eq!(html.matches("fill=\"#d9534f\"").count(), 8);
    assert!(
        html.contains("Likely culprit: rank 2 (on every slow pair)."),
        "no culprit named"
    );
    assert!(
        html.contains("CPU wire (shm): the ceiling measured in this run"),
        "no reference"
    );
    assert!(
        html.contains("% of the ceiling measured at its working set"),
        "no share"
    );
}
