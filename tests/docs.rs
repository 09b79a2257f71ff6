//! The README's links within the repository resolve: `(#anchor)` links to
//! one of its headings, relative links to files that exist.

mod common;

use common::repo_root;

/// GitHub's anchor for a heading: lower case, spaces to dashes, other
/// punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The targets of the markdown links `[text](target)` in `text`, outside
/// fenced code blocks.
fn link_targets(text: &str) -> Vec<&str> {
    let mut in_code = false;
    let mut targets = vec![];
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        } else if !in_code {
            targets.extend(line.match_indices("](").filter_map(|(i, _)| line[i + 2..].split(')').next()));
        }
    }
    targets
}

#[test]
fn readme_links_resolve() {
    let root = repo_root();
    for doc in ["README.md", "bench/README.md"] {
        let path = root.join(doc);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let anchors: Vec<String> =
            text.lines().filter(|l| l.starts_with('#')).map(|l| anchor(l.trim_start_matches('#'))).collect();
        for target in link_targets(&text) {
            if let Some(a) = target.strip_prefix('#') {
                assert!(anchors.iter().any(|h| h == a), "{doc}: no heading for the link #{a}");
            } else if !target.contains("://") {
                let file = path.parent().unwrap().join(target.split('#').next().unwrap());
                assert!(file.exists(), "{doc}: link to {target}, which does not exist");
            }
        }
    }
}

#[test]
fn anchors_follow_github() {
    assert_eq!(anchor(" Performance"), "performance");
    assert_eq!(anchor(" Using it from C"), "using-it-from-c");
    assert_eq!(link_targets("see [a](#x) and [b](docs/y.md).\n```cpp\nf([](int a) {});\n```"), ["#x", "docs/y.md"]);
}
