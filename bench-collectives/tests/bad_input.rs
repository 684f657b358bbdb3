//! Bad flags, sizes, roots and unsupported backends: one line, exit code 2.

mod common;
use common::*;

fn assert_usage_error(args: &[&str], mentions: &str) {
    let o = run(args, &[]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "{args:?}: one line, got {err:?}"
    );
    assert!(
        err.contains(mentions),
        "{args:?}: {err:?} does not mention {mentions:?}"
    );
    assert!(o.stdout.is_empty(), "{args:?} printed a table");
}

#[test]
fn bad_input_is_one_line_and_exit_code_two() {
    assert_usage_error(&["--frobnicate"], "--frobnicate");
    assert_usage_error(&["all_scatter"], "all_scatter");
    assert_usage_error(&["-b", "12Q"], "12Q");
    assert_usage_error(&["-b", "1M", "-e", "1K"], "larger");
    assert_usage_error(&["-d", "complex"], "complex");
    assert_usage_error(&["-a", "7"], "average");
    assert_usage_error(&["--straggler", "oops"], "RANK:MS");
    assert_usage_error(
        &["broadcast", "--backend", "local", "-np", "2", "-r", "2"],
        "root",
    );
    assert_usage_error(
        &["--backend", "local", "-np", "2", "--straggler", "5:1"],
        "straggler",
    );
    if !cfg!(feature = "cuda") {
        assert_usage_error(&["--backend", "nccl"], "cuda");
    }
    if !cfg!(feature = "mpi") {
        assert_usage_error(&["--backend", "mpi"], "mpi");
    }
}
