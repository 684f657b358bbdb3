//! A binary's clap definitions as the shared vocabulary's checker reads
//! them (`parbench::vocab::check`): every argument of the command and of
//! each subcommand, with clap's own help and version flags.

use parbench::vocab::check::{problems, ArgDef};
use parbench::vocab::Tool;

fn defs(cmd: &clap::Command) -> Vec<ArgDef> {
    cmd.get_arguments()
        .filter(|a| !a.is_positional())
        .map(|a| ArgDef {
            long: a.get_long().map(str::to_string),
            short: a.get_short(),
            aliases: a
                .get_all_aliases()
                .unwrap_or_default()
                .into_iter()
                .map(str::to_string)
                .collect(),
            short_aliases: a.get_all_short_aliases().unwrap_or_default(),
            value_names: if a.get_action().takes_values() {
                a.get_value_names()
                    .unwrap_or_default()
                    .iter()
                    .map(|v| v.to_string())
                    .collect()
            } else {
                Vec::new()
            },
        })
        .collect()
}

/// Panics with every departure from the vocabulary in `cmd` (built first,
/// so that clap's `-h` and `-V` are there) and its subcommands.
pub fn assert_shared_vocabulary(tool: Tool, mut cmd: clap::Command) {
    cmd.build();
    let mut found = problems(tool, None, &defs(&cmd));
    for sub in cmd.get_subcommands() {
        found.extend(problems(tool, Some(sub.get_name()), &defs(sub)));
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}
