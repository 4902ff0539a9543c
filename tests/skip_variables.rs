//! `tests/README.md` lists every skip variable the tests read, and nothing else: a variable
//! missing from the table is a way to skip a test that an operator cannot find.

use std::collections::BTreeSet;
use std::path::Path;

/// Every `SHARDLINE_SKIP_<NAME>` written in `text`.
fn skip_variables(text: &str) -> BTreeSet<String> {
    const PREFIX: &str = "SHARDLINE_SKIP_";
    let mut found = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find(PREFIX) {
        let tail = &rest[at + PREFIX.len()..];
        let name_len = tail
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let name = tail[..name_len].trim_end_matches('_');
        if !name.is_empty() {
            found.insert(format!("{PREFIX}{name}"));
        }
        rest = &tail[name_len..];
    }
    found
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read_dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn the_readme_lists_every_skip_variable_the_code_reads() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&repo.join("tests"), &mut files);
    rust_files(&repo.join("src"), &mut files);
    let this_file = repo.join("tests/skip_variables.rs");
    let in_code: BTreeSet<String> = files
        .iter()
        .filter(|p| **p != this_file)
        .flat_map(|p| skip_variables(&std::fs::read_to_string(p).expect("read source")))
        .collect();
    let readme = std::fs::read_to_string(repo.join("tests/README.md")).expect("tests/README.md");
    // The table's first column: "| `SHARDLINE_SKIP_X=1` | ...".
    let in_table: BTreeSet<String> = readme
        .lines()
        .filter(|l| l.starts_with("| `SHARDLINE_SKIP_"))
        .flat_map(skip_variables)
        .collect();
    assert!(
        in_code.len() >= 9,
        "found only {in_code:?}: the scan is broken"
    );
    let undocumented: Vec<_> = in_code.difference(&in_table).collect();
    let stale: Vec<_> = in_table.difference(&in_code).collect();
    assert!(
        undocumented.is_empty() && stale.is_empty(),
        "tests/README.md's table misses {undocumented:?} and lists {stale:?} that no test reads"
    );
}

#[test]
fn the_scan_finds_names_and_not_their_punctuation() {
    let got = skip_variables("a SHARDLINE_SKIP_TWO_CPUS=1, `SHARDLINE_SKIP_X`. SHARDLINE_SKIP_");
    let want: BTreeSet<String> = ["SHARDLINE_SKIP_TWO_CPUS", "SHARDLINE_SKIP_X"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(got, want);
}
