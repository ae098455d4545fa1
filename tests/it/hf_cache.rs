//! Models in a Hugging Face cache laid out as `hf download` leaves it (blobs, snapshot
//! links, refs) are found by `corral ls` and `corral serve` next to the models
//! directory's; clashing file names get repository-qualified ids; `corral serve QUERY`
//! serves the models whose id contains the query, and a query nothing matches is a
//! clear error listing what exists.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::gateway::Gateway;
use crate::common::*;

const COMMIT: &str = "89abcdef0123456789abcdef0123456789abcdef";

/// `<cache>/models--<org>--<name>/{blobs,snapshots,refs}` with `file` linked to a blob
/// that is itself a link to the real model (no copy of its bytes).
fn cache_model(cache: &Path, repo: &str, file: &str, real: &Path, etag: &str) {
    let dir = cache.join(format!("models--{}", repo.replace('/', "--")));
    std::fs::create_dir_all(dir.join("blobs")).unwrap();
    std::fs::create_dir_all(dir.join("snapshots").join(COMMIT)).unwrap();
    std::fs::create_dir_all(dir.join("refs")).unwrap();
    std::os::unix::fs::symlink(real, dir.join("blobs").join(etag)).unwrap();
    std::os::unix::fs::symlink(Path::new("../../blobs").join(etag), dir.join("snapshots").join(COMMIT).join(file))
        .unwrap();
    std::fs::write(dir.join("refs/main"), COMMIT).unwrap();
}

struct Setup {
    dir: TempDir,
}

impl Setup {
    fn new() -> Self {
        let dir = TempDir::new("hf-cache");
        let models = dir.path().join("models");
        std::fs::create_dir_all(&models).unwrap();
        std::os::unix::fs::symlink(model_path(GEMMA), models.join(GEMMA)).unwrap();
        let cache = dir.path().join("hub");
        cache_model(&cache, "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", SMOLLM, &model_path(SMOLLM), &"a".repeat(64));
        cache_model(&cache, "ggml-org/gemma-3-270m-GGUF", GEMMA, &model_path(GEMMA), &"b".repeat(64));
        Self { dir }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn env(&self) -> Vec<(String, String)> {
        vec![
            ("HF_HUB_CACHE".into(), self.path("hub").display().to_string()),
            ("CORRAL_MODELS_DIR".into(), self.path("models").display().to_string()),
        ]
    }
}

fn ids(gw: &Gateway) -> Vec<String> {
    let v = gw.get("/v1/models").json();
    v["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_owned()).collect()
}

#[test]
fn ls_finds_both_places_and_qualifies_clashing_names() {
    let s = Setup::new();
    let env = s.env();
    let envs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let out = run_corral_env(&["ls", "--json"], &envs, Duration::from_secs(60));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<serde_json::Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let got: Vec<String> =
        rows.iter().map(|r| format!("{} {} {} {}", r["id"], r["repo"], r["arch"], r["quantization"])).collect();
    assert_eq!(
        got,
        [
            r#""SmolLM2-135M-Instruct.Q4_1" "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF" "llama" "Q4_1""#,
            r#""gemma-3-270m-q4_k_m" null "gemma3" "Q4_K_M""#,
            r#""ggml-org--gemma-3-270m-q4_k_m" "ggml-org/gemma-3-270m-GGUF" "gemma3" "Q4_K_M""#,
        ]
    );
    assert_eq!(rows[1]["context_length"], 32768);
}

#[test]
fn serve_takes_the_models_whose_id_contains_the_query() {
    let s = Setup::new();
    let env = s.env();
    let envs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();

    let gw = Gateway::start_in_env(TempDir::new("hf-serve-smol"), &["smollm"], &envs);
    assert_eq!(ids(&gw), ["SmolLM2-135M-Instruct.Q4_1"]);
    drop(gw);
    let gw = Gateway::start_in_env(TempDir::new("hf-serve-gemma"), &["GEMMA"], &envs);
    assert_eq!(ids(&gw), ["gemma-3-270m-q4_k_m", "ggml-org--gemma-3-270m-q4_k_m"]);
    drop(gw);
    let gw = Gateway::start_in_env(TempDir::new("hf-serve-all"), &[], &envs);
    assert_eq!(ids(&gw).len(), 3);
    drop(gw);

    let run = s.path("run");
    let out = run_corral_env(
        &["serve", "--port", "0", "--no-open", "--runtime-dir", run.to_str().unwrap(), "qwen"],
        &envs,
        Duration::from_secs(30),
    );
    assert!(!out.status.success());
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(msg.contains("no model id contains \"qwen\""), "{msg}");
    for id in ["SmolLM2-135M-Instruct.Q4_1", "gemma-3-270m-q4_k_m", "ggml-org--gemma-3-270m-q4_k_m"] {
        assert!(msg.contains(id), "{id} missing: {msg}");
    }
}
