//! A binary's flag definitions held to the shared vocabulary. Each
//! binary's tests turn its clap definitions into [`ArgDef`]s (through
//! `test-support/vocab.rs`) and assert that [`problems`] finds none; this
//! module knows nothing of clap.

use super::rewrite::RENAMED;
use super::{Tool, NCCL_TESTS_SHORTS, SHARED};

/// One argument as a binary defines it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ArgDef {
    /// `--long` without its dashes.
    pub long: Option<String>,
    pub short: Option<char>,
    /// Other long spellings clap accepts (aliases).
    pub aliases: Vec<String>,
    pub short_aliases: Vec<char>,
    /// The value's syntax as help prints it; empty for a switch.
    pub value_names: Vec<String>,
}

impl ArgDef {
    fn longs(&self) -> impl Iterator<Item = &str> {
        self.long.iter().chain(&self.aliases).map(String::as_str)
    }

    fn shorts(&self) -> impl Iterator<Item = char> + '_ {
        self.short.iter().chain(&self.short_aliases).copied()
    }

    fn name(&self) -> String {
        match (&self.long, self.short) {
            (Some(l), _) => format!("--{l}"),
            (None, Some(s)) => format!("-{s}"),
            (None, None) => "a positional argument".into(),
        }
    }
}

/// What in `args` (the flags of `tool`, or of its subcommand `scope`)
/// departs from the shared vocabulary, one line each.
pub fn problems(tool: Tool, scope: Option<&str>, args: &[ArgDef]) -> Vec<String> {
    let at = match scope {
        Some(s) => format!("{} {s}", tool.name()),
        None => tool.name().to_string(),
    };
    let mut out = Vec::new();
    for a in args {
        for f in SHARED {
            if !a.longs().any(|l| l == f.long) {
                continue;
            }
            if a.long.as_deref() != Some(f.long) {
                out.push(format!(
                    "{at}: --{} is spelled {} (an alias of another flag)",
                    f.long,
                    a.name()
                ));
            }
            // bench-collectives keeps nccl-tests' letters (-J for the JSON file).
            let nccl_tests_letter = |s: char| {
                tool == Tool::Collectives && NCCL_TESTS_SHORTS.iter().any(|(l, _)| *l == s)
            };
            if let Some(s) = a
                .short
                .filter(|&s| Some(s) != f.short && !nccl_tests_letter(s))
            {
                out.push(format!(
                    "{at}: --{} has the short -{s}; the shared one is {}",
                    f.long,
                    f.short.map_or("none".into(), |c| format!("-{c}"))
                ));
            }
            let want: Vec<String> = f.value.iter().map(|v| v.to_string()).collect();
            // A tool that takes one value of a list concept says so (`T`).
            let one: Vec<String> = f.one.iter().map(|v| v.to_string()).collect();
            if a.value_names != want && (one.is_empty() || a.value_names != one) {
                out.push(format!(
                    "{at}: --{} takes {:?}; the shared syntax is {:?}",
                    f.long, a.value_names, want
                ));
            }
        }
        // A rename's old spelling is rewritten before clap reads the line:
        // defined again, it would be a second spelling.
        for r in RENAMED
            .iter()
            .filter(|r| r.tool == tool && (r.scope.is_none() || r.scope == scope))
        {
            let defined = match r.old.strip_prefix("--") {
                Some(long) => a.longs().any(|l| l == long),
                None => r
                    .old
                    .strip_prefix('-')
                    .and_then(|s| s.chars().next())
                    .is_some_and(|c| a.shorts().any(|s| s == c)),
            };
            if defined {
                out.push(format!(
                    "{at}: {} is defined again; it is the old spelling of {}",
                    r.old, r.new
                ));
            }
        }
        // nccl-tests' letters: bench-collectives keeps their meanings; the
        // others use one only as the shared concept that owns it.
        if tool != Tool::Collectives {
            for s in a.shorts().filter(|&s| s != 'h') {
                let Some((_, theirs)) = NCCL_TESTS_SHORTS.iter().find(|(l, _)| *l == s) else {
                    continue;
                };
                let owner = super::concept_of_short(s);
                if owner.is_none_or(|f| a.long.as_deref() != Some(f.long)) {
                    out.push(format!(
                        "{at}: -{s} is {}, but nccl-tests' -{s} is --{theirs}",
                        a.name()
                    ));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arg(long: &str, short: Option<char>, value: &[&str]) -> ArgDef {
        ArgDef {
            long: Some(long.into()),
            short,
            value_names: value.iter().map(|v| v.to_string()).collect(),
            ..ArgDef::default()
        }
    }

    #[test]
    fn the_shared_spellings_pass() {
        let args = [
            arg("iters", Some('n'), &["N"]),
            arg("timeout", Some('T'), &["SECS"]),
            arg("hidden", None, &["HIDDEN"]),
        ];
        assert_eq!(problems(Tool::Layers, None, &args), Vec::<String>::new());
    }

    #[test]
    fn a_list_concept_may_take_one_value_and_say_so() {
        for value in ["S[,S...]", "S"] {
            let args = [arg("stages", None, &[value])];
            assert!(problems(Tool::Pipeline, None, &args).is_empty(), "{value}");
        }
        let p = problems(Tool::Pipeline, None, &[arg("stages", None, &["N"])]);
        assert!(p.iter().any(|l| l.contains("shared syntax")), "{p:?}");
        // A concept without a list syntax has no second form.
        let p = problems(Tool::Layers, None, &[arg("chunks", None, &["N"])]);
        assert!(p.iter().any(|l| l.contains("shared syntax")), "{p:?}");
    }

    #[test]
    fn a_second_spelling_or_syntax_fails() {
        let mut steps = arg("steps", Some('n'), &["N"]);
        steps.aliases = vec!["iters".into()];
        let p = problems(Tool::Pipeline, None, &[steps]);
        assert!(
            p.iter().any(|l| l.contains("--iters is spelled --steps")),
            "{p:?}"
        );
        assert!(
            p.iter().any(|l| l.contains("--steps is defined again")),
            "{p:?}"
        );
        let p = problems(
            Tool::Report,
            Some("model"),
            &[arg("intra", None, &["GBPS"])],
        );
        assert!(p.iter().any(|l| l.contains("shared syntax")), "{p:?}");
        let p = problems(Tool::Layers, None, &[arg("iters", Some('i'), &["N"])]);
        assert!(
            p.iter().any(|l| l.contains("the shared one is -n")),
            "{p:?}"
        );
    }

    #[test]
    fn nccl_tests_letters_keep_their_meaning_outside_bench_collectives() {
        let p = problems(
            Tool::Report,
            Some("html"),
            &[arg("output", Some('o'), &["FILE"])],
        );
        assert!(
            p.iter().any(|l| l.contains("nccl-tests' -o is --op")),
            "{p:?}"
        );
        let version = ArgDef {
            long: Some("version".into()),
            short: Some('V'),
            ..ArgDef::default()
        };
        assert!(!problems(Tool::Layers, None, &[version]).is_empty());
        assert!(problems(Tool::Collectives, None, &[arg("op", Some('o'), &["OP"])]).is_empty());
    }
}
