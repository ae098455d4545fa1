//! `corral pull` against a stand-in hub on loopback (`crate::common::fake_hub`): a real model
//! lands in the Hugging Face cache layout and `corral ls` describes it; an interrupted
//! download resumes with `Range`; a checksum mismatch, a refused token and a disk too
//! small each fail clearly and leave nothing under a final name.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use crate::common::fake_hub::*;
use crate::common::*;

const DEADLINE: Duration = Duration::from_secs(120);

/// A private cache, token location and models directory for one test.
struct Env {
    dir: TempDir,
    endpoint: String,
}

impl Env {
    fn new(tag: &str, hub: &FakeHub) -> Self {
        let dir = TempDir::new(tag);
        std::fs::create_dir_all(dir.path().join("models")).unwrap();
        Self { dir, endpoint: hub.endpoint.clone() }
    }

    fn cache(&self) -> PathBuf {
        self.dir.path().join("hub")
    }

    fn repo_dir(&self, repo: &str) -> PathBuf {
        self.cache().join(format!("models--{}", repo.replace('/', "--")))
    }

    fn corral(&self, args: &[&str], extra: &[(&str, &str)]) -> Output {
        let cache = self.cache().display().to_string();
        let home = self.dir.path().join("hf").display().to_string();
        let models = self.dir.path().join("models").display().to_string();
        let mut envs: Vec<(&str, &str)> = vec![
            ("HF_ENDPOINT", &self.endpoint),
            ("HF_HUB_CACHE", &cache),
            ("HF_HOME", &home),
            ("CORRAL_MODELS_DIR", &models),
            ("HF_TOKEN", ""),
            ("HUGGING_FACE_HUB_TOKEN", ""),
            ("HTTP_PROXY", ""),
            ("HTTPS_PROXY", ""),
            ("ALL_PROXY", ""),
            ("http_proxy", ""),
            ("https_proxy", ""),
            ("all_proxy", ""),
        ];
        envs.extend_from_slice(extra);
        run_corral_env(args, &envs, DEADLINE)
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Deterministic bytes that start like a GGUF file.
fn synthetic(n: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut v = b"GGUF".to_vec();
    while v.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push(x as u8);
    }
    v
}

fn files_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

#[test]
fn pulls_a_real_model_into_the_shared_cache_and_lists_it() {
    let repo = "test-org/SmolLM2-135M-Instruct-GGUF";
    let bytes = std::fs::read(model_path(SMOLLM)).unwrap();
    let file = HubFile::new(SMOLLM, bytes);
    let sha = file.sha256.clone();
    let faults = Faults { require_token: Some("hf_test".into()), ..Faults::default() };
    let hub = FakeHub::start(repo, vec![file.clone()], faults);
    let env = Env::new("pull-fresh", &hub);

    let out = env.corral(&["pull", repo], &[("HF_TOKEN", "hf_test")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rd = env.repo_dir(repo);
    let link = rd.join("snapshots").join(COMMIT).join(SMOLLM);
    assert_eq!(stdout(&out).trim(), link.display().to_string());
    assert_eq!(std::fs::read_link(&link).unwrap(), Path::new("../../blobs").join(&sha));
    let blob = std::fs::read(rd.join("blobs").join(&sha)).unwrap();
    assert_eq!((blob.len(), sha256_hex(&blob)), (file.bytes.len(), sha.clone()));
    assert_eq!(std::fs::read_to_string(rd.join("refs/main")).unwrap(), COMMIT);
    assert_eq!(files_in(&rd.join("blobs")), vec![sha.clone()], "nothing but the blob");
    let said = stderr(&out);
    assert!(said.contains("downloaded, sha256 checked"), "{said}");
    assert!(said.contains("serve it with: corral serve SmolLM2-135M-Instruct.Q4_1"), "{said}");

    // The token went to the hub, not to the CDN the bytes came from.
    let seen = hub.seen();
    assert!(
        seen.iter().filter(|s| !s.path.starts_with("/blobs/")).all(|s| s.auth.as_deref() == Some("Bearer hf_test"))
    );
    let gets = hub.blob_gets();
    assert_eq!(gets.len(), 1, "{seen:?}");
    assert!(gets[0].host.starts_with("localhost:") && gets[0].auth.is_none() && gets[0].range.is_none(), "{gets:?}");

    let again = env.corral(&["pull", repo], &[("HF_TOKEN", "hf_test")]);
    let said = stderr(&again);
    assert!(again.status.success() && said.contains("already in the cache") && !said.contains("checked"), "{said}");
    assert_eq!(hub.blob_gets().len(), 1);

    let ls = env.corral(&["ls", "--json"], &[]);
    assert!(ls.status.success(), "{}", stderr(&ls));
    let rows: Vec<serde_json::Value> = stdout(&ls).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 1, "{}", stdout(&ls));
    let r = &rows[0];
    assert_eq!(r["id"], "SmolLM2-135M-Instruct.Q4_1");
    assert_eq!((r["arch"].as_str(), r["quantization"].as_str()), (Some("llama"), Some("Q4_1")));
    assert_eq!((r["context_length"].as_u64(), r["bytes"].as_u64()), (Some(8192), Some(file.bytes.len() as u64)));
    assert_eq!(r["repo"], repo);
    let table = env.corral(&["ls", "smol"], &[]);
    let text = stdout(&table);
    assert!(text.starts_with("ID ") && text.contains("Q4_1") && text.contains(&format!("hf:{repo}")), "{text}");
    let none = env.corral(&["ls", "qwen"], &[]);
    assert!(!none.status.success() && stderr(&none).contains("SmolLM2-135M-Instruct.Q4_1"), "{}", stderr(&none));
}

#[test]
fn an_interrupted_download_resumes_with_range() {
    let repo = "test-org/resume";
    let file = HubFile::new("m-Q4_K_M.gguf", synthetic(3 << 20));
    let hub = FakeHub::start(repo, vec![file.clone()], Faults { cut_first_at: Some(1 << 20), ..Faults::default() });
    let env = Env::new("pull-resume", &hub);

    let first = env.corral(&["pull", repo], &[]);
    assert!(!first.status.success());
    let msg = stderr(&first);
    assert!(msg.contains("download interrupted") && msg.contains("run the same command again to resume"), "{msg}");
    let partial = env.repo_dir(repo).join("blobs").join(format!("{}.incomplete", file.sha256));
    let kept = std::fs::metadata(&partial).unwrap().len();
    assert!(kept > 0 && kept < file.size, "{kept}");
    assert!(!env.repo_dir(repo).join("blobs").join(&file.sha256).exists());

    let second = env.corral(&["pull", repo], &[]);
    assert!(second.status.success(), "{}", stderr(&second));
    let gets = hub.blob_gets();
    assert_eq!(gets.len(), 2);
    assert_eq!(gets[1].range.as_deref(), Some(format!("bytes={kept}-").as_str()));
    let blob = std::fs::read(env.repo_dir(repo).join("blobs").join(&file.sha256)).unwrap();
    assert_eq!(sha256_hex(&blob), file.sha256);
    assert!(!partial.exists());
}

#[test]
fn a_checksum_mismatch_deletes_the_partial_file() {
    let repo = "test-org/corrupt";
    let file = HubFile::new("m.gguf", synthetic(1 << 20));
    let hub = FakeHub::start(repo, vec![file.clone()], Faults { corrupt: true, ..Faults::default() });
    let env = Env::new("pull-corrupt", &hub);

    let out = env.corral(&["pull", repo, "--file", "m.gguf"], &[]);
    assert!(!out.status.success());
    let msg = stderr(&out);
    assert!(msg.contains("checksum mismatch") && msg.contains(&file.sha256) && msg.contains("deleted"), "{msg}");
    assert_eq!(files_in(&env.repo_dir(repo).join("blobs")), Vec::<String>::new());
    assert!(!env.repo_dir(repo).join("snapshots").exists());
}

#[test]
fn a_refusal_names_the_token_and_gated_repos() {
    let repo = "test-org/gated";
    let file = HubFile::new("m.gguf", synthetic(4096));
    let hub = FakeHub::start(repo, vec![file], Faults { require_token: Some("hf_right".into()), ..Faults::default() });
    let env = Env::new("pull-auth", &hub);

    let out = env.corral(&["pull", repo], &[]);
    assert!(!out.status.success());
    let msg = stderr(&out);
    for part in ["401", "HF_TOKEN", "hf auth login", "gated", "no token was sent", "Invalid credentials"] {
        assert!(msg.contains(part), "{part:?} missing: {msg}");
    }
    let wrong = env.corral(&["pull", repo], &[("HF_TOKEN", "hf_wrong")]);
    assert!(!wrong.status.success() && stderr(&wrong).contains("was refused"), "{}", stderr(&wrong));

    // The token file `hf auth login` writes is used when HF_TOKEN is not set.
    std::fs::create_dir_all(env.dir.path().join("hf")).unwrap();
    std::fs::write(env.dir.path().join("hf/token"), "hf_right\n").unwrap();
    let ok = env.corral(&["pull", repo], &[]);
    assert!(ok.status.success(), "{}", stderr(&ok));
}

#[test]
fn a_download_that_does_not_fit_is_refused_before_the_first_byte() {
    let repo = "test-org/huge";
    let mut file = HubFile::new("m.gguf", synthetic(4096));
    file.size = 1 << 50;
    let hub = FakeHub::start(repo, vec![file], Faults::default());
    let env = Env::new("pull-space", &hub);

    let out = env.corral(&["pull", repo], &[]);
    assert!(!out.status.success());
    let msg = stderr(&out);
    let need = ((1u64 << 50) + (1 << 30)).to_string();
    assert!(msg.contains("not enough disk space") && msg.contains(&need) && msg.contains("are free"), "{msg}");
    assert!(hub.blob_gets().is_empty(), "no byte was asked for");
    assert_eq!(files_in(&env.repo_dir(repo).join("blobs")), Vec::<String>::new());
}
