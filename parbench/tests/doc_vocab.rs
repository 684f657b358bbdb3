//! docs/usage.md's table of the flags every binary shares lists exactly the
//! shared vocabulary (`parbench::vocab::SHARED`): a flag added to one and not
//! to the other fails here.

use std::collections::BTreeSet;
use std::path::Path;

/// The long flags (`--name`, without the dashes) in the `flag` column of the
/// first table under the heading `heading` in `page`.
fn table_longs(page: &str, heading: &str) -> BTreeSet<String> {
    let mut lines = page.lines().skip_while(|l| l.trim() != heading).skip(1);
    let rows = lines
        .by_ref()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'));
    let mut longs = BTreeSet::new();
    let mut flag_column = None;
    for row in rows {
        let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
        let Some(col) = flag_column else {
            flag_column = cells.iter().position(|c| *c == "flag");
            continue;
        };
        for span in cells.get(col).unwrap_or(&"").split('`').skip(1).step_by(2) {
            if let Some(long) = span.strip_prefix("--") {
                longs.insert(long.to_string());
            }
        }
    }
    longs
}

#[test]
fn the_shared_flags_table_lists_the_vocabulary() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/usage.md");
    let page = std::fs::read_to_string(&path).expect("docs/usage.md reads");
    let mut documented = table_longs(&page, "### Flags shared by every tool");
    // clap's own flag, the same in every binary; not a vocabulary entry.
    documented.remove("version");
    let shared: BTreeSet<String> = parbench::vocab::SHARED
        .iter()
        .map(|f| f.long.to_string())
        .collect();
    assert_eq!(
        documented, shared,
        "docs/usage.md's shared-flags table against parbench::vocab::SHARED"
    );
}

#[test]
fn the_table_reader_finds_the_flag_column_only() {
    let page = "## Other\n| flag |\n|---|\n| `--elsewhere` |\n\
                ### Flags shared by every tool\n\ntext `--not-a-row`\n\n\
                | concept | flag | value |\n|---|---|---|\n\
                | a | `-n`, `--iters` | `--iters-in-value` |\n| b | `--link`, `--intra` | |\n\n\
                | flag |\n|---|\n| `--next-table` |\n";
    let found: Vec<String> = table_longs(page, "### Flags shared by every tool")
        .into_iter()
        .collect();
    assert_eq!(found, ["intra", "iters", "link"]);
}
