//! The import rules of the crate (docs/ARCHITECTURE.md), read from the source: the context
//! knows no kernel family and nothing built on it, no kernel imports the CPU references that
//! check it, and the rooms of the crate (each top-level module, each kernel family under
//! `kernels/`) import each other without a circle. Imports are read as `crate::` paths outside
//! comments, including grouped ones (`crate::{a::b, c}`); a room reaches into itself through
//! `super::`, which is not another room.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `src/`, as (path relative to `src/`, text).
fn sources() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut stack: Vec<PathBuf> = vec![root.clone()];
    let mut files = Vec::new();
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("src/ is readable") {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(&root).expect("under src/").to_string_lossy().replace('\\', "/");
                files.push((rel, std::fs::read_to_string(&path).expect("source is readable")));
            }
        }
    }
    assert!(files.len() > 20, "found only {} source files", files.len());
    files
}

/// The room a path under `src/` (`kernels/gemm/coop.rs`) or a module path (`kernels::gemm`)
/// belongs to: its top-level module, or `kernels::family` for a kernel family.
fn room(segments: &[&str]) -> String {
    let name = |s: &str| s.trim_end_matches(".rs").to_string();
    match segments {
        ["kernels", family, ..] if *family != "mod.rs" => format!("kernels::{}", name(family)),
        [top, ..] => name(top),
        [] => String::new(),
    }
}

/// The module paths `text` imports through `crate::`, each as its first two segments
/// (`kernels::gemm`, `error`), comments left out.
fn imports(text: &str) -> BTreeSet<String> {
    let code: Vec<char> = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
        .chars()
        .collect();
    let mut paths = Vec::new();
    let mut at = 0;
    while at + 7 <= code.len() {
        if code[at..at + 7].iter().collect::<String>() == "crate::" && (at == 0 || !is_ident(code[at - 1])) {
            let mut i = at + 7;
            use_tree(&code, &mut i, String::new(), &mut paths);
            at = i.max(at + 1);
        } else {
            at += 1;
        }
    }
    paths
        .iter()
        .filter_map(|p| {
            let mut segs = p.split("::").filter(|s| !s.is_empty());
            let first = segs.next()?;
            Some(match segs.next() {
                Some(second) if first == "kernels" => format!("kernels::{second}"),
                _ => first.to_string(),
            })
        })
        .collect()
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Reads the use tree at `code[*i..]` (`a::b`, `a::{b, c::{d, e}}`, `{a, b}`), pushing every
/// path it names, each after `prefix`.
fn use_tree(code: &[char], i: &mut usize, prefix: String, out: &mut Vec<String>) {
    let skip_space = |i: &mut usize| {
        while code.get(*i).is_some_and(|c| c.is_whitespace()) {
            *i += 1;
        }
    };
    let mut path = prefix;
    loop {
        skip_space(i);
        if code.get(*i) == Some(&'{') {
            *i += 1;
            loop {
                use_tree(code, i, path.clone(), out);
                // Past what the item's path left (`as name`, `*`), to its `,` or the group's end.
                let mut depth = 0;
                while let Some(&c) = code.get(*i) {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => break,
                        _ => {}
                    }
                    *i += 1;
                }
                match code.get(*i) {
                    Some(',') => *i += 1,
                    _ => {
                        *i += 1;
                        return;
                    }
                }
                skip_space(i);
                if code.get(*i) == Some(&'}') {
                    *i += 1;
                    return;
                }
            }
        }
        let start = *i;
        while code.get(*i).is_some_and(|&c| is_ident(c)) {
            *i += 1;
        }
        path.extend(&code[start..*i]);
        if code.get(*i) == Some(&':') && code.get(*i + 1) == Some(&':') {
            *i += 2;
            path.push_str("::");
        } else {
            out.push(path);
            return;
        }
    }
}

/// Which rooms each room imports.
fn room_graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, text) in sources() {
        let from = room(&path.split('/').collect::<Vec<_>>());
        if from == "lib" || from == "house" || from == "contract" {
            continue;
        }
        let to: BTreeSet<String> = imports(&text)
            .iter()
            .map(|m| room(&m.split("::").collect::<Vec<_>>()))
            .filter(|r| *r != from)
            .collect();
        graph.entry(from).or_default().extend(to);
    }
    graph
}

/// The device root imports no kernel family, nor anything built on kernels.
#[test]
fn the_context_knows_no_kernel_family() {
    let graph = room_graph();
    let above = ["kernels", "layer", "dag", "bench", "weights", "reference", "requirements", "synth"];
    let bad: Vec<&String> =
        graph["context"].iter().filter(|r| above.iter().any(|a| r.split("::").next() == Some(a))).collect();
    assert!(bad.is_empty(), "src/context/ imports {bad:?}");
}

/// No kernel imports the CPU references that are meant to check it.
#[test]
fn no_kernel_imports_the_references() {
    let bad: Vec<String> = sources()
        .into_iter()
        .filter(|(path, text)| path.starts_with("kernels/") && imports(text).contains("reference"))
        .map(|(path, _)| path)
        .collect();
    assert!(bad.is_empty(), "kernel files that import crate::reference: {bad:?}");
}

/// The rooms import each other without a circle: every room's imports reach back to it by no
/// path.
#[test]
fn the_rooms_import_each_other_without_a_circle() {
    let graph = room_graph();
    let reaches = |from: &str, to: &str| {
        let (mut seen, mut stack) = (BTreeSet::new(), vec![from.to_string()]);
        while let Some(r) = stack.pop() {
            for next in graph.get(&r).into_iter().flatten() {
                if next == to {
                    return true;
                }
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        false
    };
    let circles: Vec<(String, String)> = graph
        .iter()
        .flat_map(|(from, tos)| tos.iter().map(move |to| (from.clone(), to.clone())))
        .filter(|(from, to)| reaches(to, from))
        .collect();
    assert!(circles.is_empty(), "imports that close a circle (room -> room): {circles:?}");
    assert!(graph.contains_key("context") && graph.contains_key("kernels::gemm"), "rooms: {graph:?}");
}

/// The reader of imports sees grouped and nested paths and skips comments, so the rules above
/// can fail.
#[test]
fn imports_are_read_from_grouped_paths_and_not_from_comments() {
    let text = "use crate::{error::Error, kernels::{gemm::X, dispatch}};\n// crate::dag::x\nuse crate::reference::gemm;";
    let got: Vec<String> = imports(text).into_iter().collect();
    assert_eq!(got, ["error", "kernels::dispatch", "kernels::gemm", "reference"]);
    assert_eq!(room(&["kernels", "gemm", "coop.rs"]), "kernels::gemm");
    assert_eq!(room(&["kernels", "mod.rs"]), "kernels");
    assert_eq!(room(&["context", "mod.rs"]), "context");
}
