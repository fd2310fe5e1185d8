//! The crate's layout, checked: no two of its modules import each other,
//! directly or around a circle (a module is a file of `src/`, or a folder
//! with its files). Doc links count as imports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module → the crate's modules it names (`crate::x`, `use crate::{x, ..}`).
fn imports() -> std::io::Result<BTreeMap<String, BTreeSet<String>>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut files = vec![src.clone()];
    while let Some(dir) = files.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                files.push(path);
                continue;
            }
            let Ok(rel) = path.strip_prefix(&src) else {
                continue;
            };
            let Some(first) = rel.iter().next().and_then(|c| c.to_str()) else {
                continue;
            };
            let module = first.trim_end_matches(".rs").to_owned();
            if module == "lib" || module == "main" || path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path)?;
            let named = graph.entry(module.clone()).or_default();
            for (at, _) in text.match_indices("crate::") {
                let rest = &text[at + "crate::".len()..];
                if let Some(group) = rest.strip_prefix('{') {
                    let group = group.split('}').next().unwrap_or_default();
                    named.extend(group.split(',').filter_map(|p| first_name(p.trim())));
                } else if let Some(name) = first_name(rest) {
                    named.insert(name);
                }
            }
            named.remove(&module);
        }
    }
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for named in graph.values_mut() {
        named.retain(|m| modules.contains(m));
    }
    Ok(graph)
}

/// The module a path starts with (`x` of `x::y`), if it is a name.
fn first_name(path: &str) -> Option<String> {
    let name: String = path
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty() && name.starts_with(|c: char| c.is_ascii_lowercase())).then_some(name)
}

/// A circle of imports in `graph`, if there is one.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    // Depth first; a module met again while still on the path closes a circle.
    fn visit(
        m: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == m) {
            let mut c = path[at..].to_vec();
            c.push(m.to_owned());
            return Some(c);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_owned());
        for next in graph.get(m).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|m| visit(m, graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_module_imports_around_a_circle() -> std::io::Result<()> {
    let graph = imports()?;
    assert!(graph.contains_key("context") && graph.contains_key("shard"));
    assert_eq!(
        circle(&graph),
        None,
        "modules import each other around a circle"
    );
    Ok(())
}

#[test]
fn circles_are_found() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(m, n)| (m.to_owned(), n.into_iter().map(str::to_owned).collect()))
    .collect();
    assert_eq!(
        circle(&graph),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    let mut open = graph.clone();
    open.insert("c".to_owned(), BTreeSet::new());
    assert_eq!(circle(&open), None);
}
