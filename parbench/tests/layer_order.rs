//! The library's modules in layers: every file of `parbench/src` may name
//! (`crate::x`, `$crate::x`, a `super::` chain that reaches the crate
//! root) only the top-level modules below its own in [`LAYERS`]. The
//! order is the module table's in `docs/architecture.md`; a change to one
//! is a change to both.
//!
//! Code under `#[cfg(test)]` is left out: a module's own tests may hold it
//! against a layer above it (comm's gather conformance test starts tcp
//! ranks through `launch::LocalJob` and asks `model` that it prices no
//! gather; a schedule generator's test checks `model::bubble`'s peak). Doc
//! comments are left out too: a doc link up names, it does not depend.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The top-level modules of `parbench/src`, lowest first: a module may use
/// only those before it.
const LAYERS: &[&str] = &[
    // Leaves: no crate paths, or only each other's.
    "units",
    "seed",
    "stats",
    "published",
    "progress",
    "term",
    "limits",
    "files",
    "error_line",
    // How ranks find each other: below every communicator that meets there.
    "rendezvous",
    "gpu",
    "comm",
    "vocab",
    "compute",
    "schedule",
    "model",
    "measure",
    "results",
    "layers",
    "pipeline",
    // The launcher starts every backend's ranks: it names them all.
    "launch",
];

/// Upward imports known and left for now: (file under `parbench/src`, the
/// module it names). Empty: every file keeps to the order.
const KNOWN_EXCEPTIONS: &[(&str, &str)] = &[];

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `text` without comments, string literals' contents and character
/// literals, so that only code is read.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let mut depth = 0;
                while i < b.len() {
                    if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                        depth += 1;
                        i += 2;
                    } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
            }
            b'r' if matches!(b.get(i + 1), Some(b'"' | b'#'))
                && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')) =>
            {
                // A raw string: r"..." or r#"..."#.
                let mut j = i + 1;
                let mut hashes = 0;
                while b.get(j) == Some(&b'#') {
                    hashes += 1;
                    j += 1;
                }
                if b.get(j) != Some(&b'"') {
                    out.push('r');
                    i += 1;
                    continue;
                }
                let close: Vec<u8> = std::iter::once(b'"')
                    .chain(std::iter::repeat_n(b'#', hashes))
                    .collect();
                j += 1;
                while j < b.len() && !b[j..].starts_with(&close) {
                    j += 1;
                }
                out.push_str("\"\"");
                i = j + close.len();
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                out.push_str("\"\"");
                i += 1;
            }
            b'\'' if b.get(i + 2) == Some(&b'\'') || b.get(i + 1) == Some(&b'\\') => {
                // A character literal ('x', '\n', '\u{1b}'); a lifetime stays.
                let mut j = i + 1;
                while j < b.len() && b[j] != b'\'' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                out.push_str("' '");
                i = j + 1;
            }
            _ => {
                let c = text[i..].chars().next().expect("a character");
                out.push(c);
                i += c.len_utf8();
            }
        }
    }
    out
}

/// `code` without the items under `#[cfg(test)]`, and the names of the
/// modules it declares under it with `mod name;` (their files are tests).
fn without_tests(code: &str) -> (String, Vec<String>) {
    const MARK: &str = "#[cfg(test)]";
    let mut kept = String::with_capacity(code.len());
    let mut test_mods = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(MARK) {
        kept.push_str(&rest[..at]);
        let after = &rest[at + MARK.len()..];
        let end = after.find([';', '{']).expect("an item after #[cfg(test)]");
        if after.as_bytes()[end] == b';' {
            let item = after[..end].trim();
            if let Some(name) = item.strip_prefix("mod ").or(item.strip_prefix("pub mod ")) {
                test_mods.push(name.trim().to_string());
            }
            rest = &after[end + 1..];
            continue;
        }
        let mut depth = 0usize;
        let mut close = after.len();
        for (i, c) in after[end..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = end + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &after[close..];
    }
    kept.push_str(rest);
    (kept, test_mods)
}

/// The top-level modules `code` names, where the file sits `depth` modules
/// below the crate root (`comm/tcp/mesh.rs`: 3; `comm/mod.rs`: 1).
fn named_tops(code: &str, depth: usize, tops: &BTreeSet<&str>) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    let words: Vec<(usize, &str)> = code
        .match_indices(|c: char| !(c.is_alphanumeric() || c == '_' || c == '$'))
        .scan(0, |start, (i, sep)| {
            let w = (*start, &code[*start..i]);
            *start = i + sep.len();
            Some(w)
        })
        .filter(|(_, w)| !w.is_empty())
        .collect();
    let follows_path = |at: usize, len: usize| code[at + len..].starts_with("::");
    let mut k = 0;
    while k < words.len() {
        let (at, w) = words[k];
        if (w == "crate" || w == "$crate")
            && follows_path(at, w.len())
            && (at == 0 || !code[..at].ends_with("::"))
        {
            if let Some(&(_, next)) = words.get(k + 1) {
                if tops.contains(next) {
                    named.insert(next.to_string());
                }
            }
        } else if w == "super" && follows_path(at, w.len()) && !code[..at].ends_with("::") {
            let mut ups = 0;
            while words
                .get(k + ups)
                .is_some_and(|&(a, w)| w == "super" && follows_path(a, 5))
            {
                ups += 1;
            }
            if ups >= depth {
                if let Some(&(_, next)) = words.get(k + ups) {
                    if tops.contains(next) {
                        named.insert(next.to_string());
                    }
                }
            }
            k += ups;
            continue;
        }
        k += 1;
    }
    named
}

#[test]
fn no_module_of_the_library_names_one_above_it() {
    let src = src_dir();
    let tops: BTreeSet<&str> = LAYERS.iter().copied().collect();
    let mut on_disk = BTreeSet::new();
    for e in std::fs::read_dir(&src).expect("parbench/src") {
        let p = e.expect("an entry").path();
        let name = p
            .file_stem()
            .expect("a name")
            .to_string_lossy()
            .into_owned();
        if name != "lib" && (p.is_dir() || p.extension().is_some_and(|x| x == "rs")) {
            on_disk.insert(name);
        }
    }
    let listed: BTreeSet<String> = tops.iter().map(|s| s.to_string()).collect();
    assert_eq!(
        on_disk, listed,
        "every top-level module of parbench/src has its place in LAYERS (and docs/architecture.md's table)"
    );

    let mut files = Vec::new();
    rust_files(&src, &mut files);
    // Files a `#[cfg(test)] mod x;` declares: tests, left out.
    let mut test_files = BTreeSet::new();
    let mut read = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).expect("a source file");
        let (code, test_mods) = without_tests(&code_only(&text));
        let dir = match path.file_name().and_then(|n| n.to_str()) {
            Some("mod.rs" | "lib.rs") => path.parent().expect("a folder").to_path_buf(),
            _ => path.with_extension(""),
        };
        for m in test_mods {
            test_files.insert(dir.join(format!("{m}.rs")));
            test_files.insert(dir.join(&m).join("mod.rs"));
        }
        read.push((path.clone(), code));
    }

    let rank = |m: &str| {
        LAYERS
            .iter()
            .position(|l| *l == m)
            .expect("a listed module")
    };
    let mut upward = Vec::new();
    for (path, code) in read {
        let rel = path.strip_prefix(&src).expect("under src");
        let parts: Vec<String> = rel
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        if parts == ["lib.rs"] || test_files.contains(&path) {
            continue;
        }
        let own = parts[0].trim_end_matches(".rs").to_string();
        let depth = match parts.last().map(String::as_str) {
            Some("mod.rs") => parts.len() - 1,
            _ => parts.len(),
        };
        let rel_text = parts.join("/");
        for named in named_tops(&code, depth, &tops) {
            if named == own || rank(&named) < rank(&own) {
                continue;
            }
            if KNOWN_EXCEPTIONS.contains(&(rel_text.as_str(), named.as_str())) {
                continue;
            }
            upward.push(format!(
                "{rel_text} ({own}) names {named}, a layer above it"
            ));
        }
    }
    assert!(
        upward.is_empty(),
        "imports against the layer order (LAYERS, lowest first: {}):\n{}",
        LAYERS.join(" < "),
        upward.join("\n")
    );
}

#[test]
fn the_reader_finds_crate_paths_in_code_only() {
    let tops: BTreeSet<&str> = ["comm", "launch", "model", "units"].into_iter().collect();
    let code = code_only(
        "use crate::comm::X;\n/// [`crate::launch::Y`]\nlet s = \"crate::model\";\n// crate::model\nlet c = '\"'; crate::units::f();",
    );
    let got = named_tops(&code, 1, &tops);
    assert_eq!(
        got.into_iter().collect::<Vec<_>>(),
        vec!["comm".to_string(), "units".to_string()]
    );
    // A super chain that reaches the crate root names a top-level module.
    assert!(named_tops("use super::super::launch::Z;", 2, &tops).contains("launch"));
    assert!(named_tops("use super::launch::Z;", 2, &tops).is_empty());
    let (kept, mods) = without_tests(
        "use crate::comm::A;\n#[cfg(test)]\nmod tests { use crate::launch::B; { } }\n#[cfg(test)]\nmod sharding_tests;\nfn f() {}",
    );
    assert!(
        !kept.contains("launch") && kept.contains("fn f()"),
        "{kept}"
    );
    assert_eq!(mods, vec!["sharding_tests".to_string()]);
}
