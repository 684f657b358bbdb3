//! docs/records.md documents exactly what the code writes: each CSV's
//! column table lists the row type's columns in order, and the run.json
//! table names every field of a run record. A column added, renamed or
//! dropped without the page fails here.

use parbench::results::{
    columns, CollectiveRow, CpRingRow, CpRow, LayerRow, LinkRow, MoeRow, PipelineRow, Record,
    RunMeta,
};
use std::path::Path;

fn records_page() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/records.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The names in backticks in the first cell of each table row of the part
/// of `page` under the heading `heading` (up to the next heading).
fn documented(page: &str, heading: &str) -> Vec<String> {
    let start = page
        .lines()
        .position(|l| l == heading)
        .unwrap_or_else(|| panic!("docs/records.md has no heading {heading:?}"));
    page.lines()
        .skip(start + 1)
        .take_while(|l| !l.starts_with('#'))
        .filter_map(|l| l.strip_prefix('|'))
        .filter_map(|l| l.split('|').next())
        .flat_map(|cell| {
            cell.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

fn assert_table_matches<R: Record>() {
    let page = records_page();
    let heading = format!("### {}", R::FILE);
    let written: Vec<&str> = columns::<R>().to_vec();
    assert_eq!(
        documented(&page, &heading),
        written,
        "docs/records.md's {heading} table against the columns {} writes",
        R::FILE
    );
}

#[test]
fn every_csv_column_is_documented_in_order() {
    assert_table_matches::<CollectiveRow>();
    assert_table_matches::<LinkRow>();
    assert_table_matches::<MoeRow>();
    assert_table_matches::<CpRingRow>();
    assert_table_matches::<LayerRow>();
    assert_table_matches::<CpRow>();
    assert_table_matches::<PipelineRow>();
}

#[test]
fn every_run_json_field_is_documented() {
    let mut meta = RunMeta::start("collectives", "collectives-x-1", "local", 2);
    // Written only when a run ends early: set, so that it is listed.
    meta.cut_short = Some("a test".into());
    let value = serde_json::to_value(&meta).unwrap();
    let mut fields: Vec<String> = value.as_object().unwrap().keys().cloned().collect();
    fields.sort();
    let mut listed = documented(&records_page(), "## run.json");
    listed.sort();
    assert_eq!(
        listed, fields,
        "docs/records.md's run.json table against RunMeta"
    );
}

#[test]
fn the_table_reader_takes_every_name_of_a_first_cell() {
    let page = "## x\n| a | b |\n|---|---|\n| `one`, `two` | `not this` |\n| `three` | |\n## y\n| `four` | |\n";
    assert_eq!(documented(page, "## x"), ["one", "two", "three"]);
}
