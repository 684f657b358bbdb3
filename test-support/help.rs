//! A binary's help as its tests read it: every text clap prints for the
//! command and each subcommand, held to what a reader needs (words for
//! every flag, no rustdoc, lists that are the registries' own).

use parbench::vocab::listed_names;

fn commands(cmd: &clap::Command) -> Vec<clap::Command> {
    let mut out = vec![cmd.clone()];
    for sub in cmd.get_subcommands() {
        out.extend(commands(sub));
    }
    out
}

/// Panics where the help of `cmd` or a subcommand has a rustdoc link or
/// path, names one of `others` (the other binaries), or leaves a flag
/// without a word.
pub fn assert_plain_help(mut cmd: clap::Command, others: &[&str]) {
    cmd.build();
    let mut found = Vec::new();
    for mut c in commands(&cmd) {
        let text = c.render_long_help().to_string();
        for bad in ["[`", "crate::"].iter().chain(others) {
            if text.contains(bad) {
                found.push(format!("{}: help has '{bad}'", c.get_name()));
            }
        }
        for a in c.get_arguments().filter(|a| !a.is_hide_set()) {
            let words = a.get_help().or(a.get_long_help()).map(|h| h.to_string());
            if words.is_none_or(|w| w.trim().is_empty()) {
                found.push(format!("{}: {} has no help", c.get_name(), a.get_id()));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// Panics unless the help of the argument `id` (of `cmd`, or of its
/// subcommand `sub`) lists exactly `names`, in the registry's order.
pub fn assert_lists<S: AsRef<str>>(
    cmd: &clap::Command,
    sub: Option<&str>,
    id: &str,
    names: impl IntoIterator<Item = S>,
) {
    let c = match sub {
        Some(s) => cmd.find_subcommand(s).expect("subcommand"),
        None => cmd,
    };
    let arg = c
        .get_arguments()
        .find(|a| a.get_id() == id)
        .unwrap_or_else(|| panic!("no argument {id}"));
    let help = arg
        .get_long_help()
        .or(arg.get_help())
        .map(|h| h.to_string())
        .unwrap_or_default();
    let want: Vec<String> = names.into_iter().map(|n| n.as_ref().to_string()).collect();
    assert!(!want.is_empty(), "{id}: the registry is empty");
    assert_eq!(listed_names(&help), want, "{id}: {help}");
}
