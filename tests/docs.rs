//! The documents stay true: the READMEs' in-repository links resolve, and
//! every benchmark result says what both sides ran (or is named as older).

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

/// Every committed benchmark result says what both sides ran (kernels and
/// scale dtype: `provenance`), or bench/README.md names it among the files
/// written before those fields existed. cpu_kernels.json names the kernel
/// and scale dtype of each timing (`mlxrt_f32`, `stock_f16`, ...).
#[test]
fn bench_results_record_what_both_sides_ran() {
    let bench = repo_root().join("bench");
    let readme = std::fs::read_to_string(bench.join("README.md")).expect("bench/README.md");
    let predating = readme
        .split("\n\n")
        .find(|p| p.contains("Files written before these fields existed"))
        .expect("bench/README.md lists the results that predate provenance");
    for entry in std::fs::read_dir(bench.join("results")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        if name == "cpu_kernels.json" {
            let times = &v["results"][0]["times_ms"];
            assert!(times["mlxrt_f32"].is_number() && times["stock_f32"].is_number(), "{name}: {times}");
            continue;
        }
        let ran = |side: &str| ["kernels", "scale_dtype"].iter().all(|k| v["provenance"][side][k].is_string());
        assert!(
            (ran("mlxrt") && ran("reference")) || predating.contains(&format!("`{name}`")),
            "{name} records no provenance for both sides and bench/README.md does not say it predates it"
        );
    }
}
