//! Which GGUF file of a repository to download. GGUF repositories usually hold one file
//! per quantization; corral takes:
//!
//! 1. `--file NAME`: the file at that path, else the one whose name is NAME, else the
//!    one whose quantization tag is NAME (`Q8_0`), else the one whose path contains it;
//!    more than one match is an error listing them.
//! 2. No `--file`: the only loadable GGUF, else the one tagged `Q4_K_M` (the default of
//!    llama.cpp's `-hf` and of Ollama: a good quality per byte), else an error listing
//!    the files and asking for `--file`.
//!
//! Split files (`-00001-of-00003.gguf`) and vision projectors (`mmproj-…`) are not
//! candidates: corral's engine loads neither.

use std::fmt::Write;

/// A file of a repository, as the model-info API lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoFile {
    pub path: String,
    pub size: Option<u64>,
    /// The LFS object's SHA-256, when the file is stored in LFS.
    pub sha256: Option<String>,
}

pub const DEFAULT_QUANT: &str = "Q4_K_M";

#[derive(Debug, PartialEq, Eq)]
pub enum Why {
    /// `--file` named it.
    Named,
    /// The repository has no other loadable GGUF.
    Only,
    /// The default quantization, among `others` more.
    Default { others: usize },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ChooseError {
    #[error("no GGUF file in {repo}{}", listing(.files, "files"))]
    NoGguf { repo: String, files: Vec<String> },
    #[error("{path} is one part of a split GGUF; corral loads single-file GGUFs only{}", listing(.others, "single-file GGUFs"))]
    Split { path: String, others: Vec<String> },
    #[error("{wanted:?} is not a GGUF file of {repo}{}", listing(.ggufs, "GGUF files"))]
    NotFound { repo: String, wanted: String, ggufs: Vec<String> },
    #[error("{} GGUF files in {repo}{}; choose one with --file NAME (a path, or a quantization such as {DEFAULT_QUANT}){}",
        .candidates.len(), .wanted.as_ref().map(|w| format!(" match {w:?}")).unwrap_or_default(), listing(.candidates, "files"))]
    Ambiguous { repo: String, wanted: Option<String>, candidates: Vec<String> },
}

fn listing(items: &[String], what: &str) -> String {
    if items.is_empty() {
        return String::new();
    }
    let mut out = format!("; {what}:");
    for i in items {
        let _ = write!(out, "\n  {i}");
    }
    out
}

pub fn is_gguf(path: &str) -> bool {
    path.to_ascii_lowercase().ends_with(".gguf")
}

/// `…-00001-of-00003.gguf`, llama.cpp's `gguf-split` naming.
pub fn is_split(path: &str) -> bool {
    if !is_gguf(path) {
        return false;
    }
    let b = &path.as_bytes()[..path.len() - 5];
    b.len() >= 15
        && b[b.len() - 15] == b'-'
        && &b[b.len() - 9..b.len() - 5] == b"-of-"
        && b[b.len() - 14..b.len() - 9].iter().chain(&b[b.len() - 5..]).all(u8::is_ascii_digit)
}

pub fn is_projector(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.to_ascii_lowercase().starts_with("mmproj")
}

/// Whether `tag` appears in the file name as a whole word (case-insensitive, between
/// non-alphanumeric characters): `Q4_K_M` in `model-Q4_K_M.gguf` or `m.q4_k_m.gguf`,
/// not in `IQ4_K_M`.
pub fn has_tag(path: &str, tag: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path).to_ascii_lowercase();
    let tag = tag.to_ascii_lowercase();
    if tag.is_empty() {
        return false;
    }
    let b = name.as_bytes();
    name.match_indices(&tag).any(|(i, _)| {
        let before = i == 0 || !b[i - 1].is_ascii_alphanumeric();
        let end = i + tag.len();
        let after = end == b.len() || !b[end].is_ascii_alphanumeric();
        before && after
    })
}

fn display(f: &RepoFile) -> String {
    match f.size {
        Some(s) => format!("{}  ({:.2} GB)", f.path, s as f64 / 1e9),
        None => f.path.clone(),
    }
}

pub fn choose<'a>(repo: &str, files: &'a [RepoFile], wanted: Option<&str>) -> Result<(&'a RepoFile, Why), ChooseError> {
    let loadable: Vec<&RepoFile> =
        files.iter().filter(|f| is_gguf(&f.path) && !is_split(&f.path) && !is_projector(&f.path)).collect();
    let names = |v: &[&RepoFile]| v.iter().map(|f| display(f)).collect::<Vec<_>>();
    let Some(wanted) = wanted else {
        return match loadable.as_slice() {
            [] if files.iter().any(|f| is_gguf(&f.path) && is_split(&f.path)) => {
                let first = files.iter().find(|f| is_gguf(&f.path) && is_split(&f.path)).map(|f| f.path.clone());
                Err(ChooseError::Split { path: first.unwrap_or_default(), others: Vec::new() })
            }
            [] => Err(ChooseError::NoGguf {
                repo: repo.to_owned(),
                files: files.iter().map(|f| f.path.clone()).collect(),
            }),
            [only] => Ok((only, Why::Only)),
            many => match many.iter().filter(|f| has_tag(&f.path, DEFAULT_QUANT)).collect::<Vec<_>>().as_slice() {
                [one] => Ok((one, Why::Default { others: many.len() - 1 })),
                _ => Err(ChooseError::Ambiguous { repo: repo.to_owned(), wanted: None, candidates: names(many) }),
            },
        };
    };
    if let Some(f) = files.iter().find(|f| f.path == wanted) {
        if !is_gguf(&f.path) {
            return Err(ChooseError::NotFound {
                repo: repo.to_owned(),
                wanted: wanted.to_owned(),
                ggufs: names(&loadable),
            });
        }
        if is_split(&f.path) {
            return Err(ChooseError::Split { path: f.path.clone(), others: names(&loadable) });
        }
        return Ok((f, Why::Named));
    }
    let lower = wanted.to_ascii_lowercase();
    let by_name: Vec<&RepoFile> =
        loadable.iter().copied().filter(|f| f.path.rsplit('/').next() == Some(wanted)).collect();
    let by_tag: Vec<&RepoFile> = loadable.iter().copied().filter(|f| has_tag(&f.path, wanted)).collect();
    let by_part: Vec<&RepoFile> =
        loadable.iter().copied().filter(|f| f.path.to_ascii_lowercase().contains(&lower)).collect();
    for matches in [by_name, by_tag, by_part] {
        match matches.as_slice() {
            [] => continue,
            [one] => return Ok((one, Why::Named)),
            many => {
                return Err(ChooseError::Ambiguous {
                    repo: repo.to_owned(),
                    wanted: Some(wanted.to_owned()),
                    candidates: names(many),
                });
            }
        }
    }
    Err(ChooseError::NotFound { repo: repo.to_owned(), wanted: wanted.to_owned(), ggufs: names(&loadable) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(paths: &[&str]) -> Vec<RepoFile> {
        paths.iter().map(|p| RepoFile { path: (*p).to_owned(), size: None, sha256: None }).collect()
    }

    fn pick(paths: &[&str], wanted: Option<&str>) -> Result<(String, Why), ChooseError> {
        let fs = files(paths);
        choose("o/r", &fs, wanted).map(|(f, w)| (f.path.clone(), w))
    }

    #[test]
    fn names_and_tags() {
        assert!(is_split("q/m-Q4_K_M-00001-of-00003.gguf"));
        assert!(!is_split("m-Q4_K_M.gguf"));
        assert!(!is_split("x-of-.gguf") && !is_split("m-00001-of-00002.bin") && !is_split("é.gguf"));
        assert!(is_projector("mmproj-model-f16.gguf") && is_projector("sub/MMPROJ.gguf"));
        assert!(has_tag("m-Q4_K_M.gguf", "q4_k_m") && has_tag("gemma-3-270m-q4_k_m.gguf", "Q4_K_M"));
        assert!(has_tag("m-UD-Q4_K_M.gguf", "Q4_K_M"));
        assert!(!has_tag("m-IQ4_K_M.gguf", "Q4_K_M") && !has_tag("m-Q4_K_MX.gguf", "Q4_K_M"));
        assert!(!has_tag("Q4_K_M/m.gguf", "Q4_K_M"), "only the file name counts");
    }

    #[test]
    fn without_file_the_only_gguf_or_q4_k_m() {
        assert_eq!(pick(&["README.md", "m.Q8_0.gguf"], None).unwrap(), ("m.Q8_0.gguf".into(), Why::Only));
        let repo = ["m-Q2_K.gguf", "m-Q4_K_M.gguf", "m-Q8_0.gguf", "mmproj-m-f16.gguf", "README.md"];
        assert_eq!(pick(&repo, None).unwrap(), ("m-Q4_K_M.gguf".into(), Why::Default { others: 2 }));
        assert_eq!(
            pick(&["m-Q4_K_M.gguf", "m-Q4_K_M-00001-of-00002.gguf", "m-Q4_K_M-00002-of-00002.gguf"], None).unwrap().0,
            "m-Q4_K_M.gguf"
        );
        let err = pick(&["m-Q5_K_M.gguf", "m-Q8_0.gguf"], None).unwrap_err();
        assert!(matches!(&err, ChooseError::Ambiguous { candidates, .. } if candidates.len() == 2));
        let msg = err.to_string();
        assert!(msg.contains("--file") && msg.contains("m-Q8_0.gguf"), "{msg}");
        let err = pick(&["README.md", "config.json"], None).unwrap_err();
        assert!(err.to_string().contains("no GGUF file in o/r") && err.to_string().contains("config.json"));
        let err = pick(&["a-00001-of-00002.gguf", "a-00002-of-00002.gguf"], None).unwrap_err();
        assert!(matches!(err, ChooseError::Split { .. }), "{err}");
    }

    #[test]
    fn with_file_a_path_a_name_a_tag_or_a_part() {
        let repo = ["q/m-Q4_K_M.gguf", "m-Q4_K_S.gguf", "m-Q8_0.gguf", "README.md", "x-00001-of-00002.gguf"];
        assert_eq!(pick(&repo, Some("m-Q8_0.gguf")).unwrap(), ("m-Q8_0.gguf".into(), Why::Named));
        assert_eq!(pick(&repo, Some("q/m-Q4_K_M.gguf")).unwrap().0, "q/m-Q4_K_M.gguf");
        assert_eq!(pick(&repo, Some("m-Q4_K_M.gguf")).unwrap().0, "q/m-Q4_K_M.gguf");
        assert_eq!(pick(&repo, Some("q8_0")).unwrap().0, "m-Q8_0.gguf");
        assert_eq!(pick(&repo, Some("Q4_K_S")).unwrap().0, "m-Q4_K_S.gguf");
        assert!(matches!(pick(&repo, Some("Q4_K")), Err(ChooseError::Ambiguous { .. })));
        assert!(matches!(pick(&repo, Some("README.md")), Err(ChooseError::NotFound { .. })));
        assert!(matches!(pick(&repo, Some("x-00001-of-00002.gguf")), Err(ChooseError::Split { .. })));
        let err = pick(&repo, Some("F16")).unwrap_err().to_string();
        assert!(err.contains("\"F16\" is not a GGUF file of o/r") && err.contains("m-Q8_0.gguf"), "{err}");
    }
}
