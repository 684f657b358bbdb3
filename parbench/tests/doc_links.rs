//! Every relative link in README.md, CHANGELOG.md and docs/*.md resolves:
//! the file (or folder) exists inside the repository, and a `#anchor`
//! names a heading of the target page as GitHub spells heading anchors.
//! Links to web addresses are left alone (nothing outside is reachable from
//! a test); a link that leaves the repository (`../shared/...`,
//! `/abs/path`) is broken, since a reader of the repository does not have
//! that file.
//!
//! The checker is tested on a small tree of its own with broken links, so a
//! checker that accepts everything fails here too.

use std::collections::HashSet;
use std::path::{Component, Path, PathBuf};

/// The repository root (this crate lives one level below it).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("parbench/ has a parent")
        .to_path_buf()
}

/// README.md, CHANGELOG.md (where there is one) and every docs/*.md,
/// relative to `root`, sorted.
fn doc_files(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![PathBuf::from("README.md")];
    if root.join("CHANGELOG.md").is_file() {
        files.push(PathBuf::from("CHANGELOG.md"));
    }
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "md"))
                .filter_map(|p| p.strip_prefix(root).ok().map(Path::to_path_buf))
                .collect()
        })
        .unwrap_or_default();
    docs.sort();
    files.extend(docs);
    files
}

/// The lines of `text` outside fenced code blocks, with their 1-based numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut in_fence = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with("```") || t.starts_with("~~~") {
            in_fence = !in_fence;
            continue;
        }
        if !in_fence {
            out.push((i + 1, line));
        }
    }
    out
}

/// `line` with its inline code spans removed (a link inside backticks is text).
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
        } else if !in_code {
            out.push(c);
        }
    }
    out
}

/// The targets of the inline links `[text](target)` in `text`, with their
/// line numbers (images `![..](..)` count too: the file must exist).
fn links_in(text: &str) -> Vec<(usize, String)> {
    let mut links = Vec::new();
    for (n, line) in prose_lines(text) {
        let line = without_code_spans(line);
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            // A title (`[a](b "title")`) follows the target after a space.
            let target = after[..end].split_whitespace().next().unwrap_or("");
            links.push((n, target.trim_matches(['<', '>']).to_string()));
            rest = &after[end..];
        }
    }
    links
}

/// GitHub's anchor for a heading's text: markup dropped, lower case, every
/// character that is not a letter, digit, `_`, `-` or space removed, spaces
/// turned into `-`.
fn slug(heading: &str) -> String {
    // Link syntax renders as its text: `[text](url)` -> `text`.
    let mut text = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        let Some(mid) = rest[open..].find("](") else {
            break;
        };
        let Some(close) = rest[open + mid..].find(')') else {
            break;
        };
        text.push_str(&rest[..open]);
        text.push_str(&rest[open + 1..open + mid]);
        rest = &rest[open + mid + close + 1..];
    }
    text.push_str(rest);
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every heading anchor of a Markdown page; a repeated heading gets `-1`,
/// `-2`, ... as on GitHub.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim().trim_end_matches('#').trim());
        let mut anchor = base.clone();
        let mut k = 0;
        while seen.contains(&anchor) {
            k += 1;
            anchor = format!("{base}-{k}");
        }
        seen.insert(anchor);
    }
    seen
}

/// `path` with `.` and `..` folded away, or `None` when it climbs above its start.
fn normalise(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Normal(p) => out.push(p),
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// One line per broken link in `files` (paths relative to `root`):
/// `file:line: target: why`.
fn broken_links(root: &Path, files: &[PathBuf]) -> Vec<String> {
    let mut broken = Vec::new();
    for file in files {
        let text = match std::fs::read_to_string(root.join(file)) {
            Ok(t) => t,
            Err(e) => {
                broken.push(format!("{}: unreadable: {e}", file.display()));
                continue;
            }
        };
        let dir = file.parent().unwrap_or(Path::new(""));
        for (line, target) in links_in(&text) {
            let at = format!("{}:{line}: {target}", file.display());
            if target.is_empty() {
                broken.push(format!("{at}: empty link"));
                continue;
            }
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                Some(file.clone())
            } else if path.starts_with('/') {
                None
            } else {
                normalise(&dir.join(path))
            };
            let Some(resolved) = resolved else {
                broken.push(format!("{at}: outside the repository"));
                continue;
            };
            let full = root.join(&resolved);
            if !full.exists() {
                broken.push(format!("{at}: no such file {}", resolved.display()));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if full.extension().is_none_or(|x| x != "md") {
                broken.push(format!("{at}: an anchor into a file that is not Markdown"));
                continue;
            }
            let page = std::fs::read_to_string(&full).unwrap_or_default();
            if !anchors(&page).contains(anchor) {
                broken.push(format!(
                    "{at}: no heading with anchor #{anchor} in {}",
                    resolved.display()
                ));
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_in_readme_and_docs_resolves() {
    let root = repo_root();
    let files = doc_files(&root);
    assert!(
        files.len() > 1,
        "no docs/*.md found under {}",
        root.display()
    );
    let broken = broken_links(&root, &files);
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// A scratch tree for the checker's own tests, fresh for each test.
fn scratch_tree(name: &str, pages: &[(&str, &str)]) -> PathBuf {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("doc_links-{name}"));
    let _ = std::fs::remove_dir_all(&root);
    for (path, text) in pages {
        let p = root.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    root
}

#[test]
fn the_checker_reports_each_kind_of_broken_link_and_passes_good_ones() {
    let readme = "# Top\n\
        [ok file](docs/a.md) [ok anchor](docs/a.md#the-wires-ceiling)\n\
        [ok here](#top) [ok folder](docs) [web](https://example.com/x#y)\n\
        `[in code](nowhere.md)`\n\
        ```\n[in a fence](nowhere.md)\n```\n\
        [missing](docs/missing.md)\n\
        [bad anchor](docs/a.md#no-such-heading)\n\
        [outside](../shared/DESIGN.md)\n\
        [absolute](/etc/passwd)\n";
    let a =
        "# A\n## The wire's ceiling\n## Tests\n## Tests\n[up](../README.md#top) [dup](#tests-1)\n";
    let root = scratch_tree("mixed", &[("README.md", readme), ("docs/a.md", a)]);
    let broken = broken_links(&root, &doc_files(&root));
    let targets: Vec<&str> = broken
        .iter()
        .map(|b| b.split(": ").nth(1).unwrap_or(""))
        .collect();
    assert_eq!(
        targets,
        [
            "docs/missing.md",
            "docs/a.md#no-such-heading",
            "../shared/DESIGN.md",
            "/etc/passwd"
        ],
        "{broken:#?}"
    );
    assert!(broken[0].starts_with("README.md:8:"), "{}", broken[0]);
}

#[test]
fn a_tree_of_good_links_has_none_broken() {
    let root = scratch_tree(
        "good",
        &[
            (
                "README.md",
                "# Front door\nSee [b](docs/b.md#bench-layers-tp-1-2-4-8).\n",
            ),
            (
                "docs/b.md",
                "# B\n## bench-layers: TP 1, 2, 4, 8\n[back](../README.md#front-door)\n",
            ),
        ],
    );
    assert_eq!(broken_links(&root, &doc_files(&root)), Vec::<String>::new());
}

#[test]
fn slugs_are_githubs() {
    assert_eq!(
        slug("Libraries: the `libnccl.so.2` note"),
        "libraries-the-libncclso2-note"
    );
    assert_eq!(slug("`report model`"), "report-model");
    assert_eq!(
        slug("CSV (`--schedule-csv`, `--dump-schedules`)"),
        "csv---schedule-csv---dump-schedules"
    );
    assert_eq!(slug("See [comm](comm.md) here"), "see-comm-here");
    assert_eq!(slug("run.json"), "runjson");
}
