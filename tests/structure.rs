//! The source tree keeps the shape `docs/ARCHITECTURE.md` promises: no two modules import each
//! other (file by file, and top-level module by top-level module), so each layer can be read
//! without the ones above it.
//!
//! The module graph is read from the sources: every `use crate::`/`super::`/`self::` tree, every
//! inline `crate::a::b` or `super::a` path, and every path through a child module (`machine::X`
//! in `shard/mod.rs`). A path names the longest module it reaches; `super::Item` names the
//! parent. A child's use of its ancestors is not an edge: a child is part of its parent (it
//! sees the parent's private items), so the graph is between siblings and across subtrees.
//! Unit-test modules (`mod tests`) may reach anywhere and are left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path under the crate root: `["shard", "machine"]`.
type ModPath = Vec<String>;

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every library module file, by its module path. `main.rs` is the binary, not a module.
fn modules() -> BTreeMap<ModPath, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src_dir()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let rel = path.strip_prefix(src_dir()).unwrap().with_extension("");
            let mut segs: ModPath = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if segs.last().map(String::as_str) == Some("mod") {
                segs.pop();
            }
            if segs == ["main"] {
                continue;
            }
            if segs == ["lib"] {
                segs.clear();
            }
            out.insert(segs, path);
        }
    }
    assert!(
        out.len() > 20,
        "found only {} modules under {}",
        out.len(),
        src_dir().display()
    );
    out
}

/// The source with comments, string literals and character literals blanked out, so a path
/// mentioned in a doc comment or an error message is not read as an import.
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if b[i] == b'r' && (b[i..].starts_with(b"r\"") || b[i..].starts_with(b"r#")) {
            // A raw string: r"..." or r#"..."#.
            let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
            if b.get(i + 1 + hashes) != Some(&b'"') {
                out.push(b[i]);
                i += 1;
                continue;
            }
            let mut close = vec![b'"'];
            close.extend(std::iter::repeat_n(b'#', hashes));
            i += 2 + hashes;
            while i < b.len() && !b[i..].starts_with(&close) {
                i += 1;
            }
            i += close.len();
            out.push(b' ');
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push(b' ');
        } else if b[i] == b'\'' {
            // A char literal ('x', '\n', '\u{..}'); anything else is a lifetime.
            if b.get(i + 1) == Some(&b'\\') {
                let end = b[i + 2..].iter().position(|&c| c == b'\'').unwrap_or(0);
                i += 3 + end;
                out.push(b' ');
            } else if b.get(i + 2) == Some(&b'\'') {
                i += 3;
                out.push(b' ');
            } else if let Some(len) = std::str::from_utf8(&b[i + 1..(i + 5).min(b.len())])
                .ok()
                .or_else(|| std::str::from_utf8(&b[i + 1..(i + 4).min(b.len())]).ok())
                .and_then(|s| s.chars().next())
                .filter(|c| !c.is_ascii())
                .map(char::len_utf8)
                .filter(|&l| b.get(i + 1 + l) == Some(&b'\''))
            {
                i += 2 + len;
                out.push(b' ');
            } else {
                out.push(b[i]);
                i += 1;
            }
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `code` without its `#[cfg(test)] mod NAME { ... }` blocks and `#[cfg(test)] mod tests;`.
fn without_test_modules(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
        let item = after.trim_start();
        let item = item.strip_prefix("pub(crate) ").unwrap_or(item);
        let Some(decl) = item.strip_prefix("mod ") else {
            out.push_str("#[cfg(test)]");
            rest = after;
            continue;
        };
        let name_len = decl
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(decl.len());
        let tail = decl[name_len..].trim_start();
        let skip_from = code.len() - tail.len();
        if tail.starts_with(';') {
            rest = &code[skip_from + 1..];
            continue;
        }
        assert!(tail.starts_with('{'), "unexpected cfg(test) module shape");
        let mut depth = 0usize;
        let mut end = tail.len();
        for (k, c) in tail.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = k + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &code[skip_from + end..];
    }
    out.push_str(rest);
    out
}

/// `a::{b, c::{d, e as f}}` -> `a::b`, `a::c::d`, `a::c::e` (renames and whitespace dropped).
fn expand_use_tree(tree: &str) -> Vec<String> {
    let tree: String = tree
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace(" as ", "@")
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let tree: String = strip_renames(&tree);
    let Some(open) = tree.find('{') else {
        return vec![tree];
    };
    let prefix = &tree[..open];
    let body = &tree[open + 1..tree.len() - 1];
    let mut parts = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (k, c) in body.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&body[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    parts.push(&body[start..]);
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .flat_map(|p| {
            expand_use_tree(p)
                .into_iter()
                .map(move |x| format!("{prefix}{x}"))
        })
        .collect()
}

/// `a@b` (a rename) -> `a`, inside a use tree.
fn strip_renames(tree: &str) -> String {
    let mut out = String::new();
    let mut skipping = false;
    for c in tree.chars() {
        if c == '@' {
            skipping = true;
        } else if skipping && (c == ',' || c == '}') {
            skipping = false;
            out.push(c);
        } else if !skipping {
            out.push(c);
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The module a path written in `from` (`crate::a::b`, `super::x`, `self::y`, `child::z`)
/// reaches: the longest prefix that is a module. None for paths outside the crate.
fn resolve(path: &str, from: &ModPath, mods: &BTreeMap<ModPath, PathBuf>) -> Option<ModPath> {
    let segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let (mut base, rest): (ModPath, &[&str]) = match segs.first().copied() {
        Some("crate") => (Vec::new(), &segs[1..]),
        Some("self") => (from.clone(), &segs[1..]),
        Some("super") => {
            let ups = segs.iter().take_while(|s| **s == "super").count();
            let mut b = from.clone();
            for _ in 0..ups {
                b.pop()?;
            }
            (b, &segs[ups..])
        }
        Some(first) => {
            let mut child = from.clone();
            child.push(first.to_string());
            if !mods.contains_key(&child) {
                return None;
            }
            (from.clone(), &segs[..])
        }
        None => return None,
    };
    let mut best = base.clone();
    for s in rest {
        base.push(s.to_string());
        if mods.contains_key(&base) {
            best = base.clone();
        } else {
            break;
        }
    }
    Some(best)
}

/// Every module each module's code reaches.
fn import_graph() -> BTreeMap<ModPath, BTreeSet<ModPath>> {
    let mods = modules();
    let mut graph = BTreeMap::new();
    for (module, file) in &mods {
        if module.last().map(String::as_str) == Some("tests") || module.is_empty() {
            continue;
        }
        let src = std::fs::read_to_string(file).expect("read module");
        let code = without_test_modules(&code_only(&src));
        let mut paths = Vec::new();
        // `use` trees (they may span lines and braces).
        let mut rest = code.as_str();
        while let Some(at) = rest.find("use ") {
            let before = rest[..at].chars().next_back();
            let tail = &rest[at + 4..];
            rest = tail;
            if before.is_some_and(is_ident) {
                continue;
            }
            let Some(end) = tail.find(';') else { break };
            paths.extend(expand_use_tree(&tail[..end]));
        }
        // Inline paths: an identifier followed by `::` that starts a path.
        let chars: Vec<(usize, char)> = code.char_indices().collect();
        for (n, &(at, c)) in chars.iter().enumerate() {
            if !is_ident(c) || (n > 0 && (is_ident(chars[n - 1].1) || chars[n - 1].1 == ':')) {
                continue;
            }
            let word_end = code[at..]
                .find(|ch: char| !is_ident(ch))
                .map_or(code.len(), |k| at + k);
            if !code[word_end..].starts_with("::") {
                continue;
            }
            let path_end = code[at..]
                .find(|ch: char| !(is_ident(ch) || ch == ':'))
                .map_or(code.len(), |k| at + k);
            paths.push(code[at..path_end].to_string());
        }
        let mut deps = BTreeSet::new();
        for p in paths {
            if let Some(target) = resolve(&p, module, &mods) {
                // A module may use its ancestors' items (Rust gives a child its parent's
                // private ones: they are one unit of reading); what must not loop is
                // anything else.
                if !target.is_empty() && !module.starts_with(&target) {
                    deps.insert(target);
                }
            }
        }
        graph.insert(module.clone(), deps);
    }
    graph
}

/// The strongly connected parts of more than one node (each is a cycle of imports).
fn cycles<N: Ord + Clone>(graph: &BTreeMap<N, BTreeSet<N>>) -> Vec<Vec<N>> {
    // Kosaraju: finish order on the graph, then components on its reverse.
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    for start in graph.keys() {
        if seen.contains(start) {
            continue;
        }
        let mut stack = vec![(start.clone(), false)];
        while let Some((n, done)) = stack.pop() {
            if done {
                order.push(n);
                continue;
            }
            if !seen.insert(n.clone()) {
                continue;
            }
            stack.push((n.clone(), true));
            for m in graph.get(&n).into_iter().flatten() {
                if !seen.contains(m) {
                    stack.push((m.clone(), false));
                }
            }
        }
    }
    let mut reverse: BTreeMap<N, BTreeSet<N>> = BTreeMap::new();
    for (a, bs) in graph {
        for b in bs {
            reverse.entry(b.clone()).or_default().insert(a.clone());
        }
    }
    let mut assigned = BTreeSet::new();
    let mut out = Vec::new();
    for n in order.into_iter().rev() {
        if assigned.contains(&n) {
            continue;
        }
        let mut part = Vec::new();
        let mut stack = vec![n];
        while let Some(m) = stack.pop() {
            if !assigned.insert(m.clone()) {
                continue;
            }
            part.push(m.clone());
            for p in reverse.get(&m).into_iter().flatten() {
                if !assigned.contains(p) {
                    stack.push(p.clone());
                }
            }
        }
        if part.len() > 1 {
            part.sort();
            out.push(part);
        }
    }
    out
}

fn show(parts: &[Vec<ModPath>]) -> String {
    parts
        .iter()
        .map(|p| {
            p.iter()
                .map(|m| m.join("::"))
                .collect::<Vec<_>>()
                .join(" <-> ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn no_two_modules_import_each_other() {
    let graph = import_graph();
    let found = cycles(&graph);
    assert!(
        found.is_empty(),
        "modules that import each other (directly or through others):\n{}",
        show(&found)
    );
}

#[test]
fn no_two_top_level_modules_import_each_other() {
    let mut top: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for (a, bs) in import_graph() {
        for b in bs {
            if a[0] != b[0] {
                top.entry(vec![a[0].clone()])
                    .or_default()
                    .insert(vec![b[0].clone()]);
            }
        }
    }
    let found = cycles(&top);
    assert!(
        found.is_empty(),
        "top-level modules that import each other:\n{}",
        show(&found)
    );
}

#[test]
fn config_is_a_leaf_but_for_the_address_parser() {
    let graph = import_graph();
    let reaches: BTreeSet<String> = graph
        .iter()
        .filter(|(m, _)| m[0] == "config")
        .flat_map(|(_, deps)| deps.iter())
        .filter(|d| d[0] != "config")
        .map(|d| d.join("::"))
        .collect();
    let allowed: BTreeSet<String> = ["client::cidr".to_string()].into();
    assert!(
        reaches.is_subset(&allowed),
        "config reaches {reaches:?}; it may reach only {allowed:?}"
    );
}

/// The reader itself: a cycle planted in text is found, comments and strings are not read.
#[test]
fn the_reader_finds_a_planted_cycle_and_ignores_comments_and_strings() {
    let code = code_only("// use crate::a;\nlet s = \"crate::b::c\"; let c = '\"'; use crate::d;");
    assert!(!code.contains("crate::a") && !code.contains("crate::b"));
    assert!(code.contains("use crate::d;"));
    let code =
        without_test_modules("fn f() {}\n#[cfg(test)]\nmod tests { use crate::x; }\nfn g() {}");
    assert!(!code.contains("crate::x") && code.contains("fn g"));
    assert_eq!(
        expand_use_tree("crate::{a::B, c::{D, E as F}}"),
        ["crate::a::B", "crate::c::D", "crate::c::E"]
    );
    let mut g: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    let m = |s: &str| vec![s.to_string()];
    g.entry(m("a")).or_default().insert(m("b"));
    g.entry(m("b")).or_default().insert(m("c"));
    g.entry(m("c")).or_default().insert(m("a"));
    g.entry(m("d")).or_default().insert(m("a"));
    assert_eq!(cycles(&g), vec![vec![m("a"), m("b"), m("c")]]);
}

/// `docs/ARCHITECTURE.md` and the documents it sends a newcomer to, in that order.
fn design_docs() -> Vec<String> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    ["ARCHITECTURE.md", "HTTPS.md", "CLIENTS.md", "CACHE.md"]
        .iter()
        .map(|d| {
            std::fs::read_to_string(repo.join("docs").join(d))
                .unwrap_or_else(|e| panic!("docs/{d}: {e}"))
        })
        .collect()
}

/// The walk stays short enough to read in one sitting: its topics have documents of their
/// own (`docs/HTTPS.md`, `docs/CLIENTS.md`, `docs/CACHE.md`).
const MAX_ARCHITECTURE_LINES: usize = 700;

#[test]
fn the_architecture_stays_a_walk_a_newcomer_can_read() {
    let lines = design_docs()[0].lines().count();
    assert!(
        lines <= MAX_ARCHITECTURE_LINES,
        "docs/ARCHITECTURE.md has {lines} lines (at most {MAX_ARCHITECTURE_LINES}): move a \
         topic into a document of its own"
    );
}

/// Names in `docs/*.md` that are not this repository's: the kernel's and nginx's.
const NAMES_FROM_ELSEWHERE: &[&str] = &[
    "IORING_OP_MSG_RING",
    "IORING_OP_URING_CMD",
    "MORE",
    "SOCKET_URING_OP_GETSOCKOPT",
    "SOCKET_URING_OP_SETSOCKOPT",
    "TLS_RX",
    "TLS_TX",
    "proxy_limit_rate",
    "sendmsg",
];

/// Every `.rs` file under the repository's code directories, relative to the repository.
fn repo_rust_files() -> Vec<String> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    let mut stack: Vec<PathBuf> = ["src", "tests", "examples", "perf"]
        .iter()
        .map(|d| repo.join(d))
        .collect();
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                if path
                    .file_name()
                    .is_some_and(|n| n != "target" && n != "out")
                {
                    stack.push(path);
                }
            } else if path.extension().and_then(|e| e.to_str()) == Some("rs") {
                out.push(
                    path.strip_prefix(repo)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
    }
    out
}

/// The walk names only what exists: each `.rs` file it names is a file of the repository
/// (`src/x.rs` exactly, a bare `x.rs` somewhere under the code), and each code name in
/// backticks (`Type::method`, `function()`, `CONSTANT`, `field_name`) is found in the code.
#[test]
fn the_architecture_names_only_files_and_functions_that_exist() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = design_docs().join("\n");
    let files = repo_rust_files();
    let code: String = files
        .iter()
        .map(|f| std::fs::read_to_string(repo.join(f)).expect("read source"))
        .collect::<Vec<_>>()
        .join("\n");
    let words: BTreeSet<&str> = code
        .split(|c: char| !is_ident(c))
        .filter(|w| !w.is_empty())
        .collect();

    let mut missing_files = BTreeSet::new();
    for token in doc.split(|c: char| !(is_ident(c) || c == '/' || c == '.')) {
        let Some(stem) = token.strip_suffix(".rs") else {
            continue;
        };
        if stem.is_empty() {
            continue;
        }
        let found = if token.starts_with("src/") || token.starts_with("tests/") {
            files.iter().any(|f| f == token)
        } else {
            files
                .iter()
                .any(|f| f == token || f.ends_with(&format!("/{token}")))
        };
        if !found {
            missing_files.insert(token.to_string());
        }
    }

    let mut missing_names = BTreeSet::new();
    let mut checked = 0;
    for (k, quoted) in doc.split('`').enumerate() {
        if k % 2 == 0 || quoted.contains('\n') {
            continue;
        }
        let name = quoted.trim().strip_suffix("()").unwrap_or(quoted.trim());
        let is_code_path = !name.is_empty()
            && !name.starts_with("::")
            && !name.ends_with("::")
            && name.split("::").all(|s| {
                !s.is_empty()
                    && s.chars().all(is_ident)
                    && !s.starts_with(|c: char| c.is_ascii_digit())
            });
        if !is_code_path || NAMES_FROM_ELSEWHERE.contains(&name) {
            continue;
        }
        checked += 1;
        if !name.split("::").all(|s| words.contains(s)) {
            missing_names.insert(name.to_string());
        }
    }
    assert!(
        checked > 200,
        "only {checked} names read: are the docs still there?"
    );
    assert!(
        missing_files.is_empty() && missing_names.is_empty(),
        "docs/*.md name files that do not exist: {missing_files:?}\n\
         and names no code has: {missing_names:?}"
    );
}

/// The document keeps no benchmark figure of its own (they drift): a ratio against nginx or
/// lancache, or a measured rate, lives in `perf/*.md`.
#[test]
fn the_architecture_copies_no_benchmark_figure() {
    let doc = design_docs().join("\n");
    let mut found = Vec::new();
    for (n, line) in doc.lines().enumerate() {
        let words: Vec<&str> = line.split_whitespace().collect();
        for (k, w) in words.iter().enumerate() {
            let number = w.trim_start_matches(['(', '~']);
            let is_ratio = number.len() > 1
                && number.ends_with('x')
                && number[..number.len() - 1]
                    .chars()
                    .all(|c| c.is_ascii_digit() || c == '.' || c == '-');
            let is_rate = number.chars().next().is_some_and(|c| c.is_ascii_digit())
                && words
                    .get(k + 1)
                    .is_some_and(|u| ["MB/s", "GB/s", "Gbit/s", "MB/s,", "GB/s,"].contains(u));
            if is_ratio || is_rate {
                found.push(format!("{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "figures copied into docs/*.md (point at perf/*.md instead):\n{}",
        found.join("\n")
    );
}

/// Most lines a source file may have, its unit-test modules aside: past it a file mixes
/// concerns a newcomer should meet one at a time.
const MAX_FILE_LINES: usize = 1500;

#[test]
fn no_source_file_is_longer_than_a_newcomer_can_hold() {
    let mut long = Vec::new();
    for (module, file) in modules() {
        if module.last().map(String::as_str) == Some("tests") {
            continue;
        }
        let src = std::fs::read_to_string(&file).expect("read module");
        let lines = without_test_modules(&src).lines().count();
        if lines > MAX_FILE_LINES {
            long.push(format!("{}: {lines} lines", file.display()));
        }
    }
    assert!(
        long.is_empty(),
        "files over {MAX_FILE_LINES} lines (test modules aside):\n{}",
        long.join("\n")
    );
}

/// The fields of `struct NAME` in `file` (one per `name: Type,` line at the first indent) and
/// whether each is `pub`.
fn struct_fields(file: &str, header: &str) -> Vec<(String, bool)> {
    let src = std::fs::read_to_string(src_dir().join(file)).expect("read source");
    let start = src
        .find(header)
        .unwrap_or_else(|| panic!("{header} not found in {file}"));
    let body = &src[start..];
    let end = body.find("\n}\n").expect("struct end");
    body[..end]
        .lines()
        .skip(1)
        .filter(|l| {
            l.starts_with("    ") && !l.starts_with("     ") && !l.trim_start().starts_with("//")
        })
        .filter_map(|l| {
            let l = l.trim();
            let (is_pub, rest) = match l.strip_prefix("pub ") {
                Some(r) => (true, r),
                None => (l.starts_with("pub("), l),
            };
            let name = rest.split(':').next()?.trim();
            (!name.is_empty() && name.chars().all(is_ident) && rest.contains(':'))
                .then(|| (name.to_string(), is_pub))
        })
        .collect()
}

/// The shard only drives: it holds the ring, the connections and the arena beside one group
/// of state per subsystem (`shard/state.rs`), and the connection machine's state is its own.
#[test]
fn the_shard_holds_few_fields_and_the_machine_shows_none() {
    let shard = struct_fields("shard/mod.rs", "struct Shard<R: RingOps> {");
    assert!(shard.len() >= 10, "Shard's fields not read: {shard:?}");
    assert!(
        shard.len() <= 25,
        "Shard has {} fields (at most 25: group a subsystem's state in shard/state.rs): {:?}",
        shard.len(),
        shard.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    let machine = struct_fields("shard/machine/mod.rs", "pub struct ConnMachine {");
    assert!(
        machine.len() >= 20,
        "ConnMachine's fields not read: {machine:?}"
    );
    let public: Vec<_> = machine.iter().filter(|(_, p)| *p).map(|(n, _)| n).collect();
    assert!(
        public.is_empty(),
        "ConnMachine fields the driver could write around its methods: {public:?}"
    );
}
