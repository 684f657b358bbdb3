//! Embeds the git revision in the library, for every run's metadata.
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    Command::new("git")
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

fn main() {
    if let Some(rev) = git(&["describe", "--always", "--dirty", "--abbrev=12"]) {
        println!("cargo:rustc-env=PARBENCH_GIT_REV={rev}");
    }
    // Run again when the revision or the dirty mark can change: HEAD moves
    // to another branch, the branch moves (a commit: HEAD itself does not
    // change then, and a build after it recorded the revision before),
    // refs are packed, or the index changes. Worktrees have their own HEAD
    // and index (--git-dir) and share the refs (--git-common-dir).
    let dirs = [
        git(&["rev-parse", "--git-dir"]),
        git(&["rev-parse", "--git-common-dir"]),
    ];
    let branch = git(&["symbolic-ref", "-q", "HEAD"]);
    for dir in dirs.iter().flatten() {
        let mut files = vec!["HEAD".to_string(), "index".into(), "packed-refs".into()];
        files.extend(branch.clone());
        for f in files {
            let p = std::path::Path::new(dir).join(f);
            if p.exists() {
                println!("cargo:rerun-if-changed={}", p.display());
            }
        }
    }
    // Sources edited after a commit make the build dirty.
    println!("cargo:rerun-if-changed=src");
}
