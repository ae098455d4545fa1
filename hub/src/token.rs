//! The access token, found where `huggingface_hub` finds it: `HF_TOKEN` (or its old
//! name `HUGGING_FACE_HUB_TOKEN`), else the file `hf auth login` writes. It is sent as
//! `Authorization: Bearer …` to the endpoint's own origin only, and never logged.

use std::path::Path;

/// The token from `env_token` if set, else from `token_file`; blank values count as none.
pub fn find(env_token: Option<String>, token_file: &Path) -> Option<String> {
    let clean = |t: String| Some(t.trim().to_owned()).filter(|t| !t.is_empty());
    env_token.and_then(clean).or_else(|| std::fs::read_to_string(token_file).ok().and_then(clean))
}

/// `HF_TOKEN`, else `HUGGING_FACE_HUB_TOKEN`.
pub fn from_env() -> Option<String> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    var("HF_TOKEN").or_else(|| var("HUGGING_FACE_HUB_TOKEN"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_wins_over_the_file() {
        let dir = std::env::temp_dir().join(format!("corral-hub-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        assert_eq!(find(None, &file), None);
        std::fs::write(&file, "hf_file\n").unwrap();
        assert_eq!(find(None, &file).as_deref(), Some("hf_file"));
        assert_eq!(find(Some("hf_env".into()), &file).as_deref(), Some("hf_env"));
        assert_eq!(find(Some("  ".into()), &file).as_deref(), Some("hf_file"));
        std::fs::write(&file, "\n").unwrap();
        assert_eq!(find(None, &file), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
