//! The import rules of the crate (docs/ARCHITECTURE.md), read from the source: the context
//! knows no kernel family and nothing built on it, no kernel imports the CPU references that
//! check it, the rooms of the crate (each top-level module, each kernel family under
//! `kernels/`) import each other without a circle, and so do its files; a room cut by job has
//! a face that only declares its modules and exports; no file is past 900 lines; and the name
//! suffixes `_with` and `_in` mean one thing each.
//!
//! Imports are the paths that start with `crate::`, `super::` or `self::` outside comments, in
//! `use` trees (grouped and nested: `crate::{a::b, c::{d, e}}`) and inline (`crate::a::f()`),
//! and the `use` of a child module by name; each names the deepest file module on its path.
//! A file's inline test module (from `mod tests {` on) is left out: its `super` is the file.

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

/// The module path of a file under `src/`: `kernels/gemm/mod.rs` is `kernels::gemm`,
/// `lib.rs` the crate root (empty).
fn module_of(file: &str) -> Vec<String> {
    let mut segs: Vec<String> = file.trim_end_matches(".rs").split('/').map(str::to_string).collect();
    if segs.last().is_some_and(|s| s == "mod" || s == "lib") {
        segs.pop();
    }
    segs
}

/// The room of a module path: its top-level module, or `kernels::family` for a kernel family.
fn room(module: &[String]) -> String {
    match module {
        [first, second, ..] if first == "kernels" => format!("kernels::{second}"),
        [first, ..] => first.clone(),
        [] => String::new(),
    }
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// `text` without comments, and without its inline test module unless `with_tests`.
fn code_of(text: &str, with_tests: bool) -> Vec<char> {
    let mut lines = Vec::new();
    for line in text.lines() {
        if !with_tests && line.trim_start().starts_with("mod tests {") {
            break;
        }
        lines.push(line.split("//").next().unwrap_or(""));
    }
    lines.join("\n").chars().collect()
}

/// Every path `code` imports (see the module docs), as segments from `crate`, `super` or
/// `self`; `children` are the file's child modules, which a `use` may name directly.
fn paths(code: &[char], children: &[String]) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let starts_at = |at: usize, word: &str| {
        let w: Vec<char> = word.chars().collect();
        code.get(at..at + w.len()) == Some(&w[..])
            && (at == 0 || !(is_ident(code[at - 1]) || code[at - 1] == ':'))
    };
    let mut at = 0;
    while at < code.len() {
        let mut start = None;
        for root in ["crate::", "super::", "self::"] {
            if starts_at(at, root) {
                start = Some(at);
            }
        }
        if start.is_none() && starts_at(at, "use ") {
            let mut i = at + 4;
            while code.get(i).is_some_and(|c| c.is_whitespace()) {
                i += 1;
            }
            let name: String = code[i..].iter().take_while(|&&c| is_ident(c)).collect();
            if children.contains(&name) {
                let mut tree = Vec::new();
                use_tree(code, &mut i, "self::".to_string(), &mut tree);
                found.extend(tree);
                at = i.max(at + 1);
                continue;
            }
        }
        match start {
            Some(s) => {
                let mut i = s;
                use_tree(code, &mut i, String::new(), &mut found);
                at = i.max(at + 1);
            }
            None => at += 1,
        }
    }
    found.into_iter().map(|p| p.split("::").filter(|s| !s.is_empty()).map(str::to_string).collect()).collect()
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

/// The file module a path from module `from` names: the deepest module of `modules` on it.
fn resolve(from: &[String], path: &[String], modules: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    let mut at: Vec<String> = Vec::new();
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => rest = &path[1..],
        Some("super" | "self") => {
            at = from.to_vec();
            while let Some(step) = rest.first().map(String::as_str) {
                match step {
                    "super" => {
                        at.pop();
                    }
                    "self" => {}
                    _ => break,
                }
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    let mut deepest = modules.contains(&at).then(|| at.clone());
    for seg in rest.iter().filter(|s| *s != "self") {
        at.push(seg.clone());
        if modules.contains(&at) {
            deepest = Some(at.clone());
        }
    }
    deepest
}

/// Which file modules each file module imports (itself left out).
fn file_graph() -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let files = sources();
    let modules: BTreeSet<Vec<String>> = files.iter().map(|(f, _)| module_of(f)).collect();
    let mut graph = BTreeMap::new();
    for (file, text) in &files {
        let from = module_of(file);
        let children: Vec<String> = modules
            .iter()
            .filter(|m| m.len() == from.len() + 1 && m.starts_with(&from))
            .map(|m| m[from.len()].clone())
            .collect();
        let to: BTreeSet<Vec<String>> = paths(&code_of(text, false), &children)
            .iter()
            .filter_map(|p| resolve(&from, p, &modules))
            .filter(|m| *m != from)
            .collect();
        graph.insert(from, to);
    }
    graph
}

/// The edges of `graph` that close a circle: `a -> b` where `b` reaches `a`.
fn circles<T: Ord + Clone + std::fmt::Debug>(graph: &BTreeMap<T, BTreeSet<T>>) -> Vec<(T, T)> {
    let reaches = |from: &T, to: &T| {
        let (mut seen, mut stack) = (BTreeSet::new(), vec![from.clone()]);
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
    graph
        .iter()
        .flat_map(|(from, tos)| tos.iter().map(move |to| (from.clone(), to.clone())))
        .filter(|(from, to)| reaches(to, from))
        .collect()
}

/// Which rooms each room imports (the crate root and the test-only modules left out).
fn room_graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, tos) in file_graph() {
        let from_room = room(&from);
        if ["", "house", "contract"].contains(&from_room.as_str()) {
            continue;
        }
        let to: BTreeSet<String> = tos.iter().map(|m| room(m)).filter(|r| *r != from_room).collect();
        graph.entry(from_room).or_default().extend(to);
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

/// No kernel imports the CPU references that are meant to check it (test modules included).
#[test]
fn no_kernel_imports_the_references() {
    let bad: Vec<String> = sources()
        .into_iter()
        .filter(|(path, text)| {
            path.starts_with("kernels/")
                && paths(&code_of(text, true), &[])
                    .iter()
                    .any(|p| p.get(..2) == Some(&["crate".into(), "reference".into()]))
        })
        .map(|(path, _)| path)
        .collect();
    assert!(bad.is_empty(), "kernel files that import crate::reference: {bad:?}");
}

/// The rooms import each other without a circle.
#[test]
fn the_rooms_import_each_other_without_a_circle() {
    let graph = room_graph();
    assert!(graph.contains_key("context") && graph.contains_key("kernels::gemm"), "rooms: {graph:?}");
    let found = circles(&graph);
    assert!(found.is_empty(), "imports that close a circle (room -> room): {found:?}");
}

/// The files import each other without a circle: a face (`mod.rs`) imports its files, which
/// import each other, never the face.
#[test]
fn the_files_import_each_other_without_a_circle() {
    let graph = file_graph();
    assert!(graph[&module_of("kernels/gemm/plan.rs")].contains(&module_of("kernels/gemm/passes.rs")));
    let found: Vec<(String, String)> =
        circles(&graph).into_iter().map(|(a, b)| (a.join("::"), b.join("::"))).collect();
    assert!(found.is_empty(), "imports that close a circle (file -> file): {found:?}");
}

/// The rooms cut by job have a face that holds nothing but its modules and what it exports
/// (after the module docs): every other line is a `mod`, a `use` or a `cfg` attribute, or
/// continues one.
#[test]
fn the_faces_hold_only_modules_and_exports() {
    const FACES: [&str; 15] = [
        "bench/mod.rs",
        "bench/gemm/mod.rs",
        "context/mod.rs",
        "dag/mod.rs",
        "dag/moe/mod.rs",
        "kernels/mod.rs",
        "kernels/combine/mod.rs",
        "kernels/dispatch/mod.rs",
        "kernels/gemm/mod.rs",
        "kernels/routing/mod.rs",
        "kernels/sizing/mod.rs",
        "layer/mod.rs",
        "pipeline/mod.rs",
        "weights/mod.rs",
        "weights/gguf/mod.rs",
    ];
    let faces: Vec<(String, String)> =
        sources().into_iter().filter(|(p, _)| FACES.contains(&p.as_str())).collect();
    assert_eq!(faces.len(), FACES.len(), "faces found: {:?}", faces.iter().map(|f| &f.0).collect::<Vec<_>>());
    for (path, text) in faces {
        let mut open_group = false;
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with("//")) {
            let declaration =
                ["mod ", "pub mod ", "pub(crate) mod ", "use ", "pub use ", "pub(crate) use ", "#[cfg("]
                    .iter()
                    .any(|start| line.starts_with(start));
            assert!(open_group || declaration, "{path}: `{line}` is neither a module nor an export");
            if line.ends_with('{') {
                open_group = true;
            }
            if line.ends_with("};") {
                open_group = false;
            }
        }
    }
}

/// No file of `src/` is past 900 lines: a file that grows past it holds more than one job.
#[test]
fn no_file_is_past_900_lines() {
    let long: Vec<(String, usize)> = sources()
        .into_iter()
        .map(|(path, text)| (path, text.lines().count()))
        .filter(|(_, lines)| *lines > 900)
        .collect();
    assert!(long.is_empty(), "files past 900 lines: {long:?}");
}

/// Every scratch region's name is declared once (`ScratchKey::new` in its family's file), and
/// no two regions share one: a shared name would make one region of two.
#[test]
fn scratch_keys_have_names_of_their_own() {
    let mut names: Vec<String> = Vec::new();
    for (_, text) in sources() {
        for (at, _) in text.match_indices("ScratchKey::new(\"") {
            let rest = &text[at + "ScratchKey::new(\"".len()..];
            names.push(rest.chars().take_while(|&c| c != '"').collect());
        }
    }
    assert!(names.len() >= 20, "found only {names:?}");
    let mut unique = names.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), names.len(), "scratch keys that share a name: {names:?}");
}

/// The reader of imports sees grouped, nested, relative and inline paths and skips comments
/// and test modules, so the rules above can fail.
#[test]
fn imports_are_read_from_every_kind_of_path() {
    let text = "use crate::{error::Error, kernels::{gemm::X, dispatch}};\n// crate::dag::x\n\
                use super::super::pipeline::{self, Binding};\nuse host::layout;\n\
                fn f() { crate::size::product(); }\nmod tests {\n    use crate::bench::x;\n}";
    let modules: BTreeSet<Vec<String>> = [
        "error",
        "kernels",
        "kernels/gemm",
        "kernels/dispatch",
        "kernels/dispatch/host",
        "pipeline",
        "size",
        "bench",
    ]
    .iter()
    .map(|m| m.split('/').map(str::to_string).collect())
    .collect();
    let from = module_of("kernels/dispatch/mod.rs");
    let got: BTreeSet<String> = paths(&code_of(text, false), &["host".to_string()])
        .iter()
        .filter_map(|p| resolve(&from, p, &modules))
        .map(|m| m.join("::"))
        .collect();
    let want = ["error", "kernels::gemm", "kernels::dispatch", "pipeline", "kernels::dispatch::host", "size"];
    assert_eq!(got, want.iter().map(|s| s.to_string()).collect());
    assert_eq!(room(&module_of("kernels/gemm/coop.rs")), "kernels::gemm");
    assert_eq!(room(&module_of("context/mod.rs")), "context");
    let g: BTreeMap<u8, BTreeSet<u8>> = [(1, [2].into()), (2, [1, 3].into()), (3, [].into())].into();
    assert_eq!(circles(&g), [(1, 2), (2, 1)]);
}

/// One meaning per name suffix (docs/ARCHITECTURE.md): a function whose name ends in `_with`
/// takes a `Driver` (how it waits), one ending in `_in` the scratch or workspace it plans in.
#[test]
fn name_suffixes_mean_one_thing() {
    let mut wrong = Vec::new();
    for (path, text) in sources() {
        for (at, _) in text.match_indices("fn ") {
            if text[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let rest = &text[at + 3..];
            let name: String = rest.chars().take_while(|&c| c.is_alphanumeric() || c == '_').collect();
            // To the body, or the `;` that ends a declaration (not an array type's `[u32; 3]`).
            let end = [rest.find('{'), rest.find(";\n")].into_iter().flatten().min();
            let signature = &rest[..end.unwrap_or(rest.len())];
            let takes: &[&str] = if name.ends_with("_with") {
                &["Driver"]
            } else if name.ends_with("_in") {
                &["Scratch", "Workspace"]
            } else {
                continue;
            };
            if !takes.iter().any(|t| signature.contains(t)) {
                wrong.push(format!("{path}: `{name}` takes none of {takes:?}"));
            }
        }
    }
    assert!(wrong.is_empty(), "suffixes used for something else: {wrong:#?}");
}
